package datapath

import (
	"context"
	"maps"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// tunnelNode is one node of the tunnel test: a Linux datapath in its own
// host netns, its underlay address on a veth to the other node.
type tunnelNode struct {
	l    *Linux
	host *testutil.NS
	nl   *netlink.Handle
	addr netip.Addr
}

// underlayPair connects two host netns with a veth, x.1/24 and x.2/24.
func underlayPair(t *testing.T, a, b *tunnelNode) {
	t.Helper()
	hb, err := b.host.Handle()
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Close()
	attrs := netlink.NewLinkAttrs()
	attrs.Name = "ul0"
	if err := a.nl.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "ul0", PeerNamespace: netlink.NsFd(int(hb))}); err != nil {
		t.Fatalf("underlay veth: %v", err)
	}
	for _, n := range []*tunnelNode{a, b} {
		l, err := n.nl.LinkByName("ul0")
		if err != nil {
			t.Fatal(err)
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: n.addr.AsSlice(), Mask: net.CIDRMask(24, 32)}}
		if n.addr.Is6() {
			addr.IPNet.Mask, addr.Flags = net.CIDRMask(64, 128), unix.IFA_F_NODAD
		}
		if err := n.nl.AddrAdd(l, addr); err != nil {
			t.Fatal(err)
		}
		if err := n.nl.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTunnelIdentity: in tunnel mode the receiving node's policy decides
// on the identity the sending node put in the VNI, not on the source
// address: B admits A's pod on 8080 from identity 2001 only. B's ipcache
// maps the pod's address to another identity, and later to 2001 while A
// sends 2005: the first is admitted, the second dropped. A's ipcache
// entry for B's pod carries B as tunnel endpoint, which wins over the
// (wrong) node address in A's tunnel map. Over an IPv4 and an IPv6
// underlay.
func TestTunnelIdentity(t *testing.T) {
	for _, underlay := range []string{"ipv4", "ipv6"} {
		t.Run(underlay+"-underlay", func(t *testing.T) { testTunnelIdentity(t, underlay == "ipv6") })
	}
}

func testTunnelIdentity(t *testing.T, v6 bool) {
	cfg := LinuxConfig{Nodes: NodesConfig{Routing: RoutingTunnel}, Gateways: []netip.Addr{e2eGateway}, GatewayDevice: "mbt_gw", TeardownDelay: -1}
	var nodes [2]*tunnelNode
	for i := range nodes {
		l, host, nl := newTestLinux(t, cfg)
		addr := netip.AddrFrom4([4]byte{192, 168, 90, byte(i + 1)})
		if v6 {
			addr = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(i + 1)})
		}
		nodes[i] = &tunnelNode{l: l, host: host, nl: nl, addr: addr}
	}
	a, b := nodes[0], nodes[1]
	underlayPair(t, a, b)
	ctx := context.Background()
	cidrA, cidrB := netip.MustParsePrefix("10.244.60.0/25"), netip.MustParsePrefix("10.244.60.128/25")
	// A's tunnel map points B's CIDR at an address nobody has (node c):
	// only the ipcache's tunnel endpoint for B's pod gets its traffic
	// there. A knows B as a node (without pod CIDRs): its overlay takes
	// packets only from known nodes, and B's pod's replies as B's
	// because A's ipcache places the pod there.
	nowhere := netip.MustParseAddr("192.168.90.99")
	if v6 {
		nowhere = netip.MustParseAddr("2001:db8::99")
	}
	if err := a.l.SyncNodes(ctx, []RemoteNode{{Name: "b", Addrs: []netip.Addr{b.addr}},
		{Name: "c", Addrs: []netip.Addr{nowhere}, PodCIDRs: []netip.Prefix{cidrB}}}); err != nil {
		t.Fatal(err)
	}
	if err := b.l.SyncNodes(ctx, []RemoteNode{{Name: "a", Addrs: []netip.Addr{a.addr}, PodCIDRs: []netip.Prefix{cidrA}}}); err != nil {
		t.Fatal(err)
	}
	podA := addPod(t, a.nl, 21, 2001, "10.244.60.11")
	podB := addPod(t, b.nl, 22, 2002, "10.244.60.130")
	upsert := func(n *tunnelNode, ip netip.Addr, id identity.NumericIdentity, tunnel netip.Addr) {
		t.Helper()
		if err := n.l.UpsertIPCache(ctx, netip.PrefixFrom(ip, 32), id, tunnel); err != nil {
			t.Fatal(err)
		}
	}
	upsert(a, podA.addr(), 2001, netip.Addr{})
	upsert(a, podB.addr(), 2002, b.addr)
	upsert(b, podB.addr(), 2002, netip.Addr{})
	upsert(b, podA.addr(), 3003, a.addr) // B's ipcache is wrong about A's pod
	podB.ep.Policy = policy.NewMapState(2, true, false, []policy.Key{{Identity: 2001, Port: 8080, Proto: policy.ProtoTCP, Dir: policy.Ingress}})
	for _, x := range []struct {
		n *tunnelNode
		p *testPod
	}{{a, podA}, {b, podB}} {
		if _, err := x.n.l.Realize(ctx, x.p.ep, 1); err != nil {
			t.Fatal(err)
		}
	}
	podB.listen(t, 8080)
	if err := podA.talk(podB, 8080, connectTimeout); err != nil {
		t.Fatalf("A (identity 2001 in the VNI) -> B:8080: %v, want admitted whatever B's ipcache says", err)
	}
	before := dropsOf(t, b.l, 22)
	upsert(a, podA.addr(), 2005, netip.Addr{}) // A now sends 2005 ...
	upsert(b, podA.addr(), 2001, a.addr)       // ... while B's ipcache says 2001
	if err := podA.talk(podB, 8080, dropTimeout); err == nil {
		t.Fatal("A (identity 2005 in the VNI) -> B:8080 connected, want dropped")
	}
	if after := dropsOf(t, b.l, 22); after <= before {
		t.Fatalf("B's policy drops %d -> %d, want more", before, after)
	}
	// The device is what SyncNodes made: external-mode VXLAN, NOARP.
	l, err := b.nl.LinkByName(DefaultTunnelDevice)
	if err != nil {
		t.Fatal(err)
	}
	if vx, ok := l.(*netlink.Vxlan); !ok || !vx.FlowBased || l.Attrs().RawFlags&unix.IFF_NOARP == 0 {
		t.Fatalf("tunnel device %T %+v: want an external-mode NOARP vxlan", l, l.Attrs())
	}
}

