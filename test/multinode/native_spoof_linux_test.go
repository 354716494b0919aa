package multinode

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestNativeDirectSpoofedSource (issue 39): native routing's direct
// delivery from the uplink (bpf/endpoint.c, netdev_deliver) takes a
// packet's source address as the stack does, so a source the stack's
// reverse-path filter refuses must not reach a pod past it. Node A's
// operator filters the uplink's reverse path: rp_filter 1 on eth0 for
// IPv4, ip6tables' rpfilter match in raw PREROUTING for IPv6. A target
// pod on A opens UDP flows (from its port replyPort) to its friend on A
// and to a pod on B; a host on the underlay then sends each a forged
// "reply" (a raw frame to A's uplink):
//   - from the friend's address: its route is the friend's host veth,
//     not the uplink, so the stack drops it, and it must never reach
//     the target (which would take it for the friend's, a conntrack
//     reply of its own flow; that is what it did before the
//     reverse-path check, in netdev_deliver, delivered straight);
//   - control: from the remote pod's address, routed back through the
//     uplink: delivered, as the stack would (native routing trusts the
//     underlay for other nodes' pods' addresses).
func TestNativeDirectSpoofedSource(t *testing.T) {
	c := newCluster(t, "native", 2, 85)
	a, b := c.nodes[0], c.nodes[1]
	waitRoutes(t, a, b)
	target, friend, remote := a.addPod("target"), a.addPod("friend"), b.addPod("remote")
	ip6tables := testutil.RequireTool(t, "ip6tables")
	if out, err := a.ns.Exec("sysctl", "-w", "net.ipv4.conf.eth0.rp_filter=1"); err != nil {
		t.Fatalf("rp_filter: %v: %s", err, out)
	}
	if out, err := a.ns.Exec(ip6tables, "-w", "-t", "raw", "-A", "PREROUTING", "-i", "eth0", "-m", "rpfilter", "--invert", "-j", "DROP"); err != nil {
		t.Fatalf("ip6tables rpfilter: %v: %s", err, out)
	}
	const replyPort, peerPort = 9300, 40000
	s, conn := udpSink(t, target, replyPort)
	ulMAC := linkMAC(t, a.ns, "eth0")
	outMAC := linkMAC(t, c.outside, "eth0")
	for _, v6 := range []bool{false, true} {
		fam := map[bool]string{false: "ipv4", true: "ipv6"}[v6]
		pick := func(p *pod) netip.Addr { return map[bool]netip.Addr{false: p.ip4, true: p.ip6}[v6] }
		dst := pick(target)
		for _, tc := range []struct {
			name    string
			src     netip.Addr
			arrives bool
		}{{"local-pod-source", pick(friend), false}, {"remote-pod-source", pick(remote), true}} {
			t.Run(tc.name+"-"+fam, func(t *testing.T) {
				// The target's own flow, whose "reply" is forged.
				if _, err := conn.WriteToUDPAddrPort([]byte("open"), netip.AddrPortFrom(tc.src, peerPort)); err != nil {
					t.Fatal(err)
				}
				payload := fmt.Sprintf("forged-%s-%s", tc.name, fam)
				etype := uint16(testutil.EtherTypeIPv4)
				if v6 {
					etype = testutil.EtherTypeIPv6
				}
				frame := testutil.Frame(ulMAC, outMAC, nil, etype, testutil.UDPPacket(tc.src, dst, peerPort, replyPort, []byte(payload)))
				if tc.arrives {
					testutil.EventuallyErr(t, payload+" at the target", func() error {
						if err := testutil.SendFrame(c.outside, "eth0", frame); err != nil {
							t.Fatal(err)
						}
						return s.has(payload)
					})
					return
				}
				for range 5 {
					if err := testutil.SendFrame(c.outside, "eth0", frame); err != nil {
						t.Fatal(err)
					}
					time.Sleep(100 * time.Millisecond)
				}
				// What came after the forged frames arrives; they not.
				control := "control-" + payload
				if err := friend.ns.Do(func() error {
					c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, replyPort)))
					if err != nil {
						return err
					}
					defer c.Close()
					_, err = c.Write([]byte(control))
					return err
				}); err != nil {
					t.Fatal(err)
				}
				testutil.EventuallyErr(t, control+" at the target", func() error { return s.has(control) })
				if s.has(payload) == nil {
					t.Fatalf("forged %q from %s (a pod of the target's node) delivered from the uplink", payload, tc.src)
				}
			})
		}
	}
}

// udpSink is listenSink that also returns the socket (bound to port on
// every address of p), which p sends from.
func udpSink(t *testing.T, p *pod, port int) (*sink, *net.UDPConn) {
	t.Helper()
	s := &sink{}
	var conn *net.UDPConn
	if err := p.ns.Do(func() (err error) {
		conn, err = net.ListenUDP("udp", &net.UDPAddr{Port: port})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.got = append(s.got, string(buf[:n]))
			s.mu.Unlock()
		}
	}()
	return s, conn
}

// linkMAC is the MAC address of ns's device name.
func linkMAC(t *testing.T, ns *testutil.NS, name string) net.HardwareAddr {
	t.Helper()
	l, err := ns.Netlink(t).LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().HardwareAddr
}
