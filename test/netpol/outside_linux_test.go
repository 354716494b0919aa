package netpol

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// outside is a netns behind the world's node, on a veth whose node end
// holds gw (a /24) and whose far end holds addrs (the same /24), routing
// the node's pod range back through the node: addresses that are no
// pod's (a Service's external backends, another node, an API server).
type outside struct {
	*testutil.NS
	Addrs []netip.Addr
}

func newOutside(t *testing.T, w *world, gw string, addrs ...string) *outside {
	t.Helper()
	o := &outside{NS: testutil.NewNS(t, "mbt-out")}
	h, err := o.Handle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	nl, onl := w.node.NS.Netlink(t), o.Netlink(t)
	name := "mbtout" + testutil.RandomSuffix(4)
	if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(h))}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nl.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}}) })
	setup := func(h *netlink.Handle, link string, addrs ...string) {
		l, err := h.LinkByName(link)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			addr, err := netlink.ParseAddr(a + "/24")
			if err != nil {
				t.Fatal(err)
			}
			addr.Flags = unix.IFA_F_NODAD
			if err := h.AddrAdd(l, addr); err != nil {
				t.Fatalf("address %s on %s: %v", a, link, err)
			}
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	setup(nl, name, gw)
	setup(onl, "eth0", addrs...)
	lo, _ := onl.LinkByName("lo")
	_ = onl.LinkSetUp(lo)
	r := w.node.IPv4Range.Masked()
	if err := onl.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: r.Addr().AsSlice(), Mask: net.CIDRMask(r.Bits(), 32)}, Gw: net.ParseIP(gw)}); err != nil {
		t.Fatalf("route %s via %s outside: %v", r, gw, err)
	}
	for _, a := range addrs {
		o.Addrs = append(o.Addrs, netip.MustParseAddr(a))
	}
	return o
}
