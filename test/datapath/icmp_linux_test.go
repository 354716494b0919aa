package datapath_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/domain/service"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/policyscenario"
)

// cnpClientFromOther enforces app=client's ingress, allowing only
// app=other: an ICMP error from the node (host) passes only as related.
const cnpClientFromOther = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: client-from-other
  namespace: default
spec:
  endpointSelector:
    matchLabels:
      app: client
  ingress:
  - fromEndpoints:
    - matchLabels:
        k8s:app: other
`

// farLinkMTU is the MTU between the node and the backends' netns: below
// the pods' 1400, so the node (the router on the path) answers a pod's
// full-size datagram with "fragmentation needed" / "packet too big".
const farLinkMTU = 1280

// TestServiceICMPErrors is issue #35's ICMP item: ICMP errors about a
// pod's Service flow quote the packet as translated (to the backend);
// the pod must get them with the frontend quoted (and as the error's
// source when the backend itself sent it), or its stack finds no socket
// and path MTU discovery through a Service breaks. The backends sit in
// a netns behind a 1280-byte link, so the node, routing the pod's
// 1378-byte datagram with DF set, sends the error as any router would.
// Checked on the pod's own socket (IP_RECVERR / IPV6_RECVERR and IP_MTU /
// IPV6_MTU), over IPv4 and IPv6, without policy and with the pod's
// ingress enforced (the error is related to the pod's connection).
func TestServiceICMPErrors(t *testing.T) {
	e := newEnvStack(t, "10.237.0.0/24", "fd00:237::/120")
	startAgent(e, nil)
	c := e.Client()
	cl := addPolicyPod(t, e, c, "client", "k8s:app=client")
	far := farNetns(t, e.NS)
	backends := []netip.Addr{netip.MustParseAddr("10.237.9.2"), netip.MustParseAddr("fd00:237:9::2")}
	far.udpSink(t, backends, 8080)
	far.tcpCounter(t, backends, 8080)
	ctx := context.Background()
	svc := func(vip, backend netip.Addr, port, bport uint16) service.Service {
		return service.Service{Frontend: service.Frontend{Addr: vip, Port: port, Proto: service.UDP}, Name: "default/far",
			Kind: service.KindClusterIP, Backends: []service.Backend{{Addr: backend, Port: bport}}}
	}
	type vipSet struct{ frag, unreach, tcp netip.Addr } // one each: a lowered path MTU is per destination
	vip := netip.MustParseAddr
	plain := []vipSet{{vip("10.96.37.10"), vip("10.96.37.11"), vip("10.96.37.12")},
		{vip("fd00:96::37:10"), vip("fd00:96::37:11"), vip("fd00:96::37:12")}}
	enforced := []vipSet{{vip("10.96.37.20"), vip("10.96.37.21"), vip("10.96.37.22")},
		{vip("fd00:96::37:20"), vip("fd00:96::37:21"), vip("fd00:96::37:22")}}
	var svcs []service.Service
	for _, set := range [][]vipSet{plain, enforced} {
		for i, v := range set {
			// 8080 has a listener; 8081 none: the backend answers
			// port unreachable from its own address.
			tcp := svc(v.tcp, backends[i], 80, 8080)
			tcp.Frontend.Proto = service.TCP
			svcs = append(svcs, svc(v.frag, backends[i], 53, 8080), svc(v.unreach, backends[i], 54, 8081), tcp)
		}
	}
	if _, err := e.Agent.System.ReplaceServices(ctx, "test", svcs); err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T, set []vipSet) {
		for _, v := range set {
			t.Run("TCP bulk through the Service "+v.tcp.String(), func(t *testing.T) {
				// TCP's full-size segments meet the 1280-byte link
				// and must shrink.
				const size = 256 << 10
				if got, err := cl.tcpBulk(netip.AddrPortFrom(v.tcp, 80), size); err != nil || got != size {
					t.Errorf("TCP bulk to %s:80: the backend counted %d of %d bytes, %v (path MTU discovery through the Service)", v.tcp, got, size, err)
				}
			})
			t.Run("fragmentation needed from the router "+v.frag.String(), func(t *testing.T) {
				ee := cl.udpError(t, netip.AddrPortFrom(v.frag, 53), 1400-28-20*boolInt(v.frag.Is6()))
				wantType, wantCode := uint8(3), uint8(4) // ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED
				if v.frag.Is6() {
					wantType, wantCode = 2, 0 // ICMPV6_PKT_TOOBIG
				}
				if ee.typ != wantType || ee.code != wantCode || ee.info != farLinkMTU || ee.errno != unix.EMSGSIZE {
					t.Errorf("the pod's socket got %+v; want ICMP %d/%d, MTU %d, EMSGSIZE", ee, wantType, wantCode, farLinkMTU)
				}
				if ee.mtu != farLinkMTU {
					t.Errorf("the pod's socket to %s has path MTU %d after the error, want %d", v.frag, ee.mtu, farLinkMTU)
				}
			})
			t.Run("port unreachable from the backend "+v.unreach.String(), func(t *testing.T) {
				ee := cl.udpError(t, netip.AddrPortFrom(v.unreach, 54), 16)
				if ee.errno != unix.ECONNREFUSED || ee.offender != v.unreach {
					t.Errorf("the pod's socket got %+v; want ECONNREFUSED from the frontend %s (the error's source translated)", ee, v.unreach)
				}
			})
		}
	}
	t.Run("no policy", func(t *testing.T) { check(t, plain) })
	if _, err := c.PolicyImport(ctx, []byte(cnpClientFromOther), client.ContentTypeYAML); err != nil {
		t.Fatal(err)
	}
	policyscenario.WaitRealized(t, c, cl.ep.ID, "client ingress enforced", func(m *policy.MapState) bool {
		return m.Enforced(policy.Ingress)
	})
	t.Run("ingress enforced: the errors are related", func(t *testing.T) { check(t, enforced) })
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// farNS is a netns behind the node on a link of farLinkMTU (the node's
// end; the far end has 1500), holding
// 10.237.9.2/24 and fd00:237:9::2/64 (the node: .1 and ::1), routing
// back to the node's pods through the node.
type farNS struct{ *testutil.NS }

func farNetns(t *testing.T, node *testutil.NS) farNS {
	t.Helper()
	far := testutil.NewNS(t, "mbt-far")
	h, err := far.Handle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	nl, fnl := node.Netlink(t), far.Netlink(t)
	name := "mbtfar" + testutil.RandomSuffix(4)
	if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: farLinkMTU}, PeerName: "eth0",
		PeerNamespace: netlink.NsFd(int(h))}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nl.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}}) })
	setup := func(h *netlink.Handle, link string, addrs ...string) {
		l, err := h.LinkByName(link)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			addr, _ := netlink.ParseAddr(a)
			addr.Flags = unix.IFA_F_NODAD
			if err := h.AddrAdd(l, addr); err != nil {
				t.Fatalf("address %s on %s: %v", a, link, err)
			}
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	setup(nl, name, "10.237.9.1/24", "fd00:237:9::1/64")
	setup(fnl, "eth0", "10.237.9.2/24", "fd00:237:9::2/64")
	// The backends' side stays at 1500: their TCP advertises a 1460-byte
	// MSS, so only path MTU discovery can shrink the pod's segments.
	if l, err := fnl.LinkByName("eth0"); err != nil || fnl.LinkSetMTU(l, 1500) != nil {
		t.Fatalf("far eth0 MTU: %v", err)
	}
	lo, _ := fnl.LinkByName("lo")
	_ = fnl.LinkSetUp(lo)
	for _, r := range []struct{ dst, gw string }{{"10.237.0.0/24", "10.237.9.1"}, {"fd00:237::/120", "fd00:237:9::1"}} {
		_, dst, _ := net.ParseCIDR(r.dst)
		if err := fnl.RouteAdd(&netlink.Route{Dst: dst, Gw: net.ParseIP(r.gw)}); err != nil {
			t.Fatalf("route %s via %s in the far netns: %v", r.dst, r.gw, err)
		}
	}
	return farNS{far}
}

// udpSink listens on UDP port of addrs and drops what it reads.
func (f farNS) udpSink(t *testing.T, addrs []netip.Addr, port uint16) {
	t.Helper()
	for _, a := range addrs {
		var pc net.PacketConn
		if err := f.Do(func() (err error) {
			pc, err = net.ListenPacket("udp", netip.AddrPortFrom(a, port).String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 2048)
			for {
				if _, _, err := pc.ReadFrom(buf); err != nil {
					return
				}
			}
		}()
	}
}

// tcpCounter answers each TCP connection on port of addrs, once the
// client half-closed it, with the number of bytes it read.
func (f farNS) tcpCounter(t *testing.T, addrs []netip.Addr, port uint16) {
	t.Helper()
	for _, a := range addrs {
		var ln net.Listener
		if err := f.Do(func() (err error) {
			ln, err = net.Listen("tcp", netip.AddrPortFrom(a, port).String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					_ = c.SetDeadline(time.Now().Add(20 * time.Second))
					n, _ := io.Copy(io.Discard, c)
					_, _ = fmt.Fprintf(c, "%d\n", n)
				}()
			}
		}()
	}
}

// tcpBulk sends size bytes over a TCP connection from p to fe and
// returns the count the server answers.
func (p *policyPod) tcpBulk(fe netip.AddrPort, size int) (int, error) {
	var got int
	err := p.NS.Do(func() error {
		c, err := net.DialTimeout("tcp", fe.String(), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(make([]byte, size)); err != nil {
			return err
		}
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			return err
		}
		_, err = fmt.Fscan(c, &got)
		return err
	})
	return got, err
}

// sockErr is what a pod's socket learnt from an ICMP error
// (struct sock_extended_err and the offender: the error's source), and
// its path MTU afterwards.
type sockErr struct {
	errno     syscall.Errno
	typ, code uint8
	info      uint32
	offender  netip.Addr
	mtu       int
}

// udpError sends size-byte datagrams with DF set from a new UDP socket
// of p connected to fe until its error queue holds an ICMP error, and
// returns it.
func (p *policyPod) udpError(t *testing.T, fe netip.AddrPort, size int) sockErr {
	t.Helper()
	var got sockErr
	err := p.NS.Do(func() error {
		conn, err := net.Dial("udp", fe.String())
		if err != nil {
			return err
		}
		defer conn.Close()
		rc, err := conn.(*net.UDPConn).SyscallConn()
		if err != nil {
			return err
		}
		v6 := fe.Addr().Is6()
		var serr error
		if err := rc.Control(func(fd uintptr) {
			if v6 {
				serr = errors.Join(unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVERR, 1),
					unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO))
			} else {
				serr = errors.Join(unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVERR, 1),
					unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO))
			}
		}); err != nil || serr != nil {
			return errors.Join(err, serr)
		}
		payload := make([]byte, size)
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			_, _ = conn.Write(payload) // EMSGSIZE/ECONNREFUSED once the error arrived
			time.Sleep(200 * time.Millisecond)
			var found bool
			if err := rc.Control(func(fd uintptr) { found, serr = readErrQueue(int(fd), v6, &got) }); err != nil {
				return err
			}
			if serr != nil {
				return serr
			}
			if found {
				return sockMTU(conn.(*net.UDPConn), v6, &got.mtu)
			}
		}
		return fmt.Errorf("no ICMP error reached the socket to %s within 5s", fe)
	})
	if err != nil {
		t.Fatalf("%s -> %s/udp: %v", podName(p), fe, err)
	}
	return got
}

// readErrQueue reads one error from the socket's error queue into got;
// false if it is empty.
func readErrQueue(fd int, v6 bool, got *sockErr) (bool, error) {
	buf, oob := make([]byte, 2048), make([]byte, 512)
	_, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_ERRQUEUE|unix.MSG_DONTWAIT)
	if errors.Is(err, unix.EAGAIN) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("recvmsg errqueue: %w", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return false, err
	}
	for _, m := range msgs {
		if !(m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_RECVERR) &&
			!(m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_RECVERR) {
			continue
		}
		d := m.Data
		if len(d) < 16 {
			return false, fmt.Errorf("short sock_extended_err: %d bytes", len(d))
		}
		got.errno = syscall.Errno(binary.NativeEndian.Uint32(d[0:4]))
		got.typ, got.code = d[5], d[6]
		got.info = binary.NativeEndian.Uint32(d[8:12])
		off := d[16:]
		switch {
		case !v6 && len(off) >= 8:
			got.offender = netip.AddrFrom4([4]byte(off[4:8]))
		case v6 && len(off) >= 24:
			got.offender = netip.AddrFrom16([16]byte(off[8:24]))
		}
		return true, nil
	}
	return false, fmt.Errorf("error queue message without IP_RECVERR")
}
