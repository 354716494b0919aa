package datapath

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/service"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// exchangeFrom makes one exchange with whoServer at to from local, a
// fixed address and port (SO_REUSEADDR: an earlier connection of the
// port may be in TIME_WAIT), inside ns, and returns the reply. A TCP
// connection or a connected UDP socket takes replies from to only, so a
// reply whose source was rewritten to a frontend never arrives.
func exchangeFrom(ns *testutil.NS, network string, local, to netip.AddrPort) (string, error) {
	var reply string
	err := ns.Do(func() error {
		d := net.Dialer{Timeout: 3 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
			}); err != nil {
				return err
			}
			return serr
		}}
		tries := 1
		if network == "tcp" {
			d.LocalAddr = net.TCPAddrFromAddrPort(local)
		} else {
			d.LocalAddr = net.UDPAddrFromAddrPort(local)
			tries = 3 // datagrams may be lost; bounded
		}
		c, err := d.Dial(network, to.String())
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 128)
		for range tries {
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err = c.Write([]byte("who")); err != nil {
				return err
			}
			var n int
			if n, err = c.Read(buf); err == nil {
				reply = strings.TrimSpace(string(buf[:n]))
				return nil
			}
		}
		return err
	})
	return reply, err
}

// revnatNode is a kube-proxy-free node with an uplink up0 to a client
// netns outside (IPv4 192.168.93.0/24 or IPv6 2001:db8:93::/64, the
// node .1, the client .2 with its default route through the node), a
// backend pod b (whoServer on 8080) and a client pod c.
type revnatNode struct {
	l                *Linux
	host, client     *testutil.NS
	nodeIP, clientIP netip.Addr
	b, c             *testPod
	svcIP            [2]netip.Addr // two ClusterIPs
}

func newRevnatNode(t *testing.T, v6 bool) *revnatNode {
	t.Helper()
	testutil.RequireRoot(t)
	n := &revnatNode{}
	cfg := LinuxConfig{Services: ServicesConfig{KubeProxyReplacement: true, Cgroup: newCgroup(t)}}
	var nl *netlink.Handle
	if !v6 {
		n.nodeIP, n.clientIP = netip.MustParseAddr("192.168.93.1"), netip.MustParseAddr("192.168.93.2")
		n.svcIP = [2]netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("10.96.0.11")}
		n.l, n.host, nl, n.client = clientNode(t, cfg, nil)
		n.b = addPod(t, nl, 12, 1002, "10.244.60.12")
		n.c = addPod(t, nl, 13, 1003, "10.244.60.13")
	} else {
		n.nodeIP, n.clientIP = netip.MustParseAddr("2001:db8:93::1"), netip.MustParseAddr("2001:db8:93::2")
		n.svcIP = [2]netip.Addr{netip.MustParseAddr("fd00:96::10"), netip.MustParseAddr("fd00:96::11")}
		n.client = testutil.NewNS(t, "mbt-cl6")
		cfg.GatewayDevice, cfg.Gateways = "mbt_gw6", []netip.Addr{netip.MustParseAddr("fd00:60::1")}
		n.l, n.host, nl = newKPRNode(t, cfg, func(host *testutil.NS, nl *netlink.Handle) {
			if err := host.Do(func() error {
				return os.WriteFile("/proc/sys/net/ipv6/conf/default/accept_dad", []byte("0"), 0)
			}); err != nil {
				t.Fatal(err)
			}
			linkNS(t, host, nl, "up0", "2001:db8:93::1/64", n.client, "eth0", "2001:db8:93::2/64")
		})
		if err := n.client.Netlink(t).RouteAdd(&netlink.Route{Gw: n.nodeIP.AsSlice()}); err != nil {
			t.Fatal(err)
		}
		n.b = addPod6(t, nl, 22, 2002, "fd00:60::12")
		n.c = addPod6(t, nl, 23, 2003, "fd00:60::13")
	}
	for _, p := range []*testPod{n.b, n.c} {
		if _, err := n.l.Realize(context.Background(), p.ep, 1); err != nil {
			t.Fatal(err)
		}
	}
	whoServer(t, n.b.ns, n.b.addr(), 8080)
	return n
}

