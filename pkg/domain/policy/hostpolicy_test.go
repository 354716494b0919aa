package policy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

const hostPolicy = `apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: edge-ssh}
spec:
  nodeSelector: {matchLabels: {role: edge}}
  ingress:
  - fromCIDR: [10.0.0.0/8]
    toPorts: [{ports: [{port: "22", protocol: TCP}]}]
  - fromEntities: [remote-node]
  ingressDeny:
  - fromCIDR: [10.9.0.0/16]
`

func hostLabelsOf(t testing.TB, kv map[string]string) []string {
	t.Helper()
	ls, err := HostLabels(kv)
	if err != nil {
		t.Fatal(err)
	}
	return ls.Strings()
}

// TestHostPolicy: a nodeSelector rule selects the host identity by the
// node's labels and only it; endpoint rules never select the host.
func TestHostPolicy(t *testing.T) {
	const pod identity.NumericIdentity = 300
	r := NewRepository()
	r.UpsertIdentity(pod, podLabels(t, "default", "role=edge"))
	r.UpsertIdentity(identity.ReservedHost, mustLabels(t, hostLabelsOf(t, map[string]string{"role": "edge", "kubernetes.io/hostname": "n1"})...))
	if m := r.MapState(identity.ReservedHost); m != nil {
		t.Fatalf("host policy %+v without rules", m)
	}
	// A cluster-wide endpoint rule selecting everything leaves the host
	// alone.
	r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: all-pods}
spec:
  endpointSelector: {}
  ingress: []
`))
	if m := r.MapState(identity.ReservedHost); m != nil {
		t.Fatalf("endpointSelector {} selects the host: %+v", m)
	}
	if m := r.MapState(pod); m == nil || !m.Enforced(Ingress) {
		t.Fatalf("pod policy %+v, want ingress enforced", m)
	}
	res := r.Import(mustParse(t, hostPolicy))
	if got := changedIDs(res); len(got) != 1 || got[0] != identity.ReservedHost {
		t.Fatalf("changed %v, want the host only", got)
	}
	m := r.MapState(identity.ReservedHost)
	if m == nil || !m.Enforced(Ingress) || m.Enforced(Egress) {
		t.Fatalf("host policy %+v, want ingress enforced only", m)
	}
	world := identity.ReservedWorld
	for _, c := range []struct {
		peer identity.NumericIdentity
		addr string
		port uint16
		want bool
	}{
		{world, "10.1.2.3", 22, true},
		{world, "10.1.2.3", 23, false},
		{world, "192.168.1.1", 22, false},
		{world, "10.9.1.1", 22, false}, // denied
		{identity.ReservedRemoteNode, "172.16.0.2", 8080, true},
	} {
		if got := m.AllowsAddr(c.peer, netip.MustParseAddr(c.addr), c.port, ProtoTCP, Ingress); got != c.want {
			t.Errorf("host ingress from %d %s port %d: %v, want %v", c.peer, c.addr, c.port, got, c.want)
		}
	}
	// The pod (labels role=edge too) keeps its own policy only.
	if pm := r.MapState(pod); pm.AllowsAddr(world, netip.MustParseAddr("10.1.2.3"), 22, ProtoTCP, Ingress) {
		t.Errorf("a host rule applies to a pod")
	}
	// A node without the label is not selected.
	res = r.UpsertIdentity(identity.ReservedHost, mustLabels(t, hostLabelsOf(t, map[string]string{"role": "core"})...))
	if got := changedIDs(res); len(got) != 1 || got[0] != identity.ReservedHost {
		t.Fatalf("relabel changed %v, want the host", got)
	}
	if m := r.MapState(identity.ReservedHost); m != nil {
		t.Fatalf("node role=core: host policy %+v", m)
	}
}

func TestHostPolicyRefused(t *testing.T) {
	for _, c := range []struct{ name, doc, want string }{
		{"namespaced", `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  nodeSelector: {}
  ingress: []
`, "only cluster-wide policies"},
		{"both selectors", `apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: p}
spec:
  nodeSelector: {}
  endpointSelector: {}
  ingress: []
`, "give one, not both"},
		{"L7", `apiVersion: membrane.io/v2
kind: MembraneClusterwideNetworkPolicy
metadata: {name: p}
spec:
  nodeSelector: {}
  ingress:
  - toPorts: [{ports: [{port: "80", protocol: TCP}], rules: {http: [{method: GET}]}}]
`, "L7 rules are not supported in host policies"},
		{"named port", `apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: p}
spec:
  nodeSelector: {}
  ingress:
  - toPorts: [{ports: [{port: http, protocol: TCP}]}]
`, "named ports are not supported in host policies"},
		{"named port with L7", `apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: p}
spec:
  nodeSelector: {}
  ingress:
  - toPorts: [{ports: [{port: http, protocol: TCP}], rules: {http: [{method: GET}]}}]
`, "not supported in host policies"},
		{"toFQDNs", `apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: p}
spec:
  nodeSelector: {}
  egress:
  - toFQDNs: [{matchName: example.com}]
`, "toFQDNs: not supported in host policies"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.doc))
			if !errors.Is(err, ErrInvalidPolicy) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
	// From the API server (partial refusal) an L7 entry of a host rule
	// allows nothing; the host stays isolated.
	pols, err := ParseWith([]byte(`apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: p}
spec:
  nodeSelector: {}
  ingress:
  - toPorts: [{ports: [{port: "80", protocol: TCP}], rules: {http: [{method: GET}]}}]
`), ParseOptions{PartialRefusal: true})
	if err != nil {
		t.Fatal(err)
	}
	if r := pols[0].Rules[0]; !r.Host || !r.IngressEnforced || len(r.Ingress) != 0 || len(pols[0].Refused) != 1 {
		t.Fatalf("rule %+v refused %v", r, pols[0].Refused)
	}
}
