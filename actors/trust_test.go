package actors_test

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestSourceRank: this node's endpoints and reserved addresses outrank
// every other node's claims, which outrank policy CIDRs (FQDN-learned
// addresses included).
func TestSourceRank(t *testing.T) {
	order := []string{index.SourceEndpoint, index.SourceReserved, index.SourceKubeAPIServer, index.SourceNode, index.SourceRemote, index.SourceCIDRPolicy}
	for i, hi := range order {
		for _, lo := range order[i+1:] {
			if actors.SourceRankForTest(hi) >= actors.SourceRankForTest(lo) {
				t.Errorf("%s does not outrank %s", hi, lo)
			}
		}
	}
}

// TestRemoteClaimsCannotDisplaceHost: another node's claim on this
// node's gateway or on a host address never displaces reserved:host,
// whichever arrives first; a remote claim with a reserved identity is
// ignored.
func TestRemoteClaimsCannotDisplaceHost(t *testing.T) {
	h := startSystem(t, nil)
	ctx := context.Background()
	gw := netip.MustParsePrefix("10.200.0.1/32") // testIPv4's gateway
	hostAddr := netip.MustParseAddr("192.0.2.9")
	later := netip.MustParseAddr("192.0.2.8") // claimed remotely before the host has it
	h.sys.HostAddrChanged(hostAddr, false)
	testutil.Eventually(t, "gateway and host address are host", func() bool {
		return h.ipcacheIdentity(gw) == identity.ReservedHost && h.ipcacheIdentity(host32(hostAddr)) == identity.ReservedHost
	})
	forged := []endpoint.Remote{
		{IPs: []netip.Addr{gw.Addr()}, Identity: 70010, Node: "evil", NodeIP: netip.MustParseAddr("192.0.2.66")},
		{IPs: []netip.Addr{hostAddr, later}, Identity: 70011, Node: "evil", NodeIP: netip.MustParseAddr("192.0.2.66")},
		{IPs: []netip.Addr{netip.MustParseAddr("10.99.0.1")}, Identity: identity.ReservedHost, Node: "evil"},
		{IPs: []netip.Addr{netip.MustParseAddr("10.99.0.2")}, Identity: identity.ReservedHealth, Node: "evil"},
		{IPs: []netip.Addr{netip.MustParseAddr("10.99.0.3")}, Identity: 200, Node: "evil"},
	}
	if err := h.sys.UpsertRemoteEndpoints(ctx, "k8s", forged); err != nil {
		t.Fatal(err)
	}
	h.sys.HostAddrChanged(later, false)
	testutil.Eventually(t, "host takes the address claimed remotely first", func() bool { return h.ipcacheIdentity(host32(later)) == identity.ReservedHost })
	for _, p := range []netip.Prefix{gw, host32(hostAddr), host32(later)} {
		e := h.ipcacheRow(p)
		if e == nil || e.Identity != identity.ReservedHost || e.Source != index.SourceReserved || e.TunnelEndpoint.IsValid() {
			t.Fatalf("row for %s = %+v; want reserved:host, no tunnel", p, e)
		}
		testutil.Eventually(t, "datapath maps "+p.String()+" to host", func() bool { return h.fake.IPCache()[p] == identity.ReservedHost })
	}
	for _, ip := range []string{"10.99.0.1", "10.99.0.2", "10.99.0.3"} {
		if e := h.ipcacheRow(host32(netip.MustParseAddr(ip))); e != nil {
			t.Fatalf("remote claim with a reserved identity entered the ipcache: %+v", e)
		}
	}
	// The host address goes: the remote claim may have it then.
	h.sys.HostAddrChanged(later, true)
	testutil.Eventually(t, "remote claim takes the address the host lost", func() bool { return h.ipcacheIdentity(host32(later)) == 70011 })
}

const hostFQDNPolicies = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: fqdn}
spec:
  endpointSelector: {matchLabels: {app: a}}
  egress:
  - toEntities: [world]
    toPorts:
    - ports: [{port: "53", protocol: ANY}]
      rules: {dns: [{matchPattern: "*.test"}]}
  - toFQDNs: [{matchName: node.test}]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: host-in}
spec:
  endpointSelector: {matchLabels: {app: b}}
  ingress:
  - fromEntities: [host]
