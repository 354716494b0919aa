package policy

import (
	"slices"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// l7Of returns the HTTP rules of m's L7 entry for k, and whether k is
// redirected at all.
func l7Of(m *MapState, k Key) ([]HTTPRule, bool) {
	i, ok := slices.BinarySearchFunc(m.L7, k, func(e L7Entry, k Key) int { return Compare(e.Key, k) })
	if !ok {
		return nil, false
	}
	return m.L7[i].HTTP, true
}

func checkL7(t *testing.T, m *MapState, k Key, want []HTTPRule) {
	t.Helper()
	got, ok := l7Of(m, k)
	switch {
	case want == nil && ok:
		t.Errorf("%+v redirected with %+v, want not redirected", k, got)
	case want != nil && !ok:
		t.Errorf("%+v not redirected, want %+v (L7 = %+v)", k, want, m.L7)
	case want != nil && !slices.EqualFunc(got, want, func(a, b HTTPRule) bool { return compareHTTPRule(a, b) == 0 }):
		t.Errorf("%+v: rules %+v, want %+v", k, got, want)
	}
	if want != nil && !m.Has(k) {
		t.Errorf("%+v redirected but not an entry", k)
	}
	if !slices.IsSortedFunc(m.L7, func(a, b L7Entry) int { return Compare(a.Key, b.Key) }) {
		t.Errorf("L7 not sorted: %+v", m.L7)
	}
}

const cnpEgressNamedL7 = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: named-l7-out, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: client}}
  egress:
  - toEndpoints: [{matchLabels: {app: server}}]
    toPorts: [{ports: [{port: http, protocol: TCP}], rules: {http: [{method: GET, path: /allowed}]}}]
  - toEndpoints: [{matchLabels: {app: dns}}]
    toPorts: [{ports: [{port: dns, protocol: UDP}], rules: {dns: [{matchPattern: "*.example.com"}]}}]
`

// Egress: a named port with HTTP (or DNS) rules resolves, per peer
// identity, to that identity's number, redirected with the rules; a
// peer renumbering the port moves the redirect.
func TestNamedPortL7Egress(t *testing.T) {
	const client, server, dnsSrv identity.NumericIdentity = 900, 901, 902
	r := NewRepository()
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.UpsertIdentity(server, podLabels(t, "x", "app=server"))
	r.UpsertIdentity(dnsSrv, podLabels(t, "x", "app=dns"))
	r.SetEndpointPorts("s", server, mustPorts(t, "http=8080"))
	r.SetEndpointPorts("d", dnsSrv, mustPorts(t, "dns/UDP=5353"))
	r.Import(mustParse(t, cnpEgressNamedL7))

	get := []HTTPRule{{Method: "GET", Path: "/allowed"}}
	k8080 := Key{Identity: server, Port: 8080, Proto: ProtoTCP, Dir: Egress}
	m := r.MapState(client)
	checkL7(t, m, k8080, get)
	if !m.Allows(server, 8080, ProtoTCP, Egress) || m.Allows(server, 80, ProtoTCP, Egress) {
		t.Errorf("L4: want TCP 8080 only to the server: %+v", m.Allow)
	}
	kDNS := Key{Identity: dnsSrv, Port: 5353, Proto: ProtoUDP, Dir: Egress}
	if e, ok := m.DNSRedirected(kDNS); !ok || !slices.Equal(e.Names, []fqdn.Selector{{MatchPattern: "*.example.com"}}) {
		t.Errorf("DNS entry of %+v = %+v, %v; want *.example.com (DNS = %+v)", kDNS, e, ok, m.DNS)
	}

	// The server renumbers http: the redirect moves.
	res := r.SetEndpointPorts("s", server, mustPorts(t, "http=9090"))
	if !slices.Contains(changedIDs(res), client) {
		t.Fatalf("changed = %v, want the client", changedIDs(res))
	}
	m = r.MapState(client)
	checkL7(t, m, k8080, nil)
	checkL7(t, m, Key{Identity: server, Port: 9090, Proto: ProtoTCP, Dir: Egress}, get)
}

// Egress: a numbered HTTP rule on the number a named one resolves to
// adds up (the union); an L4-only allow on that key and peer lets every
// request through, as for two numbered rules on one key.
func TestNamedPortL7EgressCombines(t *testing.T) {
	const client, server identity.NumericIdentity = 910, 911
	k := Key{Identity: server, Port: 8080, Proto: ProtoTCP, Dir: Egress}
	for _, tc := range []struct {
		name, extra string
		want        []HTTPRule
	}{
		{"numbered HTTP rule", `    toPorts: [{ports: [{port: "8080", protocol: TCP}], rules: {http: [{path: /other}]}}]`,
			[]HTTPRule{{Path: "/other"}, {Method: "GET", Path: "/allowed"}}},
		{"numbered L4 rule", `    toPorts: [{ports: [{port: "8080", protocol: TCP}]}]`, []HTTPRule{{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRepository()
			r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
			r.UpsertIdentity(server, podLabels(t, "x", "app=server"))
			r.SetEndpointPorts("s", server, mustPorts(t, "http=8080"))
			r.Import(mustParse(t, cnpEgressNamedL7+"  - toEndpoints: [{matchLabels: {app: server}}]\n"+tc.extra+"\n"))
			checkL7(t, r.MapState(client), k, tc.want)
		})
	}
}

const cnpIngressNamedL7 = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: named-l7-in, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: server}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: client}}]
    toPorts: [{ports: [{port: http, protocol: TCP}], rules: {http: [{method: GET, path: /allowed}]}}]
`

