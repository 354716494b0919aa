package policy

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// namedPeerConn is a connection of namedPeer tests: to an address of
// identity peer on TCP port.
type namedPeerConn struct {
	peer identity.NumericIdentity
	port uint16
}

func checkPeerConns(t *testing.T, what string, m *MapState, conns, allowed []namedPeerConn) {
	t.Helper()
	for _, c := range conns {
		want := slices.Contains(allowed, c)
		if got := m.Allows(c.peer, c.port, ProtoTCP, Egress); got != want {
			t.Errorf("%s: egress to identity %d on TCP %d: allowed=%v, want %v\n Allow %v\n Deny %v",
				what, c.peer, c.port, got, want, m.Allow, m.Deny)
		}
	}
}

// mustChange fails unless res changed id's policy.
func mustChange(t *testing.T, what string, res Result, id identity.NumericIdentity) {
	t.Helper()
	if !slices.Contains(changedIDs(res), id) {
		t.Fatalf("%s: changed = %v, want %d", what, changedIDs(res), id)
	}
}

// An egress toEntities world allow on a named port allows the world
// and the CIDR identities (addresses outside the cluster, which declare
// no ports) the numbers the cluster's endpoints give the name, following
// a renumbering and a number going; with no endpoint declaring it,
// nothing.
func TestNamedPeerWorldAllow(t *testing.T) {
	const client, server identity.NumericIdentity = 1100, 1101
	r := NewRepository()
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.UpsertIdentity(server, podLabels(t, "y", "app=server"))
	r.SetEndpointPorts("ep-s", server, mustPorts(t, "http=8080"))
	r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: out, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: client}}
  egress:
  - toEntities: [world]
    toPorts: [{ports: [{port: http, protocol: TCP}]}]
  - toCIDR: [192.0.2.0/24]
    toPorts: [{ports: [{port: "53", protocol: TCP}]}]
`))
	cid := cidrID(t, r, "192.0.2.0/24")
	w := identity.ReservedWorld
	conns := []namedPeerConn{{w, 8080}, {w, 8081}, {cid, 8080}, {cid, 8081}, {server, 8080}, {identity.ReservedHost, 8080}}
	checkPeerConns(t, "http is 8080", r.MapState(client), conns, []namedPeerConn{{w, 8080}, {cid, 8080}})

	mustChange(t, "renumbered", r.SetEndpointPorts("ep-s", server, mustPorts(t, "http=8081")), client)
	checkPeerConns(t, "http is 8081", r.MapState(client), conns, []namedPeerConn{{w, 8081}, {cid, 8081}})

	mustChange(t, "gone", r.RemoveEndpointPorts("ep-s"), client)
	checkPeerConns(t, "no http", r.MapState(client), conns, nil)
}

// An egressDeny toward world on a named port denies the world the
// cluster's numbers over an allow of everything (pods keep them), and
// follows a renumbering; an L3-only deny of world denies every port.
func TestNamedPeerWorldDeny(t *testing.T) {
	const client, server identity.NumericIdentity = 1110, 1111
	r := NewRepository()
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.UpsertIdentity(server, podLabels(t, "y", "app=server"))
	r.SetEndpointPorts("ep-s", server, mustPorts(t, "http=8080"))
	r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: out, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: client}}
  egress:
  - toEntities: [all]
    toPorts: [{ports: [{port: "8080", protocol: TCP}, {port: "8081", protocol: TCP}, {port: "9090", protocol: TCP}]}]
  egressDeny:
  - toEntities: [world]
    toPorts: [{ports: [{port: http, protocol: TCP}]}]
`))
	w := identity.ReservedWorld
	conns := []namedPeerConn{{w, 8080}, {w, 8081}, {w, 9090}, {server, 8080}, {server, 8081}}
	checkPeerConns(t, "http is 8080", r.MapState(client), conns,
		[]namedPeerConn{{w, 8081}, {w, 9090}, {server, 8080}, {server, 8081}})

	mustChange(t, "renumbered", r.SetEndpointPorts("ep-s", server, mustPorts(t, "http=8081")), client)
	checkPeerConns(t, "http is 8081", r.MapState(client), conns,
		[]namedPeerConn{{w, 8080}, {w, 9090}, {server, 8080}, {server, 8081}})

	r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: l3, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: client}}
  egressDeny:
  - toEntities: [world]
