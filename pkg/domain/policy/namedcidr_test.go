package policy

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// namedCIDRAllow allows the client toward 10.0.0.0/8 on the named port
// http only.
const namedCIDRAllow = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: out, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: client}}
  egress:
  - toCIDR: [10.0.0.0/8]
    toPorts: [{ports: [{port: http, protocol: TCP}]}]
`

// namedCIDRDeny lets the client reach anything but denies 10.1.0.0/16
// on the named port http, over an allow of 10.0.0.0/8 on 8080 and 9090.
const namedCIDRDeny = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: out, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: client}}
  enableDefaultDeny: {egress: false}
  egress:
  - toCIDR: [10.0.0.0/8]
    toPorts: [{ports: [{port: "8080", protocol: TCP}, {port: "9090", protocol: TCP}]}]
  egressDeny:
  - toCIDRSet: [{cidr: 10.1.0.0/16}]
    toPorts: [{ports: [{port: http, protocol: TCP}]}]
`

// cidrID returns the CIDR identity of prefix s.
func cidrID(t *testing.T, r *Repository, s string) identity.NumericIdentity {
	t.Helper()
	c, ok := r.cidrs[netip.MustParsePrefix(s)]
	if !ok {
		t.Fatalf("no CIDR identity for %s", s)
	}
	return c.id
}

// conn is a connection of namedCIDR tests: to addr (whose ipcache
// identity is peer) on TCP port.
type namedCIDRConn struct {
	peer identity.NumericIdentity
	addr string
	port uint16
}

func checkCIDRConns(t *testing.T, what string, m *MapState, conns []namedCIDRConn, allowed []namedCIDRConn) {
	t.Helper()
	for _, c := range conns {
		want := slices.Contains(allowed, c)
		if got := m.AllowsAddr(c.peer, netip.MustParseAddr(c.addr), c.port, ProtoTCP, Egress); got != want {
			t.Errorf("%s: egress to %s (identity %d) on TCP %d: allowed=%v, want %v\n Allow %v\n Deny %v\n CIDR %+v",
				what, c.addr, c.peer, c.port, got, want, m.Allow, m.Deny, m.CIDR)
		}
	}
}

// An egress toCIDR allow on a named port allows the numbers the
// cluster's endpoints give the name (any identity's, local or remote),
// toward an address outside the cluster (its CIDR identity) and a pod's
// address (the CIDR entries) alike; it follows a renumbering, a new
// number, an endpoint going; with no endpoint declaring the name it
// allows nothing. Ports of another name change nothing.
func TestNamedCIDREgressAllow(t *testing.T) {
	const client, serverA, serverB, other identity.NumericIdentity = 1000, 1001, 1002, 1003
	r := NewRepository()
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.UpsertIdentity(serverA, podLabels(t, "x", "app=server", "v=a"))
	r.UpsertIdentity(serverB, podLabels(t, "y", "app=server", "v=b"))
	r.UpsertIdentity(other, podLabels(t, "y", "app=other"))
	r.SetEndpointPorts("ep-a", serverA, mustPorts(t, "http=8080"))
	r.Import(mustParse(t, namedCIDRAllow))
	cid := cidrID(t, r, "10.0.0.0/8")
	conns := []namedCIDRConn{
		{cid, "10.1.2.3", 8080}, {cid, "10.1.2.3", 8081}, {cid, "10.1.2.3", 9090}, {cid, "10.1.2.3", 80},
		{serverB, "10.9.0.5", 8080}, {serverB, "10.9.0.5", 8081}, // a pod's address: decided by the CIDR entries
		{identity.ReservedWorld, "192.0.2.1", 8080},
	}
	m := r.MapState(client)
	checkCIDRConns(t, "http is 8080", m, conns, []namedCIDRConn{{cid, "10.1.2.3", 8080}, {serverB, "10.9.0.5", 8080}})

	res := r.SetEndpointPorts("ep-a", serverA, mustPorts(t, "http=8081"))
	if !slices.Contains(changedIDs(res), client) {
		t.Fatalf("renumbered: changed = %v, want the client", changedIDs(res))
	}
	checkCIDRConns(t, "http is 8081", r.MapState(client), conns, []namedCIDRConn{{cid, "10.1.2.3", 8081}, {serverB, "10.9.0.5", 8081}})

	// A remote endpoint of another identity names http 9090: the union.
	if res := r.SetEndpointPortsBatch([]EndpointPortsChange{{Owner: "remote/10.9.0.5", Identity: serverB, Ports: mustPorts(t, "http=9090")}}); !slices.Contains(changedIDs(res), client) {
		t.Fatalf("new number: changed = %v, want the client", changedIDs(res))
	}
	checkCIDRConns(t, "http is 8081 and 9090", r.MapState(client), conns,
		[]namedCIDRConn{{cid, "10.1.2.3", 8081}, {cid, "10.1.2.3", 9090}, {serverB, "10.9.0.5", 8081}})

	// A second endpoint naming a number already known, and ports of
	// another name, change nothing.
	for _, c := range []EndpointPortsChange{
		{Owner: "ep-a2", Identity: serverA, Ports: mustPorts(t, "http=8081")},
		{Owner: "ep-other", Identity: other, Ports: mustPorts(t, "metrics=8080")},
		{Owner: "ep-udp", Identity: other, Ports: mustPorts(t, "http/UDP=8080")},
	} {
		if res := r.SetEndpointPorts(c.Owner, c.Identity, c.Ports); len(res.Changed) != 0 {
			t.Fatalf("%s: changed = %v, want none", c.Owner, changedIDs(res))
		}
	}

	// Every endpoint naming http goes: nothing is allowed.
	r.RemoveEndpointPorts("ep-a")
	r.RemoveEndpointPorts("ep-a2")
	res = r.RemoveEndpointPorts("remote/10.9.0.5")
	if !slices.Contains(changedIDs(res), client) {
		t.Fatalf("gone: changed = %v, want the client", changedIDs(res))
	}
	m = r.MapState(client)
	checkCIDRConns(t, "no http", m, conns, nil)
	if len(m.CIDR) != 0 {
		t.Errorf("CIDR entries %+v with no endpoint naming http", m.CIDR)
	}
}

