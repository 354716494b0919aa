package multinode

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestTunnelDirect (issue 39): in tunnel mode a pod's connection to a
// pod on another node skips both nodes' IP stacks in both directions
// (from_container straight to the tunnel device, from_overlay straight
// to the endpoint's host veth: bpf/overlay.c, overlay_deliver), and
// what needs the stack still crosses it (testDirect).
func TestTunnelDirect(t *testing.T) {
	testDirect(t, newCluster(t, "tunnel", 2, 86))
}

// TestNativeDirect (issue 39): in native routing likewise, through the
// uplinks (from_container's bpf_redirect_neigh to the uplink,
// from_netdev's netdev_deliver to the endpoint's host veth; bpf/
// endpoint.c). With the kube-proxy replacement both share from_netdev
// on the uplink: datapath's TestNodePortRemote runs node A so.
func TestNativeDirect(t *testing.T) {
	testDirect(t, newCluster(t, "native", 2, 84))
}

// testDirect: on c's two nodes FORWARD drops TCP on the direct ports
// (directPorts) between the pods, and drops what netfilter's conntrack
// finds INVALID (kube-proxy's rule: a connection whose one direction
// skipped a node's stack and the other did not is INVALID there).
//   - direct: TCP a -> b and b -> a over IPv4 and IPv6 on the direct
//     ports: delivered (through the stacks, the FORWARD rule drops it,
//     as it did before direct delivery);
//   - icmp: ping a -> b and b -> a: ICMP crosses both stacks both
//     ways (the echo reply alone is INVALID to a node's conntrack);
//   - dnat-tcp, dnat-udp: a reaches b through a kube-proxy-shaped DNAT
//     on a's node (a Service address -> b): the replies must cross a's
//     stack to get the Service address back as their source; a reply
//     delivered straight to a from b's address is refused (TCP) or
//     never reaches the connected UDP socket.
func testDirect(t *testing.T, c *cluster) {
	waitRoutes(t, c.nodes...)
	a, b := c.nodes[0].addPod("direct-a"), c.nodes[1].addPod("direct-b")
	iptables := testutil.RequireTool(t, "iptables")
	ip6tables := testutil.RequireTool(t, "ip6tables")
	const directPorts = "7100,7101,7102,7103"
	for _, nd := range c.nodes {
		for _, r := range []struct {
			bin   string
			rules [][]string
		}{
			{iptables, [][]string{
				{"-A", "FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"},
				{"-A", "FORWARD", "-s", c.clusterCIDRv4(), "-d", c.clusterCIDRv4(), "-p", "tcp", "-m", "multiport", "--ports", directPorts, "-j", "DROP"},
			}},
			{ip6tables, [][]string{
				{"-A", "FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"},
				{"-A", "FORWARD", "-s", c.clusterCIDRv6(), "-d", c.clusterCIDRv6(), "-p", "tcp", "-m", "multiport", "--ports", directPorts, "-j", "DROP"},
			}},
		} {
			for _, rule := range r.rules {
				if out, err := nd.ns.Exec(r.bin, append([]string{"-w"}, rule...)...); err != nil {
					t.Fatalf("%s %v: %v: %s", r.bin, rule, err, out)
				}
			}
		}
	}
	t.Run("direct", func(t *testing.T) {
		for i, tc := range []struct {
			name     string
			from, to *pod
			v6       bool
		}{{"a->b v4", a, b, false}, {"b->a v4", b, a, false}, {"a->b v6", a, b, true}, {"b->a v6", b, a, true}} {
			to := tc.to.ip4
			if tc.v6 {
				to = tc.to.ip6
			}
			if err := echoTCP(tc.from, tc.to, to, 7100+i); err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
		}
	})
	t.Run("ttl", func(t *testing.T) {
		// a's UDP to b and b's answer cross two forwarding hops each,
		// whether the stack's or the direct path's: 64 arrives as 62.
		for _, v6 := range []bool{false, true} {
			if err := udpHops(a, b, v6, 7110); err != nil {
				t.Errorf("v6 %v: %v", v6, err)
			}
		}
	})
	t.Run("icmp", func(t *testing.T) {
		// ICMP never goes straight (overlay_deliver takes TCP and UDP
		// only), so neither does the request: a node's conntrack that
		// saw the echo reply alone finds it INVALID.
		for _, tc := range []struct {
			name     string
			from, to *pod
			v6       bool
		}{{"a->b v4", a, b, false}, {"b->a v4", b, a, false}, {"a->b v6", a, b, true}} {
			to, fam := tc.to.ip4, "-4"
			if tc.v6 {
				to, fam = tc.to.ip6, "-6"
			}
			if out, err := tc.from.ns.Exec("ping", fam, "-c", "2", "-i", "0.2", "-W", "2", to.String()); err != nil {
				t.Errorf("%s: %v: %s", tc.name, err, out)
			}
		}
	})
	svc := netip.AddrFrom4([4]byte{10, 96, byte(c.net), 10})
	for _, rule := range [][]string{
		{"-A", "PREROUTING", "-d", svc.String(), "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", b.ip4.String() + ":7200"},
		{"-A", "PREROUTING", "-d", svc.String(), "-p", "udp", "--dport", "53", "-j", "DNAT", "--to-destination", b.ip4.String() + ":7201"},
	} {
		if out, err := c.nodes[0].ns.Exec(iptables, append([]string{"-w", "-t", "nat"}, rule...)...); err != nil {
			t.Fatalf("iptables %v: %v: %s", rule, err, out)
		}
	}
	t.Run("dnat-tcp", func(t *testing.T) {
		if err := echoTCPVia(a, b, netip.AddrPortFrom(svc, 80), netip.AddrPortFrom(b.ip4, 7200)); err != nil {
			t.Error(err)
		}
	})
	t.Run("dnat-udp", func(t *testing.T) {
		if err := echoUDPVia(a, b, netip.AddrPortFrom(svc, 53), netip.AddrPortFrom(b.ip4, 7201)); err != nil {
			t.Error(err)
		}
	})
}