// TestReverseNATOnlyTranslated: the reverse translation of a Service
// connection applies to that connection's replies only. A client
// reaches backend b through a frontend from a fixed address and port,
// then, from the same address and port, b's own address directly (no
// translation: kube-proxy's DNAT, native routing from outside, a pod
// dialling a pod): the direct replies must keep b's address, not be
// rewritten to the earlier frontend (the client would drop them and the
// connection hang). A third connection through another frontend of b
// from the same port is translated again. For a client outside through
// a NodePort (from_netdev, the local backend's reply tail call) and a
// pod through a ClusterIP (from_container, to_container), TCP and UDP,
// IPv4 and IPv6. The direct path from a fresh port is checked first.
func TestReverseNATOnlyTranslated(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(map[bool]string{false: "ipv4", true: "ipv6"}[v6], func(t *testing.T) {
			n := newRevnatNode(t, v6)
			backend := netip.AddrPortFrom(n.b.addr(), 8080)
			id := uint32(1)
			port := uint16(41000)
			for _, kind := range []string{"nodeport", "clusterip"} {
				for _, network := range []string{"tcp", "udp"} {
					proto := map[string]uint8{"tcp": service.TCP, "udp": service.UDP}[network]
					var fes [2]netip.AddrPort
					for i := range fes {
						if kind == "nodeport" {
							fes[i] = netip.AddrPortFrom(n.nodeIP, 30080+uint16(10*int(proto)+i))
						} else {
							fes[i] = netip.AddrPortFrom(n.svcIP[i], 80+uint16(proto))
						}
						upsertSvc(t, n.l, id, fes[i].String(), proto, kind == "nodeport", true, 0, backend.String())
						id++
					}
					ns, local := n.client, netip.AddrPortFrom(n.clientIP, port)
					if kind == "clusterip" {
						ns, local = n.c.ns, netip.AddrPortFrom(n.c.addr(), port)
					}
					port++
					t.Run(kind+"/"+network, func(t *testing.T) {
						// The direct path itself works: from a port no
						// frontend connection used.
						fresh := netip.AddrPortFrom(local.Addr(), local.Port()+1000)
						if reply, err := exchangeFrom(ns, network, fresh, backend); err != nil || !strings.HasPrefix(reply, n.b.addr().String()+" ") {
							t.Fatalf("%s %s -> %s directly: %q, %v", network, fresh, backend, reply, err)
						}
						for i, to := range []netip.AddrPort{fes[0], backend, fes[1]} {
							reply, err := exchangeFrom(ns, network, local, to)
							if err != nil {
								t.Fatalf("step %d: %s %s -> %s: %v (%s)", i+1, network, local, to, err, revnatState(n.l))
							}
							if want := fmt.Sprintf("%s %s", n.b.addr(), local); reply != want {
								t.Fatalf("step %d: %s %s -> %s: reply %q, want %q", i+1, network, local, to, reply, want)
							}
						}
					})
				}
			}
		})
	}
}

// revnatState sums up the service maps for a failure message.
func revnatState(l *Linux) string {
	m, err := l.DumpServices(context.Background())
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("lb_ct %d, lb_revnat %d, lb_nat %d entries", m.Connections, m.ReverseNAT, m.NodePortNAT)
}

