package multinode

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// far is an outside address beyond the underlay subnet (TEST-NET-2 and
// the documentation range), held by the outside host and reached through
// the nodes' default routes, as the internet is from a cloud VM.
var far = [2]netip.Addr{netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("2001:db8:77::7")}

// TestDefaults runs two kvstore-mode nodes per routing mode with the
// agent's defaults only (no --masquerade, --cluster-cidr or
// --kvstore-node-addrs), each node netns with default routes to the
// outside host, as a VM's:
//   - node addresses: each agent publishes its default route device's
//     IPv4 and IPv6 address (other nodes list it and route or tunnel to
//     it; native routing needs both families);
//   - masquerade on by default: a pod reaches an address outside the
//     cluster (through the default route) with its node's address as the
//     source, both families;
//   - pod to pod across nodes is not masqueraded: the peer sees the
//     other pod's own address, both families.
func TestDefaults(t *testing.T) {
	for i, mode := range []string{"native", "tunnel"} {
		t.Run(mode, func(t *testing.T) {
			c := newKvClusterWith(t, mode, 2, 87+i, defaultRoutes)
			a, b := c.nodes[0], c.nodes[1]
			t.Run("node-addresses", func(t *testing.T) {
				waitRoutes(t, a, b)
				for _, nd := range c.nodes {
					testutil.EventuallyErr(t, nd.name+" lists the other node's derived addresses", func() error { return derivedAddrsListed(nd, c.nodes) })
				}
			})
			pa, pb := a.addPod("a1"), b.addPod("b1")
			t.Run("pod-to-pod-not-masqueraded", func(t *testing.T) {
				for _, pair := range [][2]*pod{{pa, pb}, {pb, pa}} {
					from, to := pair[0], pair[1]
					for k, dst := range []netip.Addr{to.ip4, to.ip6} {
						want := []netip.Addr{from.ip4, from.ip6}[k]
						if got := peerSeen(t, from.ns, to.ns, dst); got != want {
							t.Fatalf("%s -> %s (%s): the peer saw %s, want the pod's own %s", from.name, to.name, dst, got, want)
						}
					}
				}
			})
			t.Run("outside-masqueraded", func(t *testing.T) {
				for _, x := range []struct {
					p  *pod
					nd *node
				}{{pa, a}, {pb, b}} {
					for k, dst := range far {
						want := []netip.Addr{x.nd.addr4, x.nd.addr6}[k]
						if got := peerSeen(t, x.p.ns, c.outside, dst); got != want {
							t.Fatalf("%s -> outside %s: the peer saw %s, want node %s's %s", x.p.name, dst, got, x.nd.name, want)
						}
					}
				}
			})
		})
	}
}

// defaultRoutes gives the outside host the far addresses and every node
// default routes (both families) via the outside host.
func defaultRoutes(c *cluster) {
	t := c.t
	onl := c.outside.Netlink(t)
	eth, err := onl.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range far {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}}
		if a.Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := onl.AddrAdd(eth, addr); err != nil {
			t.Fatalf("outside address %s: %v", a, err)
		}
	}
	gw4, gw6 := c.underlayAddrs(199)
	for _, nd := range c.nodes {
		l, err := nd.nl.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		for _, gw := range []netip.Addr{gw4, gw6} {
			r := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()}
			if gw.Is6() {
				r.Dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
			}
			if err := nd.nl.RouteAdd(r); err != nil {
				t.Fatalf("%s: default route via %s: %v", nd.name, gw, err)
			}
		}
	}
}

// derivedAddrsListed: nd lists every other node of all from the kvstore
// with exactly its underlay addresses (which no flag gave).
func derivedAddrsListed(nd *node, all []*node) error {
	ns, err := nd.api.Nodes(context.Background())
	if err != nil {
		return err
	}
	for _, o := range all {
		if o == nd {
			continue
		}
		want := []string{o.addr4.String(), o.addr6.String()}
		if !slices.ContainsFunc(ns, func(n models.Node) bool {
			return n.Name == o.name && n.Source == "kvstore" && n.Active && slices.Equal(n.Addresses, want)
		}) {
			return fmt.Errorf("%s not listed from the kvstore with addresses %v: %s", o.name, want, jsonString(ns))
		}
	}
	return nil
}

// peerSeen connects from the netns from to a TCP server at dst in the
// netns at, exchanges a line and returns the source address the server
// saw.
func peerSeen(t *testing.T, from, at *testutil.NS, dst netip.Addr) netip.Addr {
	t.Helper()
	port := int(nextPort.Add(1))
	var ln net.Listener
	if err := at.Do(func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(dst.String(), fmt.Sprint(port)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer := make(chan string, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			peer <- err.Error()
			return
		}
		peer <- conn.RemoteAddr().String()
		_, _ = io.Copy(conn, conn)
		conn.Close()
	}()
	if err := testutil.Exchange(from, dst, port, 10*time.Second); err != nil {
		t.Fatalf("TCP to %s: %v", dst, err)
	}
	got := <-peer
	host, _, err := net.SplitHostPort(got)
	if err != nil {
		t.Fatalf("accept: %s", got)
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		t.Fatalf("peer %s: %v", got, err)
	}
	return a.Unmap()
}