func (c *cluster) clusterCIDRv4() string { return fmt.Sprintf("10.%d.0.0/16", c.net) }
func (c *cluster) clusterCIDRv6() string { return fmt.Sprintf("fd91:%d::/32", c.net) }

// echoTCP has from connect to addr:port, on which to listens, and
// exchange a few messages.
func echoTCP(from, to *pod, addr netip.Addr, port int) error {
	ap := netip.AddrPortFrom(addr, uint16(port))
	return echoTCPVia(from, to, ap, ap)
}

// echoTCPVia has to listen on listen and from connect to dst (listen,
// or an address translated to it) and exchange a few messages, each
// echoed.
func echoTCPVia(from, to *pod, dst, listen netip.AddrPort) error {
	var ln net.Listener
	if err := to.ns.Do(func() (err error) { ln, err = net.Listen("tcp", listen.String()); return }); err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	var conn net.Conn
	if err := from.ns.Do(func() (err error) { conn, err = net.DialTimeout("tcp", dst.String(), 5*time.Second); return }); err != nil {
		return fmt.Errorf("connect %s: %w", dst, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64<<10)
	for i := range 20 {
		msg := buf[:1+i*3000]
		for j := range msg {
			msg[j] = byte(i + j)
		}
		if _, err := conn.Write(msg); err != nil {
			return fmt.Errorf("write %d: %w", i, err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(conn, got); err != nil {
			return fmt.Errorf("read %d: %w", i, err)
		}
		if string(got) != string(msg) {
			return fmt.Errorf("message %d came back changed", i)
		}
	}
	return nil
}

// echoUDPVia has to echo UDP on listen and from send to dst from a
// connected socket (which takes answers from dst only), a few times.
func echoUDPVia(from, to *pod, dst, listen netip.AddrPort) error {
	var pc net.PacketConn
	if err := to.ns.Do(func() (err error) { pc, err = net.ListenPacket("udp", listen.String()); return }); err != nil {
		return err
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, src, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], src)
		}
	}()
	var conn net.Conn
	if err := from.ns.Do(func() (err error) { conn, err = net.Dial("udp", dst.String()); return }); err != nil {
		return err
	}
	defer conn.Close()
	buf := make([]byte, 2048)
	for i := range 5 {
		msg := fmt.Sprintf("ping %d", i)
		if _, err := conn.Write([]byte(msg)); err != nil {
			return err
		}
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, err := conn.Read(buf)
		if err != nil {
			return fmt.Errorf("answer %d from %s: %w", i, dst, err)
		}
		if string(buf[:n]) != msg {
			return fmt.Errorf("answer %d: %q", i, buf[:n])
		}
	}
	return nil
}

// udpHops has from send a UDP datagram (TTL, hop limit 64) to to's port
// and to answer it, and checks that both arrive with 62: two hops each
// way, each decrementing once.
func udpHops(from, to *pod, v6 bool, port int) error {
	addr, faddr := to.ip4, from.ip4
	if v6 {
		addr, faddr = to.ip6, from.ip6
	}
	listen := func(p *pod, a netip.Addr, port int) (*net.UDPConn, error) {
		var c *net.UDPConn
		err := p.ns.Do(func() (err error) {
			c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, uint16(port))))
			if err != nil {
				return err
			}
			raw, err := c.SyscallConn()
			if err != nil {
				return err
			}
			var serr error
			if err := raw.Control(func(fd uintptr) {
				if v6 {
					serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, 64)
					if serr == nil {
						serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVHOPLIMIT, 1)
					}
					return
				}
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TTL, 64)
				if serr == nil {
					serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTTL, 1)
				}
			}); err != nil {
				return err
			}
			return serr
		})
		return c, err
	}
	// recv reads one datagram and its TTL (hop limit).
	recv := func(c *net.UDPConn) (netip.AddrPort, int, error) {
		buf, oob := make([]byte, 64), make([]byte, 128)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, oobn, _, src, err := c.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			return src, 0, err
		}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return src, 0, err
		}
		for _, m := range msgs {
			if (m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_TTL) ||
				(m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_HOPLIMIT) {
				return src, int(m.Data[0]), nil
			}
		}
		return src, 0, fmt.Errorf("no TTL with the datagram")
	}
	srv, err := listen(to, addr, port)
	if err != nil {
		return err
	}
	defer srv.Close()
	cli, err := listen(from, faddr, 0)
	if err != nil {
		return err
	}
	defer cli.Close()
	if _, err := cli.WriteToUDPAddrPort([]byte("hops"), netip.AddrPortFrom(addr, uint16(port))); err != nil {
		return err
	}
	src, ttl, err := recv(srv)
	if err != nil || ttl != 62 {
		return fmt.Errorf("request arrived with TTL %d (%v), want 62", ttl, err)
	}
	if _, err := srv.WriteToUDPAddrPort([]byte("back"), src); err != nil {
		return err
	}
	if _, ttl, err = recv(cli); err != nil || ttl != 62 {
		return fmt.Errorf("answer arrived with TTL %d (%v), want 62", ttl, err)
	}
	return nil
}