`))
	checkPeerConns(t, "L3 deny", r.MapState(client), conns, []namedPeerConn{{server, 8080}, {server, 8081}})
}

// An entry toward any peer (toEntities all, ports only) on a named port
// resolves per identity for the endpoints' identities (one declaring no
// such port gets nothing) and to the cluster's numbers for the others:
// world, reserved, CIDR identities, one that comes later included.
// egressDeny alike.
func TestNamedPeerAll(t *testing.T) {
	const client, server, other identity.NumericIdentity = 1120, 1121, 1122
	r := NewRepository()
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.UpsertIdentity(server, podLabels(t, "y", "app=server"))
	r.UpsertIdentity(other, podLabels(t, "y", "app=other"))
	r.SetEndpointPorts("ep-s", server, mustPorts(t, "http=8080"))
	r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: out, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: client}}
  egress:
  - toEntities: [all]
    toPorts: [{ports: [{port: http, protocol: TCP}]}]
`))
	w, host := identity.ReservedWorld, identity.ReservedHost
	conns := []namedPeerConn{{w, 8080}, {w, 8081}, {host, 8080}, {server, 8080}, {server, 8081}, {other, 8080}}
	checkPeerConns(t, "http is 8080", r.MapState(client), conns, []namedPeerConn{{w, 8080}, {host, 8080}, {server, 8080}})

	// A CIDR identity coming (another policy's toCIDR) gets the numbers.
	mustChange(t, "CIDR identity", r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: cidr, namespace: z}
spec:
  endpointSelector: {}
  egress:
  - toCIDR: [198.51.100.0/24]
`)), client)
	cid := cidrID(t, r, "198.51.100.0/24")
	conns = append(conns, namedPeerConn{cid, 8080}, namedPeerConn{cid, 8081})
	checkPeerConns(t, "CIDR identity", r.MapState(client), conns, []namedPeerConn{{w, 8080}, {host, 8080}, {server, 8080}, {cid, 8080}})

	// other names http 8081: its own number, everyone outside both.
	mustChange(t, "other names 8081", r.SetEndpointPorts("ep-o", other, mustPorts(t, "http=8081")), client)
	checkPeerConns(t, "8080 and 8081", r.MapState(client), append(conns, namedPeerConn{other, 8081}), []namedPeerConn{
		{w, 8080}, {w, 8081}, {host, 8080}, {server, 8080}, {cid, 8080}, {cid, 8081}, {other, 8081},
	})

	// The same as a deny over an allow of everything.
	r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: out, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: client}}
  egress:
  - toEntities: [all]
  egressDeny:
  - toEntities: [all]
    toPorts: [{ports: [{port: http, protocol: TCP}]}]
`))
	m := r.MapState(client)
	for _, c := range []struct {
		namedPeerConn
		want bool
	}{
		{namedPeerConn{w, 8080}, false}, {namedPeerConn{w, 8081}, false}, {namedPeerConn{w, 9090}, true},
		{namedPeerConn{cid, 8081}, false}, {namedPeerConn{server, 8080}, false}, {namedPeerConn{server, 8081}, true},
		{namedPeerConn{other, 8080}, true}, {namedPeerConn{other, 8081}, false},
	} {
		if got := m.Allows(c.peer, c.port, ProtoTCP, Egress); got != c.want {
			t.Errorf("deny: to %d on %d: allowed=%v, want %v (Deny %v)", c.peer, c.port, got, c.want, m.Deny)
		}
	}
}

// toEntities cluster on a named port keeps resolving per identity for
// the pods' identities; its reserved members (host, remote-node) declare
// no ports and get the cluster's numbers.
func TestNamedPeerCluster(t *testing.T) {
	const client, server, other identity.NumericIdentity = 1130, 1131, 1132
	r := NewRepository()
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.UpsertIdentity(server, podLabels(t, "y", "app=server"))
	r.UpsertIdentity(other, podLabels(t, "y", "app=other"))
	r.SetEndpointPorts("ep-s", server, mustPorts(t, "http=8080"))
	r.SetEndpointPorts("ep-o", other, mustPorts(t, "http=8081"))
	r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: out, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: client}}
  egress:
  - toEntities: [cluster]
    toPorts: [{ports: [{port: http, protocol: TCP}]}]