// An egressDeny toward a toCIDRSet on a named port denies the numbers
// the cluster's endpoints give the name, over a numbered allow of the
// same addresses, and follows a renumbering; with no endpoint declaring
// the name it denies nothing.
func TestNamedCIDREgressDeny(t *testing.T) {
	const client, server identity.NumericIdentity = 1010, 1011
	r := NewRepository()
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.UpsertIdentity(server, podLabels(t, "y", "app=server"))
	r.SetEndpointPorts("ep-s", server, mustPorts(t, "http=8080"))
	r.Import(mustParse(t, namedCIDRDeny))
	wide, narrow := cidrID(t, r, "10.0.0.0/8"), cidrID(t, r, "10.1.0.0/16")
	conns := []namedCIDRConn{
		{narrow, "10.1.2.3", 8080}, {narrow, "10.1.2.3", 9090}, {narrow, "10.1.2.3", 80},
		{wide, "10.2.2.3", 8080}, {wide, "10.2.2.3", 9090},
		{server, "10.1.7.7", 8080}, {server, "10.1.7.7", 9090}, // a pod inside the denied range
	}
	all := slices.Clone(conns)
	m := r.MapState(client)
	checkCIDRConns(t, "http is 8080", m, conns, slices.DeleteFunc(slices.Clone(all), func(c namedCIDRConn) bool {
		return c.port == 8080 && strings.HasPrefix(c.addr, "10.1.")
	}))
	if k := (Key{Identity: narrow, Port: 8080, Proto: ProtoTCP, Dir: Egress}); !m.Denies(k) {
		t.Errorf("no deny entry %+v: Deny %v", k, m.Deny)
	}

	if res := r.SetEndpointPorts("ep-s", server, mustPorts(t, "http=9090")); !slices.Contains(changedIDs(res), client) {
		t.Fatalf("renumbered: changed = %v, want the client", changedIDs(res))
	}
	checkCIDRConns(t, "http is 9090", r.MapState(client), conns, slices.DeleteFunc(slices.Clone(all), func(c namedCIDRConn) bool {
		return c.port == 9090 && strings.HasPrefix(c.addr, "10.1.")
	}))

	r.RemoveEndpointPorts("ep-s")
	m = r.MapState(client)
	checkCIDRConns(t, "no http", m, conns, all)
	if len(m.Deny) != 0 || slices.ContainsFunc(m.CIDR, func(e CIDREntry) bool { return e.Deny }) {
		t.Errorf("deny entries with no endpoint naming http: Deny %v CIDR %+v", m.Deny, m.CIDR)
	}
}