// TestBPFReverseNATFollowsConntrack runs the endpoint programs on frames
// of one client address and port: a backend's reply gets the frontend
// as its source only while the connection's conntrack entry says the
// client's packets were translated; the client's next packet decides
// again. An entry an earlier build wrote (no flags: before an upgrade)
// is reverse-translated by lb_revnat alone, as that build did, until the
// client's next packet. An entry whose last_seen is later than the
// reply's clock (another CPU stamped it meanwhile) is still live.
func TestBPFReverseNATFollowsConntrack(t *testing.T) {
	// The flags took the high half of the packet counter: the value
	// keeps the size an earlier build pinned the ct map with, so an
	// upgrade keeps the map and its entries (openSharedMap).
	if n := binary.Size(bpf.EndpointCtValue{}); n != 16 {
		t.Fatalf("ct value of %d bytes, want 16 (the pinned map's)", n)
	}
	h := newProgHarness(t, 42, 1000) // the client is the harness's pod (podIP, pod6)
	for _, tc := range []struct {
		name                 string
		client, vip, backend string
		proto                uint8
	}{
		{"tcp4", "10.0.0.10:40000", "10.96.0.10:80", "10.200.0.9:8080", service.TCP},
		{"udp4", "10.0.0.10:40001", "10.96.0.10:53", "10.200.0.9:5353", service.UDP},
		{"tcp6", "[fd00::10]:40002", "[fd00:96::10]:80", "[fd00::9]:8080", service.TCP},
		{"udp6", "[fd00::10]:40003", "[fd00:96::10]:53", "[fd00::9]:5353", service.UDP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, vip, backend := netip.MustParseAddrPort(tc.client), netip.MustParseAddrPort(tc.vip), netip.MustParseAddrPort(tc.backend)
			s := LBService{ID: 9, Frontend: service.Frontend{Addr: vip.Addr(), Port: vip.Port(), Proto: tc.proto},
				Backends: []service.Backend{{Addr: backend.Addr(), Port: backend.Port()}}}
			if err := writeLBService(&h.b.maps.lb, s, 0); err != nil {
				t.Fatal(err)
			}
			run := func(what string, prog *ebpf.Program, src, dst netip.AddrPort) parsedFrame {
				t.Helper()
				opts := &ebpf.RunOptions{Data: lbFrame(src, dst, tc.proto), DataOut: make([]byte, 256)}
				if ret, err := prog.Run(opts); err != nil || ret != verdictPass {
					t.Fatalf("%s: %d, %v", what, ret, err)
				}
				return checkFrame(t, opts.DataOut, tc.proto)
			}
			for i, step := range []struct {
				what      string
				to        netip.AddrPort // the client's packet's destination (0: none)
				change    func(*bpf.EndpointCtValue)
				replyFrom netip.AddrPort
			}{
				{"through the frontend", vip, nil, vip},
				// The reply's CPU read its clock just before another
				// CPU stamped the entry: still a reply.
				{"an entry stamped after the reply's clock", netip.AddrPort{}, func(v *bpf.EndpointCtValue) { v.LastSeen = ktimeNow() + uint64(time.Second) }, vip},
				{"straight to the backend", backend, nil, backend},
				{"through the frontend again", vip, nil, vip},
				{"an earlier build's entry", netip.AddrPort{}, func(v *bpf.EndpointCtValue) { v.Flags = 0 }, vip},
				{"straight to the backend after the upgrade", backend, nil, backend},
			} {
				if step.change != nil {
					changeCT(t, h.b.maps.ct, step.change)
				}
				if step.to.IsValid() {
					run("from-container", h.progs.from, client, step.to)
				}
				if got := run("to-container", h.progs.to, backend, client); got.src != step.replyFrom || got.dst != client {
					t.Fatalf("step %d (%s): reply arrives as %s -> %s, want %s -> %s", i+1, step.what, got.src, got.dst, step.replyFrom, client)
				}
			}
		})
	}
}

// changeCT applies change to every conntrack entry (flags 0: as an
// earlier build wrote it, its packets a u64 whose high half, today's
// flags, is 0).
func changeCT(t *testing.T, m *ebpf.Map, change func(*bpf.EndpointCtValue)) {
	t.Helper()
	var (
		k  bpf.EndpointCtKey
		v  bpf.EndpointCtValue
		ks []bpf.EndpointCtKey
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		ks = append(ks, k)
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	for _, k := range ks {
		if err := m.Lookup(k, &v); err != nil {
			t.Fatal(err)
		}
		change(&v)
		if err := m.Update(k, v, ebpf.UpdateExist); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReplyToFrontendAddressNotTranslated: a pod's reply to a peer
// whose address and port happen to be a frontend's (the node's address
// and a NodePort or hostPort: a host process bound there, a masquerade
// with random ports such as kube-proxy's --random-fully) belongs to the
// peer's connection, not to a new Service connection: it must reach the
// peer untranslated. TCP and UDP, IPv4 and IPv6, from the node's netns.
func TestReplyToFrontendAddressNotTranslated(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(map[bool]string{false: "ipv4", true: "ipv6"}[v6], func(t *testing.T) {
			n := newRevnatNode(t, v6)
			backend := netip.AddrPortFrom(n.b.addr(), 8080)
			for i, network := range []string{"tcp", "udp"} {
				proto := map[string]uint8{"tcp": service.TCP, "udp": service.UDP}[network]
				fe := netip.AddrPortFrom(n.nodeIP, 30080)
				upsertSvc(t, n.l, uint32(i+1), fe.String(), proto, true, true, 0, backend.String())
				t.Run(network, func(t *testing.T) {
					// The path itself works: from a port no frontend has.
					other := netip.AddrPortFrom(n.nodeIP, 30081)
					if reply, err := exchangeFrom(n.host, network, other, backend); err != nil || !strings.HasPrefix(reply, n.b.addr().String()+" ") {
						t.Fatalf("%s %s -> %s: %q, %v", network, other, backend, reply, err)
					}
					reply, err := exchangeFrom(n.host, network, fe, backend)
					if want := fmt.Sprintf("%s %s", n.b.addr(), fe); err != nil || reply != want {
						t.Fatalf("%s %s -> %s: %q, %v; want %q", network, fe, backend, reply, err, want)
					}
				})
			}
		})
	}
}