`))
	w, host, rn := identity.ReservedWorld, identity.ReservedHost, identity.ReservedRemoteNode
	conns := []namedPeerConn{{server, 8080}, {server, 8081}, {other, 8080}, {other, 8081}, {host, 8080}, {host, 8081}, {rn, 8081}, {w, 8080}}
	checkPeerConns(t, "cluster", r.MapState(client), conns, []namedPeerConn{
		{server, 8080}, {other, 8081}, {host, 8080}, {host, 8081}, {rn, 8081},
	})
}

// toFQDNs on a named port: the learned addresses' identities get the
// cluster's numbers, following a renumbering.
func TestNamedPeerFQDN(t *testing.T) {
	const client, server identity.NumericIdentity = 1140, 1141
	r := NewRepository()
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.UpsertIdentity(server, podLabels(t, "y", "app=server"))
	r.SetEndpointPorts("ep-s", server, mustPorts(t, "http=8080"))
	r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: out, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: client}}
  egress:
  - toFQDNs: [{matchName: web.test}]
    toPorts: [{ports: [{port: http, protocol: TCP}]}]
`))
	addr := netip.MustParseAddr("192.0.2.10")
	res := r.SetFQDN("web.test", []netip.Addr{addr})
	id, ok := res.CIDRUpserts[netip.PrefixFrom(addr, 32)]
	if !ok {
		t.Fatalf("SetFQDN: %+v", res)
	}
	conns := []namedPeerConn{{id, 8080}, {id, 8081}, {identity.ReservedWorld, 8080}, {server, 8080}}
	checkPeerConns(t, "http is 8080", r.MapState(client), conns, []namedPeerConn{{id, 8080}})
	mustChange(t, "renumbered", r.SetEndpointPorts("ep-s", server, mustPorts(t, "http=8081")), client)
	checkPeerConns(t, "http is 8081", r.MapState(client), conns, []namedPeerConn{{id, 8081}})
}

// toServices on a named port: a Service without a selector's backend
// addresses get the cluster's numbers, a Service with one's pods their
// own.
func TestNamedPeerServices(t *testing.T) {
	const client, db, web identity.NumericIdentity = 1150, 1151, 1152
	r := NewRepository()
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.UpsertIdentity(db, podLabels(t, "y", "app=db"))
	r.UpsertIdentity(web, podLabels(t, "y", "app=web"))
	r.SetEndpointPorts("ep-db", db, mustPorts(t, "http=8080"))
	r.SetEndpointPorts("ep-web", web, mustPorts(t, "http=8081"))
	r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: svc, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: client}}
  egress:
  - toServices:
    - k8sService: {serviceName: db, namespace: "y"}
    - k8sService: {serviceName: ext, namespace: "y"}
    toPorts: [{ports: [{port: http, protocol: TCP}]}]
`))
	r.SetService("y", "db", &Service{Selector: map[string]string{"app": "db"}})
	e := netip.MustParseAddr("192.0.2.1")
	res := r.SetService("y", "ext", &Service{Addrs: []netip.Addr{e}})
	id, ok := res.CIDRUpserts[netip.PrefixFrom(e, 32)]
	if !ok {
		t.Fatalf("ext: %+v", res)
	}
	conns := []namedPeerConn{{id, 8080}, {id, 8081}, {id, 9090}, {db, 8080}, {db, 8081}, {web, 8081}}
	checkPeerConns(t, "services", r.MapState(client), conns, []namedPeerConn{{id, 8080}, {id, 8081}, {db, 8080}})
	mustChange(t, "web renumbered", r.SetEndpointPorts("ep-web", web, mustPorts(t, "http=9090")), client)
	checkPeerConns(t, "web renumbered", r.MapState(client), conns, []namedPeerConn{{id, 8080}, {id, 9090}, {db, 8080}})
}