// Ingress: the named port with HTTP rules is left to each endpoint,
// which redirects its own number with the rules; an endpoint numbering
// it differently redirects that number; one not declaring it allows
// nothing.
func TestNamedPortL7Ingress(t *testing.T) {
	const server, client identity.NumericIdentity = 920, 921
	r := NewRepository()
	r.UpsertIdentity(server, podLabels(t, "x", "app=server"))
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	// A numbered L7 rule too: the resolutions for different ports share
	// its builder and must not see each other's keys.
	r.Import(mustParse(t, cnpIngressNamedL7+`  - fromEndpoints: [{matchLabels: {app: client}}]
    toPorts: [{ports: [{port: "9000", protocol: TCP}], rules: {http: [{path: /n}]}}]
`))

	get := []HTTPRule{{Method: "GET", Path: "/allowed"}}
	k9000 := Key{Identity: client, Port: 9000, Proto: ProtoTCP, Dir: Ingress}
	m := r.MapState(server)
	if len(m.L7) != 1 || len(m.Named) != 1 {
		t.Fatalf("unresolved MapState: L7 %+v, Named %+v", m.L7, m.Named)
	}
	k80 := Key{Identity: client, Port: 80, Proto: ProtoTCP, Dir: Ingress}
	k8080 := Key{Identity: client, Port: 8080, Proto: ProtoTCP, Dir: Ingress}
	m80 := r.MapStateFor(server, mustPorts(t, "http=80"))
	checkL7(t, m80, k80, get)
	checkL7(t, m80, k8080, nil)
	m8080 := r.MapStateFor(server, mustPorts(t, "http=8080"))
	checkL7(t, m8080, k8080, get)
	checkL7(t, m8080, k80, nil)
	checkL7(t, m8080, k9000, []HTTPRule{{Path: "/n"}})
	if m80.Equal(m8080) {
		t.Error("policies for http=80 and http=8080 compare equal")
	}
	if none := r.MapStateFor(server, mustPorts(t, "web=80")); len(none.L7) != 1 || none.Allows(client, 80, ProtoTCP, Ingress) {
		t.Errorf("endpoint without the name: L7 %+v, allows TCP 80", none.L7)
	}
	if len(m.L7) != 1 {
		t.Errorf("ForPorts changed the shared policy's L7: %+v", m.L7)
	}
}

