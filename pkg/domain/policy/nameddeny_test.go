package policy

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// The allows of TestNamedDenyIngress: a NetworkPolicy allowing the client
// on numbered ports, a CNP allowing the other peer on any port, and one
// allowing the client on the named port web.
const namedDenyAllows = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: numbered, namespace: x}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: 8080, protocol: TCP}, {port: 9090, protocol: TCP}]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: any-port, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: server}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: other}}]
  - fromEndpoints: [{matchLabels: {app: client}}]
    toPorts: [{ports: [{port: web, protocol: TCP}]}]
`

const namedDenyIngress = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: deny-http, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: server}}
  ingressDeny:
  - toPorts: [{ports: [{port: http, protocol: TCP}]}]
`

// An ingressDeny on a named port denies, on each selected endpoint, the
// number that endpoint gives the name, over every allow it intersects:
// a numbered allow of the same number, an any-port allow of another peer,
// an allow on another named port the endpoint numbers the same; an
// endpoint renumbering the name moves the deny, one without it denies
// nothing (Cilium resolves a deny's named port as an allow's).
func TestNamedDenyIngress(t *testing.T) {
	const server, client, other identity.NumericIdentity = 900, 901, 902
	r := NewRepository()
	r.UpsertIdentity(server, podLabels(t, "x", "app=server"))
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.UpsertIdentity(other, podLabels(t, "x", "app=other"))
	r.Import(mustParse(t, namedDenyAllows+"---\n"+namedDenyIngress))
	m := r.MapState(server)
	if want := []NamedKey{{Name: "http", Proto: ProtoTCP}}; !slices.Equal(m.NamedDeny, want) {
		t.Fatalf("NamedDeny = %+v, want %+v", m.NamedDeny, want)
	}
	type conn struct {
		peer  identity.NumericIdentity
		port  uint16
		proto uint8
	}
	all := []conn{
		{client, 8080, ProtoTCP}, {client, 9090, ProtoTCP}, {client, 7070, ProtoTCP}, {client, 22, ProtoTCP},
		{other, 8080, ProtoTCP}, {other, 9090, ProtoTCP}, {other, 22, ProtoTCP}, {other, 8080, ProtoUDP},
	}
	for _, tc := range []struct {
		name    string
		ports   NamedPorts
		allowed []conn
	}{
		{"http is 8080", mustPorts(t, "http=8080", "web=7070"),
			[]conn{{client, 9090, ProtoTCP}, {client, 7070, ProtoTCP}, {other, 9090, ProtoTCP}, {other, 22, ProtoTCP}, {other, 8080, ProtoUDP}}},
		{"renumbered to 9090", mustPorts(t, "http=9090", "web=7070"),
			[]conn{{client, 8080, ProtoTCP}, {client, 7070, ProtoTCP}, {other, 8080, ProtoTCP}, {other, 22, ProtoTCP}, {other, 8080, ProtoUDP}}},
		{"http and web both 7070", mustPorts(t, "http=7070", "web=7070"),
			[]conn{{client, 8080, ProtoTCP}, {client, 9090, ProtoTCP}, {other, 8080, ProtoTCP}, {other, 9090, ProtoTCP}, {other, 22, ProtoTCP}, {other, 8080, ProtoUDP}}},
		{"only a UDP http", mustPorts(t, "http/UDP=8080", "web=7070"),
			[]conn{{client, 8080, ProtoTCP}, {client, 9090, ProtoTCP}, {client, 7070, ProtoTCP}, {other, 8080, ProtoTCP}, {other, 9090, ProtoTCP}, {other, 22, ProtoTCP}, {other, 8080, ProtoUDP}}},
		{"no ports", nil,
			[]conn{{client, 8080, ProtoTCP}, {client, 9090, ProtoTCP}, {other, 8080, ProtoTCP}, {other, 9090, ProtoTCP}, {other, 22, ProtoTCP}, {other, 8080, ProtoUDP}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := r.MapStateFor(server, tc.ports)
			for _, c := range all {
				if want := slices.Contains(tc.allowed, c); got.Allows(c.peer, c.port, c.proto, Ingress) != want {
					t.Errorf("from %d on %d/%d: allowed=%v, want %v (Allow %v Deny %v)", c.peer, c.port, c.proto, !want, want, got.Allow, got.Deny)
				}
			}
		})
	}
}

