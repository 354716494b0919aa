package datapath

import (
	"errors"
	"net/netip"
	"os"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// addPod6 wires an IPv6-only pod: a /128 without duplicate address
// detection, and a default route via the host veth's link-local address
// (the host answers neighbour solicitations only for its own addresses
// on that interface). The host netns must have accept_dad off.
func addPod6(t *testing.T, hostNL *netlink.Handle, id endpoint.ID, ident identity.NumericIdentity, ip string) *testPod {
	t.Helper()
	pod := testutil.NewNS(t, "mbt-pod6")
	if err := pod.Do(func() error { return os.WriteFile("/proc/sys/net/ipv6/conf/default/accept_dad", []byte("0"), 0) }); err != nil {
		t.Fatal(err)
	}
	host := podVeth(t, hostNL, pod)
	attrs := host.Attrs()
	addr := netip.MustParseAddr(ip)
	nl := pod.Netlink(t)
	eth0, err := nl.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(nl.AddrAdd(eth0, &netlink.Addr{IPNet: hostNet(addr), Flags: unix.IFA_F_NODAD}), nl.LinkSetUp(eth0)); err != nil {
		t.Fatalf("configure pod: %v", err)
	}
	// The host veth gets its link-local address once it has a carrier.
	ll := linkLocal(t, hostNL, host)
	if err := nl.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: ll.AsSlice()}); err != nil {
		t.Fatalf("pod default route via %s: %v", ll, err)
	}
	return &testPod{ns: pod, ep: &endpoint.Endpoint{ID: id, Identity: ident, IfName: attrs.Name, IfIndex: host.Attrs().Index, IPv6: addr}}
}

// linkLocal waits (bounded) for link's link-local address.
func linkLocal(t *testing.T, nl *netlink.Handle, link netlink.Link) netip.Addr {
	t.Helper()
	var ll netip.Addr
	testutil.Eventually(t, "a link-local address on "+link.Attrs().Name, func() bool {
		addrs, err := nl.AddrList(link, netlink.FAMILY_V6)
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); err == nil && ok && ip.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
				ll = ip
				return true
			}
		}
		return false
	})
	return ll
}

// TestBPFEndToEndIPv6: the endpoint programs enforce policy on IPv6 TCP
// between IPv6-only pods routed through the host (ipcache /128 entries,
// conntrack for replies, drop notifications with IPv6 addresses).
// Init turns IPv6 forwarding on (the gateway is IPv6); the pods here are
// wired by hand through the host veth's link-local address (the CNI
// plugin's path, through the gateway, is pkg/clients/cni's tests), so DAD
// is the test's to turn off.
func TestBPFEndToEndIPv6(t *testing.T) {
	testutil.RequireRoot(t)
	l, host, nl := newTestLinux(t, LinuxConfig{TeardownDelay: -1, GatewayDevice: "mbt_gw6",
		Gateways: []netip.Addr{netip.MustParseAddr("fd00:60::1")}})
	for _, kv := range [][2]string{{"default/accept_dad", "0"}} {
		if err := host.Do(func() error { return os.WriteFile("/proc/sys/net/ipv6/conf/"+kv[0], []byte(kv[1]), 0) }); err != nil {
			t.Fatal(err)
		}
	}
	e := &e2eEnv{t: t, l: l, host: host, nl: nl, drops: &dropLog{}}
	l.SetHooks(LinuxHooks{OnDrop: e.drops.add})
	a := addPod6(t, nl, 21, 2001, "fd00:60::11")
	b := addPod6(t, nl, 22, 2002, "fd00:60::12")
	c := addPod6(t, nl, 23, 2003, "fd00:60::13")
	for _, p := range []*testPod{a, b, c} {
		e.ipcache(p)
		e.realize(p)
	}
	b.listen(t, 8080)
	b.listen(t, 8081)
	e.mustTalk(a, b, 8080)
	e.mustTalk(c, b, 8081)

	b.ep.Policy = bOnly8080From(a.ep.Identity)
	e.realize(b)
	e.mustTalk(a, b, 8080)
	e.mustNotTalk(a, b, 8081)
	e.mustNotTalk(c, b, 8080)
	e.waitDrop(DropEvent{Endpoint: b.ep.ID, Reason: DropPolicy, Dir: policy.Ingress, Src: a.ep.IPv6, Dst: b.ep.IPv6,
		DstPort: 8081, Proto: policy.ProtoTCP, TCPFlags: tcpSYN, PeerIdentity: a.ep.Identity})
	e.waitDrop(DropEvent{Endpoint: b.ep.ID, Reason: DropPolicy, Dir: policy.Ingress, Src: c.ep.IPv6, Dst: b.ep.IPv6,
		DstPort: 8080, Proto: policy.ProtoTCP, TCPFlags: tcpSYN, PeerIdentity: c.ep.Identity})
	if n := e.dropCount(b.ep.ID, DropPolicy, policy.Ingress); n < 2 {
		t.Fatalf("B's ingress policy drops = %d, want at least 2", n)
	}
	b.ep.Policy = nil
	e.realize(b)
	e.mustTalk(c, b, 8080)
}