// Ingress: the resolved key combines with rules on the same number as
// compute combines them on one key: HTTP rules add up, an L4-only allow
// (numbered or named) on the key and peer lets every request through,
// a deny wins.
func TestNamedPortL7IngressCombines(t *testing.T) {
	const server, client identity.NumericIdentity = 930, 931
	k := Key{Identity: client, Port: 80, Proto: ProtoTCP, Dir: Ingress}
	for _, tc := range []struct {
		name, extra string
		want        []HTTPRule // nil: not redirected
		allowed     bool
	}{
		{"alone", "", []HTTPRule{{Method: "GET", Path: "/allowed"}}, true},
		{"numbered HTTP rule", `    toPorts: [{ports: [{port: "80", protocol: TCP}], rules: {http: [{path: /other}]}}]`,
			[]HTTPRule{{Path: "/other"}, {Method: "GET", Path: "/allowed"}}, true},
		{"named HTTP rule", `    toPorts: [{ports: [{port: http, protocol: TCP}], rules: {http: [{path: /other}]}}]`,
			[]HTTPRule{{Path: "/other"}, {Method: "GET", Path: "/allowed"}}, true},
		{"numbered L4 rule", `    toPorts: [{ports: [{port: "80", protocol: TCP}]}]`, []HTTPRule{{}}, true},
		{"named L4 rule", `    toPorts: [{ports: [{port: http, protocol: TCP}]}]`, []HTTPRule{{}}, true},
		{"L4 rule of another peer", "", []HTTPRule{{Method: "GET", Path: "/allowed"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := cnpIngressNamedL7
			if tc.extra != "" {
				doc += "  - fromEndpoints: [{matchLabels: {app: client}}]\n" + tc.extra + "\n"
			}
			if tc.name == "L4 rule of another peer" {
				doc += "  - toPorts: [{ports: [{port: \"80\", protocol: TCP}]}]\n"
			}
			r := NewRepository()
			r.UpsertIdentity(server, podLabels(t, "x", "app=server"))
			r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
			r.Import(mustParse(t, doc))
			m := r.MapStateFor(server, mustPorts(t, "http=80"))
			checkL7(t, m, k, tc.want)
			if m.Allows(client, 80, ProtoTCP, Ingress) != tc.allowed {
				t.Errorf("TCP 80 from client: allowed=%v, want %v", !tc.allowed, tc.allowed)
			}
			// The same rules on the number give the same policy.
			num := strings.ReplaceAll(doc, "port: http,", `port: "80",`)
			rn := NewRepository()
			rn.UpsertIdentity(server, podLabels(t, "x", "app=server"))
			rn.UpsertIdentity(client, podLabels(t, "x", "app=client"))
			rn.Import(mustParse(t, num))
			if n := rn.MapState(server); !slices.EqualFunc(n.L7, m.L7, func(a, b L7Entry) bool { return l7Equal([]L7Entry{a}, []L7Entry{b}) }) {
				t.Errorf("L7 = %+v, numbered policy's %+v", m.L7, n.L7)
			}
		})
	}

	t.Run("deny on the port", func(t *testing.T) {
		r := NewRepository()
		r.UpsertIdentity(server, podLabels(t, "x", "app=server"))
		r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
		r.Import(mustParse(t, cnpIngressNamedL7+`  ingressDeny:
  - fromEndpoints: [{matchLabels: {app: client}}]
    toPorts: [{ports: [{port: "80", protocol: TCP}]}]
`))
		m := r.MapStateFor(server, mustPorts(t, "http=80"))
		checkL7(t, m, k, nil)
		if m.Allows(client, 80, ProtoTCP, Ingress) || !m.Denies(k) {
			t.Errorf("TCP 80 from client not denied: Allow %+v Deny %+v", m.Allow, m.Deny)
		}
	})
}

// Ingress: equality sees the named entries' L7 rules.
func TestNamedPortL7Equal(t *testing.T) {
	const server, client identity.NumericIdentity = 940, 941
	mk := func(path string) *MapState {
		r := NewRepository()
		r.UpsertIdentity(server, podLabels(t, "x", "app=server"))
		r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
		r.Import(mustParse(t, strings.Replace(cnpIngressNamedL7, "/allowed", path, 1)))
		return r.MapState(server)
	}
	a, b := mk("/allowed"), mk("/other")
	if a.Equal(b) {
		t.Error("policies with different named L7 rules compare equal")
	}
	if !a.Equal(mk("/allowed")) {
		t.Error("equal policies compare unequal")
	}
}

// Egress: a CIDR peer on a named port with HTTP rules allows (and
// redirects) nothing: an address outside the cluster declares no ports.
func TestNamedPortL7EgressCIDR(t *testing.T) {
	const client identity.NumericIdentity = 950
	r := NewRepository()
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: named-l7-cidr, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: client}}
  egress:
  - toCIDR: [10.0.0.0/8]
    toPorts: [{ports: [{port: http, protocol: TCP}], rules: {http: [{method: GET}]}}]
