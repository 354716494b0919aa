package datapath_test

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

// TestPodRouteMTU is issue #35's route MTU: every route the plugin
// installs in a pod (the link route to the gateway and the default
// route, both families) carries an MTU; in tunnel mode it leaves room
// for the encapsulation (the tunnel device's MTU, when below the veth's),
// in native routing it is the veth's. The veth keeps the conflist's MTU.
// The pod's own stack must agree: a connected UDP socket to a remote
// address reports the route's MTU (IP_MTU / IPV6_MTU).
func TestPodRouteMTU(t *testing.T) {
	for _, tc := range []struct {
		name               string
		routing            string
		tunnelMTU, cniMTU  int
		wantRoute, wantDev int
	}{
		{"tunnel default leaves room for VXLAN", datapath.RoutingTunnel, 0, 1500, 1450, 1500},
		{"tunnel with a smaller tunnel MTU", datapath.RoutingTunnel, 1300, 1400, 1300, 1400},
		{"tunnel with a conflist MTU below the tunnel's", datapath.RoutingTunnel, 0, 1400, 1400, 1400},
		{"native routing uses the veth's", datapath.RoutingNative, 0, 1500, 1500, 1500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := nodeharness.New(t, nodeharness.Options{Prefix: "mbt-mtu", IPv4Range: "10.236.0.0/24", IPv6Range: "fd00:236::/120", MTU: tc.cniMTU})
			startAgent(e, func(c *agent.Config) {
				c.Linux.Nodes.Routing, c.Linux.Nodes.TunnelMTU = tc.routing, tc.tunnelMTU
			})
			p := e.NewPod("mtu")
			res := e.MustAdd(p)
			v4, v6 := nodeharness.Addrs(res)
			for _, r := range res.Routes {
				if r.MTU != tc.wantRoute {
					t.Errorf("CNI result route %s: mtu %d, want %d", r, r.MTU, tc.wantRoute)
				}
			}
			h := p.NS.Netlink(t)
			link, err := h.LinkByName(p.RT.IfName)
			if err != nil {
				t.Fatal(err)
			}
			if got := link.Attrs().MTU; got != tc.wantDev {
				t.Errorf("%s MTU %d, want the conflist's %d", p.RT.IfName, got, tc.wantDev)
			}
			for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
				routes, err := h.RouteList(link, fam)
				if err != nil {
					t.Fatal(err)
				}
				var gws []net.IP
				for _, r := range routes {
					if r.Gw != nil {
						gws = append(gws, r.Gw)
					}
				}
				var n int
				for _, r := range routes {
					if r.Gw == nil && (r.Dst == nil || !slices.ContainsFunc(gws, r.Dst.IP.Equal)) {
						continue // the kernel's own (the address's, fe80::/64)
					}
					n++
					if r.MTU != tc.wantRoute {
						t.Errorf("route %s in the pod: mtu %d, want %d", r, r.MTU, tc.wantRoute)
					}
				}
				if n != 2 {
					t.Errorf("family %d: %d routes of the plugin in the pod (%v), want the gateway's and the default", fam, n, routes)
				}
			}
			for _, dst := range []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")} {
				if got := socketMTU(t, p, dst); got != tc.wantRoute {
					t.Errorf("a pod socket to %s (from %s/%s) sees MTU %d, want %d", dst, v4, v6, got, tc.wantRoute)
				}
			}
		})
	}
}

// socketMTU is the path MTU the pod's stack gives a connected UDP socket
// to dst (IP_MTU, IPV6_MTU).
func socketMTU(t *testing.T, p *nodeharness.Pod, dst netip.Addr) int {
	t.Helper()
	var mtu int
	err := p.NS.Do(func() error {
		c, err := net.Dial("udp", netip.AddrPortFrom(dst, 9).String())
		if err != nil {
			return err
		}
		defer c.Close()
		return sockMTU(c.(*net.UDPConn), dst.Is6(), &mtu)
	})
	if err != nil && !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("socket MTU to %s: %v", dst, err)
	}
	return mtu
}

// sockMTU reads a connected socket's path MTU into mtu.
func sockMTU(c syscall.Conn, v6 bool, mtu *int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		if v6 {
			*mtu, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU)
		} else {
			*mtu, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU)
		}
	}); err != nil {
		return err
	}
	return serr
}