// Once resolved, an egress CIDR deny on a named port is exactly the deny
// on the number: the same entries as the policy with the number written
// in its place.
func TestNamedCIDRDenyEqualsNumbered(t *testing.T) {
	const client, server identity.NumericIdentity = 1020, 1021
	build := func(doc string) *MapState {
		r := NewRepository()
		r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
		r.UpsertIdentity(server, podLabels(t, "y", "app=server"))
		r.SetEndpointPorts("ep-s", server, mustPorts(t, "http=8080"))
		r.Import(mustParse(t, doc))
		return r.MapState(client)
	}
	named := build(namedCIDRDeny)
	numbered := build(strings.Replace(namedCIDRDeny, "port: http", `port: "8080"`, 1))
	if !slices.Equal(named.Allow, numbered.Allow) || !slices.Equal(named.Deny, numbered.Deny) || !slices.Equal(named.CIDR, numbered.CIDR) {
		t.Fatalf("named deny resolved to 8080:\n allow %v\n deny  %v\n cidr  %+v\nnumbered deny on 8080:\n allow %v\n deny  %v\n cidr  %+v",
			named.Allow, named.Deny, named.CIDR, numbered.Allow, numbered.Deny, numbered.CIDR)
	}
	if len(named.Deny) == 0 {
		t.Fatal("no deny entries")
	}
}

// Deny precedence holds for a CIDR allow on a named port: an L3-only
// deny of a narrower CIDR (every port) and a numbered deny of the
// resolved number win over it.
func TestNamedCIDRAllowLosesToDeny(t *testing.T) {
	const client, server identity.NumericIdentity = 1030, 1031
	r := NewRepository()
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.UpsertIdentity(server, podLabels(t, "y", "app=server"))
	r.SetEndpointPorts("ep-s", server, mustPorts(t, "http=8080"))
	r.Import(mustParse(t, namedCIDRAllow+`  egressDeny:
  - toCIDR: [10.1.2.0/24]
  - toCIDR: [10.3.0.0/16]
    toPorts: [{ports: [{port: "8080", protocol: TCP}]}]
`))
	wide, l3, num := cidrID(t, r, "10.0.0.0/8"), cidrID(t, r, "10.1.2.0/24"), cidrID(t, r, "10.3.0.0/16")
	conns := []namedCIDRConn{
		{wide, "10.1.3.3", 8080}, {l3, "10.1.2.3", 8080}, {num, "10.3.1.1", 8080},
		{server, "10.1.2.9", 8080}, {server, "10.3.1.9", 8080}, {server, "10.4.1.9", 8080},
	}
	checkCIDRConns(t, "denies", r.MapState(client), conns, []namedCIDRConn{{wide, "10.1.3.3", 8080}, {server, "10.4.1.9", 8080}})
}

// A NetworkPolicy ipBlock egress peer on a named port resolves as a
// toCIDR one.
func TestNamedCIDRIPBlock(t *testing.T) {
	const client, server identity.NumericIdentity = 1040, 1041
	r := NewRepository()
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.UpsertIdentity(server, podLabels(t, "y", "app=server"))
	r.SetEndpointPorts("ep-s", server, mustPorts(t, "dns/UDP=5353"))
	r.Import(mustParse(t, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: out, namespace: x}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.9.0.0/16]}}]
    ports: [{port: dns, protocol: UDP}]
`))
	m := r.MapState(client)
	cid := cidrID(t, r, "10.0.0.0/8")
	for _, tc := range []struct {
		peer identity.NumericIdentity
		addr string
		port uint16
		want bool
	}{
		{cid, "10.1.1.1", 5353, true}, {cid, "10.1.1.1", 53, false}, {server, "10.2.0.4", 5353, true},
		{server, "10.9.0.4", 5353, false}, {identity.ReservedWorld, "192.0.2.1", 5353, false},
	} {
		if got := m.AllowsAddr(tc.peer, netip.MustParseAddr(tc.addr), tc.port, ProtoUDP, Egress); got != tc.want {
			t.Errorf("UDP %s:%d (identity %d): allowed=%v, want %v (CIDR %+v)", tc.addr, tc.port, tc.peer, got, tc.want, m.CIDR)
		}
	}
}