`))
	m := r.MapState(client)
	if !m.EgressEnforced || len(m.L7) != 0 || len(m.CIDR) != 0 || m.Allows(identity.ReservedWorld, 80, ProtoTCP, Egress) {
		t.Fatalf("MapState = %+v, want egress enforced allowing nothing", m)
	}
}

// Egress named ports in a rule without default deny (enableDefaultDeny
// egress false, whose L7 rules still redirect) are recomputed when a
// peer renumbers the port, as in a default-deny rule.
func TestNamedPortL7EgressOpen(t *testing.T) {
	const client, server identity.NumericIdentity = 960, 961
	r := NewRepository()
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.UpsertIdentity(server, podLabels(t, "x", "app=server"))
	r.SetEndpointPorts("s", server, mustPorts(t, "http=8080"))
	r.Import(mustParse(t, strings.Replace(cnpEgressNamedL7, "  egress:\n", "  enableDefaultDeny: {egress: false}\n  egress:\n", 1)))
	get := []HTTPRule{{Method: "GET", Path: "/allowed"}}
	m := r.MapState(client)
	if !m.EgressEnforced || !m.Allows(server, 1, ProtoTCP, Egress) {
		t.Fatalf("MapState = %+v, want egress enforced with an allow-all entry", m)
	}
	checkL7(t, m, Key{Identity: server, Port: 8080, Proto: ProtoTCP, Dir: Egress}, get)
	res := r.SetEndpointPorts("s", server, mustPorts(t, "http=9090"))
	if !slices.Contains(changedIDs(res), client) {
		t.Errorf("changed = %v, want the client", changedIDs(res))
	}
	m = r.MapState(client)
	checkL7(t, m, Key{Identity: server, Port: 8080, Proto: ProtoTCP, Dir: Egress}, nil)
	checkL7(t, m, Key{Identity: server, Port: 9090, Proto: ProtoTCP, Dir: Egress}, get)
}

// Ingress: Kafka rules on a named port resolve as HTTP ones do.
func TestNamedPortKafkaIngress(t *testing.T) {
	const server, client identity.NumericIdentity = 970, 971
	r := NewRepository()
	r.UpsertIdentity(server, podLabels(t, "x", "app=server"))
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.Import(mustParse(t, strings.Replace(cnpIngressNamedL7, "port: http, protocol: TCP}], rules: {http: [{method: GET, path: /allowed}]}",
		"port: kafka, protocol: TCP}], rules: {kafka: [{role: produce, topic: t1}]}", 1)))
	m := r.MapStateFor(server, mustPorts(t, "kafka=9092"))
	k := Key{Identity: client, Port: 9092, Proto: ProtoTCP, Dir: Ingress}
	if len(m.L7) != 1 || m.L7[0].Key != k || m.L7[0].Parser() != ParserKafka || len(m.L7[0].Kafka) != 1 || m.L7[0].Kafka[0].Topic != "t1" {
		t.Fatalf("L7 = %+v, want %+v redirected to Kafka with topic t1", m.L7, k)
	}
}
