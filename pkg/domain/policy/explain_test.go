package policy

import (
	"slices"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

const explainDocs = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: b-from-a, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: b}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: a}}]
    toPorts: [{ports: [{port: "80", protocol: TCP}]}]
  ingressDeny:
  - fromEndpoints: [{matchLabels: {app: c}}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-isolated, namespace: default}
spec:
  podSelector: {matchLabels: {app: b}}
  policyTypes: [Ingress]
`

func explainLabels(t *testing.T, app string) labels.Labels {
	t.Helper()
	var ls labels.Labels
	for _, s := range []string{"k8s:app=" + app, "k8s:io.kubernetes.pod.namespace=default"} {
		l, err := labels.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	return ls
}

// TestExplain: the policies behind an allow, a deny rule and a default
// deny, re-evaluated from the rules.
func TestExplain(t *testing.T) {
	pols, err := Parse([]byte(explainDocs))
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := explainLabels(t, "a"), explainLabels(t, "b"), explainLabels(t, "c")
	for _, tc := range []struct {
		name          string
		subject, peer labels.Labels
		port          uint16
		dir           Direction
		want          int
		names         []string
	}{
		{"allow", b, a, 80, Ingress, ExplainAllow, []string{"default/b-from-a"}},
		{"allow other port", b, a, 81, Ingress, ExplainAllow, nil},
		{"deny rule", b, c, 80, Ingress, ExplainDeny, []string{"default/b-from-a"}},
		{"no deny for a", b, a, 80, Ingress, ExplainDeny, nil},
		{"default deny", b, a, 81, Ingress, ExplainDefaultDeny, []string{"default/b-from-a", "default/b-isolated"}},
		{"egress not enforced", b, a, 81, Egress, ExplainDefaultDeny, nil},
		{"other subject", a, b, 80, Ingress, ExplainAllow, nil},
	} {
		got := Explain(pols, tc.subject, tc.peer, nil, nil, tc.port, ProtoTCP, tc.dir, tc.want)
		if !slices.Equal(got, tc.names) {
			t.Errorf("%s: Explain = %v, want %v", tc.name, got, tc.names)
		}
	}
}

// TestExplainFQDN: a toFQDNs rule explains a connection to an address
// learned for a name it selects, and only that.
func TestExplainFQDN(t *testing.T) {
	pols, err := Parse([]byte(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: to-api, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: a}}
  egress:
  - toFQDNs: [{matchPattern: "*.example.com"}]
    toPorts: [{ports: [{port: "443", protocol: TCP}]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	a := explainLabels(t, "a")
	world, err := labels.Parse("reserved:world")
	if err != nil {
		t.Fatal(err)
	}
	peer := labels.Labels{world}
	for _, tc := range []struct {
		name  string
		names []string
		port  uint16
		want  []string
	}{
		{"learned name", []string{"api.example.com."}, 443, []string{"default/to-api"}},
		{"one of several names", []string{"other.test.", "api.example.com."}, 443, []string{"default/to-api"}},
		{"other port", []string{"api.example.com."}, 80, nil},
		{"other name", []string{"example.org."}, 443, nil},
		{"no name known", nil, 443, nil},
	} {
		if got := Explain(pols, a, peer, tc.names, nil, tc.port, ProtoTCP, Egress, ExplainAllow); !slices.Equal(got, tc.want) {
			t.Errorf("%s: Explain = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestExplainNamedPorts: a rule on a named port names its policy for the
// numbers the resolver gives the name (the subject's on ingress, the
// peer's on egress), for that protocol only; without a resolver it names
// none.
func TestExplainNamedPorts(t *testing.T) {
	pols, err := Parse([]byte(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-http, namespace: default}
spec:
  podSelector: {matchLabels: {app: b}}
  policyTypes: [Ingress, Egress]
  ingress:
  - from: [{podSelector: {matchLabels: {app: a}}}]
    ports: [{port: http}]
  egress:
  - to: [{podSelector: {matchLabels: {app: c}}}]
    ports: [{port: dns, protocol: UDP}]
`))
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := explainLabels(t, "a"), explainLabels(t, "b"), explainLabels(t, "c")
	ports := func(np NamedPorts) PortResolver {
		return func(name string, proto uint8) []uint16 {
			if n, ok := np.Lookup(name, proto); ok {
				return []uint16{n}
			}
			return nil
		}
	}
	bPorts, err := NewNamedPorts([]NamedPort{{Name: "http", Proto: ProtoTCP, Port: 8080}})
	if err != nil {
		t.Fatal(err)
	}
	cPorts, err := NewNamedPorts([]NamedPort{{Name: "dns", Proto: ProtoUDP, Port: 5353}, {Name: "dns", Proto: ProtoTCP, Port: 5354}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"default/b-http"}
	for _, tc := range []struct {
		name          string
		subject, peer labels.Labels
		named         PortResolver
		port          uint16
		proto         uint8
		dir           Direction
		want          []string
	}{
		{"ingress on the subject's number", b, a, ports(bPorts), 8080, ProtoTCP, Ingress, want},
		{"ingress on another number", b, a, ports(bPorts), 80, ProtoTCP, Ingress, nil},
		{"ingress, the name on UDP", b, a, ports(bPorts), 8080, ProtoUDP, Ingress, nil},
		{"ingress without a resolver", b, a, nil, 8080, ProtoTCP, Ingress, nil},
		{"egress on the peer's number", b, c, ports(cPorts), 5353, ProtoUDP, Egress, want},
		{"egress, the rule's protocol only", b, c, ports(cPorts), 5354, ProtoTCP, Egress, nil},
		{"egress, several numbers (a peer that is no pod)", b, c, func(string, uint8) []uint16 { return []uint16{53, 5353} }, 53, ProtoUDP, Egress, want},
	} {
		if got := Explain(pols, tc.subject, tc.peer, nil, tc.named, tc.port, tc.proto, tc.dir, ExplainAllow); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