`

// TestFQDNAnswerNamingHost: a DNS answer naming the node's gateway and a
// host address does not give them a CIDR identity: the ipcache keeps
// reserved:host, an endpoint allowing fromEntities host still accepts
// the host, and the toFQDN endpoint is not allowed to the node.
func TestFQDNAnswerNamingHost(t *testing.T) {
	h := startSystem(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	pols, err := policy.Parse([]byte(hostFQDNPolicies))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.sys.ImportPolicy(ctx, pols); err != nil {
		t.Fatal(err)
	}
	gw := netip.MustParseAddr("10.200.0.1")
	hostAddr := netip.MustParseAddr("192.0.2.9")
	h.sys.HostAddrChanged(hostAddr, false)
	testutil.Eventually(t, "host address is host", func() bool { return h.ipcacheIdentity(host32(hostAddr)) == identity.ReservedHost })
	a := h.mustCreate(t, podSpec(t, "c1", "default", "a", "k8s:app=a", "k8s:io.kubernetes.pod.namespace=default"))
	b := h.mustCreate(t, podSpec(t, "c2", "default", "b", "k8s:app=b", "k8s:io.kubernetes.pod.namespace=default"))
	if err := h.sys.LearnFQDN(ctx, a.ID, "node.test", []netip.Addr{gw, hostAddr}, time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, ip := range []netip.Addr{gw, hostAddr} {
		p := host32(ip)
		if e := h.ipcacheRow(p); e == nil || e.Identity != identity.ReservedHost || e.Source != index.SourceReserved {
			t.Fatalf("row for %s after the DNS answer = %+v; want reserved:host", ip, e)
		}
		if id := h.fake.IPCache()[p]; id != identity.ReservedHost {
			t.Fatalf("datapath maps %s to %d after the DNS answer; want host", ip, id)
		}
		if m := h.fake.Policy(a.ID); m.AllowsAddr(identity.ReservedHost, ip, 443, policy.ProtoTCP, policy.Egress) {
			t.Fatalf("the toFQDN endpoint is allowed to the node at %s", ip)
		}
		if m := h.fake.Policy(b.ID); !m.AllowsAddr(identity.ReservedHost, ip, 10250, policy.ProtoTCP, policy.Ingress) {
			t.Fatalf("fromEntities host no longer admits the host from %s", ip)
		}
	}
	// The rule still works for an address that is nobody's.
	out := netip.MustParseAddr("198.51.100.7")
	if err := h.sys.LearnFQDN(ctx, a.ID, "node.test", []netip.Addr{gw, hostAddr, out}, time.Hour); err != nil {
		t.Fatal(err)
	}
	id := h.fake.IPCache()[host32(out)]
	if id < policy.MinCIDRIdentity || !h.fake.Policy(a.ID).AllowsAddr(id, out, 443, policy.ProtoTCP, policy.Egress) {
		t.Fatalf("learned address %s (identity %d) not allowed", out, id)
	}
}

// TestNodeAndAPIServerAddrs: other nodes' addresses are remote-node and
// the API server's kube-apiserver (over remote-node where both), while
// this node's host addresses stay host and another node's endpoint claim
// cannot take a node's address; a node gone is no longer remote-node.
func TestNodeAndAPIServerAddrs(t *testing.T) {
	h := startSystem(t, nil)
	ctx := context.Background()
	hostAddr, nodeA, nodeB := netip.MustParseAddr("192.0.2.9"), netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.2")
	apiOut := netip.MustParseAddr("203.0.113.7")
	h.sys.HostAddrChanged(hostAddr, false)
	if err := h.sys.SyncNodes(ctx, "k8s", []datapath.RemoteNode{
		{Name: "a", Addrs: []netip.Addr{nodeA}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.98.1.0/24")}},
		{Name: "b", Addrs: []netip.Addr{nodeB}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.98.2.0/24")}},
	}); err != nil {
		t.Fatal(err)
	}
	h.sys.SetKubeAPIServerAddrs([]netip.Addr{hostAddr, nodeB, apiOut})
	if err := h.sys.UpsertRemoteEndpoints(ctx, "k8s", []endpoint.Remote{{IPs: []netip.Addr{nodeA}, Identity: 70020, Node: "a", NodeIP: nodeA}}); err != nil {
		t.Fatal(err)
	}
	want := map[netip.Addr]identity.NumericIdentity{hostAddr: identity.ReservedHost, nodeA: identity.ReservedRemoteNode,
		nodeB: identity.ReservedKubeAPIServer, apiOut: identity.ReservedKubeAPIServer}
	testutil.Eventually(t, "node and API server addresses", func() bool {
		for a, id := range want {
			if h.ipcacheIdentity(host32(a)) != id {
				return false
			}
		}
		return true
	})
	if err := h.sys.SyncNodes(ctx, "k8s", nil); err != nil {
		t.Fatal(err)
	}
	h.sys.SetKubeAPIServerAddrs(nil)
	testutil.Eventually(t, "nodes and API server gone", func() bool {
		return h.ipcacheIdentity(host32(nodeB)) == 0 && h.ipcacheIdentity(host32(apiOut)) == 0 &&
			h.ipcacheIdentity(host32(nodeA)) == 70020 && h.ipcacheIdentity(host32(hostAddr)) == identity.ReservedHost
	})
}

// TestRemoteHealthAddrs: a node's health endpoint addresses enter the
// ipcache with the identity health only inside that node's own pod CIDRs;
// a node naming another node's pod, a node address (its own) or an
// address of this node's ranges is refused, logged and counted once per
// address, and a remote endpoint claim cannot relabel an accepted one.
func TestRemoteHealthAddrs(t *testing.T) {
	h := startSystem(t, nil)
	ctx := context.Background()
	a := netip.MustParseAddr
	aHealth4, aHealth6 := a("10.98.1.7"), a("fd98:1::7")
	forged := []netip.Addr{a("10.98.1.8"), a("198.51.100.2"), a("10.200.0.9")}
	nodes := []datapath.RemoteNode{
		{Name: "a", Addrs: []netip.Addr{a("198.51.100.1")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.98.1.0/24"), netip.MustParsePrefix("fd98:1::/64")},
			HealthIPs: []netip.Addr{aHealth4, aHealth6}},
		// b names a's pod and its own node address.
		{Name: "b", Addrs: []netip.Addr{a("198.51.100.2")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.98.2.0/24")},
			HealthIPs: forged[:2]},
		// c's pod CIDR covers this node's range; it names an address in it.
		{Name: "c", Addrs: []netip.Addr{a("198.51.100.3")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.200.0.0/16")},
			HealthIPs: forged[2:]},
	}
	for range 2 { // the same set twice: each refusal counted once
		if err := h.sys.SyncNodes(ctx, "k8s", nodes); err != nil {
			t.Fatal(err)
		}
	}
	// A remote endpoint claim of node a on its health address, with a
	// cluster identity, ranks below the node's.
	if err := h.sys.UpsertRemoteEndpoints(ctx, "k8s", []endpoint.Remote{{IPs: []netip.Addr{aHealth4}, Identity: 70021, Node: "a"}}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "a's health addresses are health", func() bool {
		return h.ipcacheIdentity(host32(aHealth4)) == identity.ReservedHealth && h.ipcacheIdentity(host32(aHealth6)) == identity.ReservedHealth
	})
	// One reserved set carries every node's addresses: the forged ones
	// were decided with a's.
	for _, ip := range forged {
		if id := h.ipcacheIdentity(host32(ip)); id == identity.ReservedHealth {
			t.Errorf("forged health address %s has identity health", ip)
		}
	}
	if id := h.ipcacheIdentity(host32(a("198.51.100.2"))); id != identity.ReservedRemoteNode {
		t.Errorf("b's node address: identity %d, want remote-node", id)
	}
	if got := h.sys.Counters().NodeHealthRefused["k8s"]; got != 3 {
		t.Errorf("refused health addresses counted %d, want 3 (once each)", got)
	}
	for _, n := range h.sys.Index.Nodes() {
		if n.Name == "a" && !slices.Equal(n.HealthIPs, []netip.Addr{aHealth4, aHealth6}) || n.Name != "a" && len(n.HealthIPs) > 0 {
			t.Errorf("node %s's row holds health addresses %v", n.Name, n.HealthIPs)
		}
	}
	// a's health endpoint gone from its record: its addresses lose the
	// identity (a's endpoint claim remains).
	nodes[0].HealthIPs = nil
	if err := h.sys.SyncNodes(ctx, "k8s", nodes); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "a's health addresses gone", func() bool {
		return h.ipcacheIdentity(host32(aHealth4)) == 70021 && h.ipcacheIdentity(host32(aHealth6)) == 0
	})
}