// A deny on a named port, once an endpoint resolves it, is exactly the
// deny on the number: the same entries, allows and denies, as the policy
// with the number written in its place.
func TestNamedDenyEqualsNumbered(t *testing.T) {
	const server, client, other identity.NumericIdentity = 900, 901, 902
	build := func(deny string) *Repository {
		r := NewRepository()
		r.UpsertIdentity(server, podLabels(t, "x", "app=server"))
		r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
		r.UpsertIdentity(other, podLabels(t, "x", "app=other"))
		r.Import(mustParse(t, namedDenyAllows+"---\n"+deny))
		return r
	}
	ports := mustPorts(t, "http=8080", "web=7070")
	named := build(namedDenyIngress).MapStateFor(server, ports)
	numbered := build(strings.Replace(namedDenyIngress, "port: http", `port: "8080"`, 1)).MapStateFor(server, ports)
	if !slices.Equal(named.Allow, numbered.Allow) || !slices.Equal(named.Deny, numbered.Deny) {
		t.Fatalf("named deny resolved to 8080:\n allow %v\n deny  %v\nnumbered deny on 8080:\n allow %v\n deny  %v",
			named.Allow, named.Deny, numbered.Allow, numbered.Deny)
	}
	if len(named.Deny) == 0 {
		t.Fatal("no deny entries")
	}
}

// An egressDeny on a named port denies, per destination identity, the
// numbers that identity's endpoints give the name, over a numbered allow
// and an any-port allow, and follows a destination renumbering it; one
// without peers denies the name of every identity declaring it.
func TestNamedDenyEgress(t *testing.T) {
	const client, serverA, serverB, other identity.NumericIdentity = 910, 911, 912, 913
	r := NewRepository()
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.UpsertIdentity(serverA, podLabels(t, "x", "app=server", "v=a"))
	r.UpsertIdentity(serverB, podLabels(t, "x", "app=server", "v=b"))
	r.UpsertIdentity(other, podLabels(t, "x", "app=other"))
	r.SetEndpointPorts("ep-a", serverA, mustPorts(t, "http=8080"))
	r.SetEndpointPorts("ep-other", other, mustPorts(t, "metrics=9100"))
	r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: out, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: client}}
  egress:
  - toEndpoints: [{matchLabels: {app: server}}]
    toPorts: [{ports: [{port: "8080", protocol: TCP}, {port: "9090", protocol: TCP}]}]
  - toEndpoints: [{matchLabels: {app: other}}]
  egressDeny:
  - toEndpoints: [{matchLabels: {app: server}}]
    toPorts: [{ports: [{port: http, protocol: TCP}]}]
  - toPorts: [{ports: [{port: metrics, protocol: TCP}]}]
`))
	check := func(peer identity.NumericIdentity, port uint16, want bool) {
		t.Helper()
		if r.MapState(client).Allows(peer, port, ProtoTCP, Egress) != want {
			t.Errorf("egress to %d on TCP %d: allowed=%v, want %v", peer, port, !want, want)
		}
	}
	check(serverA, 8080, false) // the numbered allow loses to the named deny
	check(serverA, 9090, true)
	check(serverB, 8080, true) // declares no http: nothing denied
	check(other, 9100, false)  // any-port allow, deny without peers
	check(other, 9101, true)

	// serverA renumbers http to 9090: the client's policy changes and
	// the deny moves.
	res := r.SetEndpointPorts("ep-a", serverA, mustPorts(t, "http=9090"))
	if !slices.Contains(changedIDs(res), client) {
		t.Fatalf("changed = %v, want the client", changedIDs(res))
	}
	check(serverA, 8080, true)
	check(serverA, 9090, false)
	check(serverB, 9090, true)

	// serverB comes up naming http 8080: denied to serverB only.
	r.SetEndpointPorts("ep-b", serverB, mustPorts(t, "http=8080"))
	check(serverB, 8080, false)
	check(serverA, 8080, true)

	// other renumbers metrics: the peerless deny follows it.
	if res := r.SetEndpointPorts("ep-other", other, mustPorts(t, "metrics=9101")); !slices.Contains(changedIDs(res), client) {
		t.Fatalf("changed = %v, want the client", changedIDs(res))
	}
	check(other, 9100, true)
	check(other, 9101, false)
}

// An ingressDeny from a CIDR on a named port denies that CIDR on the
// endpoint's own number, over an allow of every address.
func TestNamedDenyIngressCIDR(t *testing.T) {
	const server identity.NumericIdentity = 920
	r := NewRepository()
	r.UpsertIdentity(server, podLabels(t, "x", "app=server"))
	r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: cidr, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: server}}
  ingress:
  - fromCIDR: [0.0.0.0/0]
  ingressDeny:
  - fromCIDR: [10.1.0.0/16]
    toPorts: [{ports: [{port: http, protocol: TCP}]}]
`))
	addr := netip.MustParseAddr
	m := r.MapStateFor(server, mustPorts(t, "http=8080"))
	unresolved := r.MapState(server)
	for _, tc := range []struct {
		m    *MapState
		a    string
		port uint16
		want bool
	}{
		{m, "10.1.2.3", 8080, false}, {m, "10.1.2.3", 80, true}, {m, "10.2.2.3", 8080, true},
		{unresolved, "10.1.2.3", 8080, true},
	} {
		if got := tc.m.AllowsAddr(identity.ReservedWorld, addr(tc.a), tc.port, ProtoTCP, Ingress); got != tc.want {
			t.Errorf("%s TCP %d (resolved=%v): allowed=%v, want %v", tc.a, tc.port, tc.m == m, got, tc.want)
		}
	}
}