func dropsOf(t *testing.T, l *Linux, id uint16) uint64 {
	t.Helper()
	c, err := l.DropCounters(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for k, v := range c {
		if uint16(k.Endpoint) == id && k.Dir == policy.Ingress && k.Reason == DropPolicy {
			n += v.Packets
		}
	}
	return n
}

// TestNodeRoutesNativeAfterTunnel: a tunnel-mode datapath routes remote
// pod CIDRs into its VXLAN device; a native-mode one started on the same
// host netns and bpffs (an agent restarted with --routing native)
// replaces those routes with routes via the nodes and removes the device;
// an empty set removes every node route. Nodes without an address or a
// pod CIDR get no route. The endpoint programs drop pods' UDP to the
// tunnel port in tunnel mode only, and from_overlay knows the nodes with
// an address.
func TestNodeRoutesNativeAfterTunnel(t *testing.T) {
	cfg := LinuxConfig{Nodes: NodesConfig{Routing: RoutingTunnel}, Gateways: []netip.Addr{e2eGateway}, GatewayDevice: "mbt_gw", TeardownDelay: -1}
	l, host, nl := newTestLinux(t, cfg)
	ctx := context.Background()
	ul := netlink.NewLinkAttrs()
	ul.Name = "ul0"
	if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: ul, PeerName: "ul1"}); err != nil {
		t.Fatal(err)
	}
	peer, _ := nl.LinkByName("ul1")
	if err := nl.LinkSetUp(peer); err != nil {
		t.Fatal(err)
	}
	under, _ := nl.LinkByName("ul0")
	if err := nl.AddrAdd(under, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(192, 168, 91, 1), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkSetUp(under); err != nil {
		t.Fatal(err)
	}
	nodes := []RemoteNode{{Name: "b", Addrs: []netip.Addr{netip.MustParseAddr("192.168.91.2")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.61.0/24")}},
		{Name: "c"}, // no podCIDR yet
		{Name: "d", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.62.0/24")}}} // no address yet: not routed
	if err := l.SyncNodes(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	vx, err := nl.LinkByName(DefaultTunnelDevice)
	if err != nil {
		t.Fatal(err)
	}
	routes := func() []netlink.Route {
		rs, err := nl.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: nodeRouteProto}, netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	if rs := routes(); len(rs) != 1 || rs[0].LinkIndex != vx.Attrs().Index || rs[0].Gw != nil {
		t.Fatalf("tunnel mode routes %v, want one into %s", rs, DefaultTunnelDevice)
	}
	if p := tunnelPortOf(t, l); p != 8472 {
		t.Fatalf("tunnel mode: the endpoint programs' tunnel port is %d, want 8472", p)
	}
	want := map[bpf.OverlayTunnelEndpoint]bpf.OverlayTunnelValue{}
	b := overlayEndpoint(netip.MustParseAddr("192.168.91.2"))
	want[b] = bpf.OverlayTunnelValue{Node: b}
	if got := dumpMap[bpf.OverlayTunnelEndpoint, bpf.OverlayTunnelValue](t, l.nodes.tunnelNodes); !maps.Equal(got, want) {
		t.Fatalf("tunnel_nodes %+v, want only b's address", got)
	}
	_ = l.Close()
	cfg.HostNetns, cfg.BPFFS, cfg.Nodes.Routing = host.Path, l.cfg.BPFFS, RoutingNative
	n, err := NewLinux(cfg, l.log)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Init(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	if err := n.SyncNodes(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	if rs := routes(); len(rs) != 1 || !rs[0].Gw.Equal(net.IPv4(192, 168, 91, 2)) {
		t.Fatalf("native mode routes %v, want one via 192.168.91.2", rs)
	}
	if _, err := nl.LinkByName(DefaultTunnelDevice); !isLinkNotFound(err) {
		t.Fatalf("tunnel device after native sync: %v, want gone", err)
	}
	if p := tunnelPortOf(t, n); p != 0 {
		t.Fatalf("native mode: the endpoint programs' tunnel port is %d, want 0 (pods may use it)", p)
	}
	if err := n.SyncNodes(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if rs := routes(); len(rs) != 0 {
		t.Fatalf("routes after an empty set: %v", rs)
	}
}

// tunnelPortOf is the tunnel port l's endpoint programs drop pods' UDP
// to (node_config).
func tunnelPortOf(t *testing.T, l *Linux) uint32 {
	t.Helper()
	var v bpf.EndpointNodeConfigValue
	if err := l.bpf.maps.config.Lookup(uint32(0), &v); err != nil {
		t.Fatal(err)
	}
	return v.TunnelPort
}

// dumpMap reads every entry of m.
func dumpMap[K comparable, V any](t *testing.T, m *ebpf.Map) map[K]V {
	t.Helper()
	out := map[K]V{}
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		out[k] = v
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestNativeRoutingIdentity: with native routing the receiving node's
// policy decides on its ipcache's identity for the source address (a
// remote endpoint's entry): B admits A's pod on 8080 from identity 2001
// while its ipcache maps the pod's address to 2001, and drops it once
// the entry says 2005, whatever A's own ipcache says.
func TestNativeRoutingIdentity(t *testing.T) {
	cfg := LinuxConfig{Nodes: NodesConfig{Routing: RoutingNative}, Gateways: []netip.Addr{e2eGateway}, GatewayDevice: "mbt_gw", TeardownDelay: -1}
	var nodes [2]*tunnelNode
	for i := range nodes {
		l, host, nl := newTestLinux(t, cfg)
		nodes[i] = &tunnelNode{l: l, host: host, nl: nl, addr: netip.AddrFrom4([4]byte{192, 168, 92, byte(i + 1)})}
	}
	a, b := nodes[0], nodes[1]
	underlayPair(t, a, b)
	ctx := context.Background()
	cidrA, cidrB := netip.MustParsePrefix("10.244.60.0/25"), netip.MustParsePrefix("10.244.60.128/25")
	if err := a.l.SyncNodes(ctx, []RemoteNode{{Name: "b", Addrs: []netip.Addr{b.addr}, PodCIDRs: []netip.Prefix{cidrB}}}); err != nil {
		t.Fatal(err)
	}
	if err := b.l.SyncNodes(ctx, []RemoteNode{{Name: "a", Addrs: []netip.Addr{a.addr}, PodCIDRs: []netip.Prefix{cidrA}}}); err != nil {
		t.Fatal(err)
	}
	podA := addPod(t, a.nl, 31, 2001, "10.244.60.11")
	podB := addPod(t, b.nl, 32, 2002, "10.244.60.130")
	upsert := func(n *tunnelNode, ip netip.Addr, id identity.NumericIdentity) {
		t.Helper()
		if err := n.l.UpsertIPCache(ctx, netip.PrefixFrom(ip, 32), id, netip.Addr{}); err != nil {
			t.Fatal(err)
		}
	}
	upsert(a, podA.addr(), 2001)
	upsert(b, podB.addr(), 2002)
	upsert(b, podA.addr(), 2001) // a remote endpoint in B's ipcache
	podB.ep.Policy = policy.NewMapState(2, true, false, []policy.Key{{Identity: 2001, Port: 8080, Proto: policy.ProtoTCP, Dir: policy.Ingress}})
	for _, x := range []struct {
		n *tunnelNode
		p *testPod
	}{{a, podA}, {b, podB}} {
		if _, err := x.n.l.Realize(ctx, x.p.ep, 1); err != nil {
			t.Fatal(err)
		}
	}
	podB.listen(t, 8080)
	if err := podA.talk(podB, 8080, connectTimeout); err != nil {
		t.Fatalf("A -> B:8080 with B's ipcache saying 2001: %v, want admitted", err)
	}
	upsert(b, podA.addr(), 2005)
	if err := podA.talk(podB, 8080, dropTimeout); err == nil {
		t.Fatal("A -> B:8080 with B's ipcache saying 2005 connected, want dropped")
	}
	if _, err := b.nl.LinkByName(DefaultTunnelDevice); !isLinkNotFound(err) {
		t.Fatalf("native routing made a tunnel device: %v", err)
	}
}