// Refused deny entries on named ports: in a host rule (the node declares
// no ports, as for allows).
func TestNamedDenyRefused(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"host", `apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: h}
spec:
  nodeSelector: {}
  ingressDeny:
  - toPorts: [{ports: [{port: http, protocol: TCP}]}]
`, "named ports are not supported in host policies"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse: %v, want an error containing %q", err, tc.want)
			}
		})
	}
	// An ingress CIDR deny on a named port, an egress one toward
	// endpoints and one toward CIDRs (namedcidr_test.go) are accepted.
	mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: ok, namespace: x}
spec:
  endpointSelector: {}
  ingressDeny:
  - fromCIDR: [10.0.0.0/8]
    toPorts: [{ports: [{port: http, protocol: TCP}]}]
  egressDeny:
  - toEndpoints: [{}]
    toPorts: [{ports: [{port: http, protocol: TCP}]}]
  - toCIDR: [10.0.0.0/8]
    toCIDRSet: [{cidr: 192.168.0.0/16}]
    toPorts: [{ports: [{port: http, protocol: TCP}]}]
`)
}

// A named deny wins over L7 rules on the number it resolves to: on
// ingress over a named HTTP rule (the redirect goes, the port drops),
// on egress over a named DNS rule of the same peer.
func TestNamedDenyOverL7(t *testing.T) {
	const server, client, dnsSrv identity.NumericIdentity = 930, 931, 932
	r := NewRepository()
	r.UpsertIdentity(server, podLabels(t, "x", "app=server"))
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.Import(mustParse(t, cnpIngressNamedL7+`  ingressDeny:
  - fromEndpoints: [{matchLabels: {app: client}}]
    toPorts: [{ports: [{port: http, protocol: TCP}]}]
`))
	k := Key{Identity: client, Port: 80, Proto: ProtoTCP, Dir: Ingress}
	m := r.MapStateFor(server, mustPorts(t, "http=80"))
	checkL7(t, m, k, nil)
	if m.Allows(client, 80, ProtoTCP, Ingress) || !m.Denies(k) {
		t.Errorf("TCP 80 from client not denied: Allow %+v Deny %+v", m.Allow, m.Deny)
	}

	r = NewRepository()
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.UpsertIdentity(dnsSrv, podLabels(t, "x", "app=dns"))
	r.SetEndpointPorts("dns", dnsSrv, mustPorts(t, "dns/UDP=5353"))
	r.Import(mustParse(t, cnpEgressNamedL7+`  egressDeny:
  - toEndpoints: [{matchLabels: {app: dns}}]
    toPorts: [{ports: [{port: dns, protocol: UDP}]}]
`))
	m = r.MapState(client)
	if len(m.DNS) != 0 || m.Allows(dnsSrv, 5353, ProtoUDP, Egress) {
		t.Errorf("UDP 5353 to the DNS server: DNS %+v, allowed=%v; want denied", m.DNS, m.Allows(dnsSrv, 5353, ProtoUDP, Egress))
	}
}
