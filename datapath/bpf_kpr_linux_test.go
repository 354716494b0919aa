package datapath

import (
	"context"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/pkg/domain/service"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// upsertSvc writes a service (id, frontend "addr:port", proto, backends
// "addr:port" on this node when local).
func upsertSvc(t *testing.T, l *Linux, id uint32, fe string, proto uint8, external, local bool, prev int, backends ...string) {
	t.Helper()
	f := netip.MustParseAddrPort(fe)
	s := LBService{ID: id, Frontend: service.Frontend{Addr: f.Addr(), Port: f.Port(), Proto: proto}, External: external}
	for _, b := range backends {
		ap := netip.MustParseAddrPort(b)
		s.Backends = append(s.Backends, service.Backend{Addr: ap.Addr(), Port: ap.Port(), Local: local})
	}
	if err := l.UpsertService(context.Background(), s, prev); err != nil {
		t.Fatal(err)
	}
}

// backendsSeen checks every result names frontend as its peer and
// returns the backends that answered (the first word of the reply).
func backendsSeen(t *testing.T, what string, res []sockResult, frontend string) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for _, r := range res {
		if r.err != "" {
			t.Fatalf("%s: exchange failed: %s", what, r.err)
		}
		if r.peer != frontend {
			t.Fatalf("%s: socket reports peer %s, want the frontend %s", what, r.peer, frontend)
		}
		seen[strings.Fields(strings.ReplaceAll(r.backend, "_", " "))[0]]++
	}
	return seen
}

// TestSocketLBHostProcess: with the kube-proxy-free mode on, a process of
// the node netns in the hooked cgroup reaches a ClusterIP with two
// backend pods over TCP, unconnected and connected UDP; the socket
// reports the frontend as its peer; both backends serve; after one is
// removed no new connection picks it. A pod's process in the cgroup is
// translated at connect() and its from-container program translates
// nothing more (lb_ct stays empty).
func TestSocketLBHostProcess(t *testing.T) {
	cg := newCgroup(t)
	l, host, nl := newKPRNode(t, LinuxConfig{Services: ServicesConfig{KubeProxyReplacement: true, Cgroup: cg, Devices: []string{"mbt_gw"}}}, nil)
	a := addPod(t, nl, 11, 1001, "10.244.60.11")
	b := addPod(t, nl, 12, 1002, "10.244.60.12")
	c := addPod(t, nl, 13, 1003, "10.244.60.13")
	for _, p := range []*testPod{a, b, c} {
		if _, err := l.Realize(context.Background(), p.ep, 1); err != nil {
			t.Fatal(err)
		}
	}
	whoServer(t, a.ns, a.addr(), 8080)
	whoServer(t, b.ns, b.addr(), 8080)
	upsertSvc(t, l, 1, "10.96.0.10:80", service.TCP, false, true, 0, "10.244.60.11:8080", "10.244.60.12:8080")
	upsertSvc(t, l, 2, "10.96.0.10:53", service.UDP, false, true, 0, "10.244.60.11:8080", "10.244.60.12:8080")
	const n = 40
	for _, x := range []struct{ mode, fe string }{{"tcp", "10.96.0.10:80"}, {"udp", "10.96.0.10:53"}, {"udpconn", "10.96.0.10:53"}} {
		seen := backendsSeen(t, x.mode, runSockClient(t, host, cg, x.mode, netip.MustParseAddrPort(x.fe), n), x.fe)
		if seen["10.244.60.11"] == 0 || seen["10.244.60.12"] == 0 || len(seen) != 2 {
			t.Fatalf("%s: backends %v, want both pods", x.mode, seen)
		}
	}
	// One unconnected UDP socket keeps its backend.
	seen := backendsSeen(t, "udpsock", runSockClient(t, host, cg, "udpsock", netip.MustParseAddrPort("10.96.0.10:53"), 10), "10.96.0.10:53")
	if len(seen) != 1 {
		t.Fatalf("one unconnected UDP socket reached backends %v, want one", seen)
	}
	m, err := l.DumpServices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if m.Hooks.Cgroup != cg || len(m.Hooks.SocketPrograms) != 8 || m.Sockets == 0 || m.Connections != 0 {
		t.Fatalf("maps after host clients: hooks %+v, %d socket entries, %d lb_ct: want the cgroup, 8 programs, entries, no lb_ct", m.Hooks, m.Sockets, m.Connections)
	}
	// Backend removal: new connections never pick b.
	upsertSvc(t, l, 1, "10.96.0.10:80", service.TCP, false, true, 2, "10.244.60.11:8080")
	upsertSvc(t, l, 2, "10.96.0.10:53", service.UDP, false, true, 2, "10.244.60.11:8080")
	for _, x := range []struct{ mode, fe string }{{"tcp", "10.96.0.10:80"}, {"udp", "10.96.0.10:53"}} {
		seen := backendsSeen(t, x.mode, runSockClient(t, host, cg, x.mode, netip.MustParseAddrPort(x.fe), n), x.fe)
		if len(seen) != 1 || seen["10.244.60.11"] != n {
			t.Fatalf("%s after removing 10.244.60.12: backends %v, want only 10.244.60.11", x.mode, seen)
		}
	}
	// A pod's process in the cgroup: translated once, at connect().
	backendsSeen(t, "pod tcp", runSockClient(t, c.ns, cg, "tcp", netip.MustParseAddrPort("10.96.0.10:80"), 5), "10.96.0.10:80")
	if m, err = l.DumpServices(context.Background()); err != nil || m.Connections != 0 {
		t.Fatalf("lb_ct after a pod's socket-translated connections: %d (%v), want 0", m.Connections, err)
	}
}

// clientNode is a node netns whose uplink up0 (192.168.93.1/24) leads to
// a client netns (192.168.93.2/24, default route via the node).
func clientNode(t *testing.T, cfg LinuxConfig, prep func(host *testutil.NS, nl *netlink.Handle)) (*Linux, *testutil.NS, *netlink.Handle, *testutil.NS) {
	t.Helper()
	testutil.RequireRoot(t)
	client := testutil.NewNS(t, "mbt-cl")
	l, host, nl := newKPRNode(t, cfg, func(host *testutil.NS, nl *netlink.Handle) {
		linkNS(t, host, nl, "up0", "192.168.93.1/24", client, "eth0", "192.168.93.2/24")
		if prep != nil {
			prep(host, nl)
		}
	})
	cnl := client.Netlink(t)
	if err := cnl.RouteAdd(&netlink.Route{Gw: net.ParseIP("192.168.93.1")}); err != nil {
		t.Fatal(err)
	}
	return l, host, nl, client
}

// dialWho makes one exchange with whoServer at addr from ns: it returns
// the reply's source (UDP) or the connected peer (TCP) and the reply.
func dialWho(t *testing.T, ns *testutil.NS, network string, addr string) (from, reply string) {
	t.Helper()
	err := ns.Do(func() error {
		var err error
		from, reply, err = sockExchange(network, netip.MustParseAddrPort(addr))
		return err
	})
	if err != nil {
		t.Fatalf("%s to %s from outside: %v", network, addr, err)
	}
	return from, reply
}

// TestNodePortFromOutside: a client outside the node reaches
// nodeIP:nodePort over TCP and UDP; the uplink program (up0, detected
// from the node's addresses) DNATs to the local backend pods, which see
// the client's own address (no SNAT: externalTrafficPolicy Local
// semantics); replies come back from nodeIP:nodePort. A NodePort without
// backends (Local, no pod on this node) is dropped as no-backend.
func TestNodePortFromOutside(t *testing.T) {
	cg := newCgroup(t)
	l, _, nl, client := clientNode(t, LinuxConfig{Services: ServicesConfig{KubeProxyReplacement: true, Cgroup: cg}}, nil)
	a := addPod(t, nl, 11, 1001, "10.244.60.11")
	b := addPod(t, nl, 12, 1002, "10.244.60.12")
	for _, p := range []*testPod{a, b} {
		if _, err := l.Realize(context.Background(), p.ep, 1); err != nil {
			t.Fatal(err)
		}
		whoServer(t, p.ns, p.addr(), 8080)
	}
	m, err := l.DumpServices(context.Background())
	if err != nil || len(m.Hooks.Devices) != 1 || m.Hooks.Devices[0] != "up0" {
		t.Fatalf("uplinks %v (%v), want [up0] detected", m.Hooks.Devices, err)
	}
	upsertSvc(t, l, 1, "192.168.93.1:30080", service.TCP, true, true, 0, "10.244.60.11:8080", "10.244.60.12:8080")
	upsertSvc(t, l, 2, "192.168.93.1:30053", service.UDP, true, true, 0, "10.244.60.11:8080", "10.244.60.12:8080")
	upsertSvc(t, l, 3, "192.168.93.1:30099", service.TCP, true, true, 0)
	for _, network := range []string{"tcp", "udp"} {
		fe := map[string]string{"tcp": "192.168.93.1:30080", "udp": "192.168.93.1:30053"}[network]
		seen := map[string]bool{}
		for range 30 {
			from, reply := dialWho(t, client, network, fe)
			f := strings.Fields(reply)
			if from != fe || len(f) != 2 || !strings.HasPrefix(f[1], "192.168.93.2:") {
				t.Fatalf("%s: reply %q from %s, want from %s and the client's address seen by the pod", network, reply, from, fe)
			}
			seen[f[0]] = true
		}
		if !seen["10.244.60.11"] || !seen["10.244.60.12"] {
			t.Fatalf("%s: backends %v, want both", network, seen)
		}
	}
	if err := client.Do(func() error {
		_, _, err := sockExchange("tcp", netip.MustParseAddrPort("192.168.93.1:30099"))
		return err
	}); err == nil {
		t.Fatal("NodePort without backends connected, want dropped")
	}
	c, err := l.DropCounters(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var noBackend uint64
	for k, d := range c {
		if k.Endpoint == 0 && k.Reason == DropNoBackend {
			noBackend += d.Packets
		}
	}
	if noBackend == 0 {
		t.Fatalf("drop counters %+v: want no-backend drops on the uplink", c)
	}
}

// TestNodePortRemoteBackend: node A's NodePort with its only backend on
// node B (native routing over ul0): A DNATs and SNATs to the address the
// client reached, B's pod sees A's address, the reply is translated back
// on A's ul0 and reaches the client from nodeIP:nodePort. TCP and UDP,
// over IPv4 and IPv6.
func TestNodePortRemoteBackend(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(map[bool]string{false: "ipv4", true: "ipv6"}[v6], func(t *testing.T) { testNodePortRemote(t, v6) })
	}
}

// nodePortRemote sets up TestNodePortRemoteBackend's nodes: node A
// (kube-proxy-free, its uplinks up0 to the client and ul0 to node B)
// with NodePorts ad.nodeA:30080 (TCP) and :30053 (UDP), whose one
// backend is node B's pod ad.pod:8080 serving whoServer; client is the
// client's netns, routed to node A.
func nodePortRemote(t *testing.T, v6 bool) (nodeA *Linux, client *testutil.NS, ad remoteAddrs) {
	t.Helper()
	testutil.RequireRoot(t)
	ad = remoteAddrs{nodeA: "192.168.93.1", client: "192.168.93.2", ulA: "192.168.94.1", ulB: "192.168.94.2",
		clientNet: "192.168.93.0/24", podCIDR: "10.244.60.128/25", pod: "10.244.60.130", gw: "10.244.60.1", bits: 24}
	if v6 {
		ad = remoteAddrs{nodeA: "2001:db8:93::1", client: "2001:db8:93::2", ulA: "2001:db8:94::1", ulB: "2001:db8:94::2",
			clientNet: "2001:db8:93::/64", podCIDR: "fd00:60::80/121", pod: "fd00:60::82", gw: "fd00:60::1", bits: 64}
	}
	hp := func(a string, port int) string {
		return netip.AddrPortFrom(netip.MustParseAddr(a), uint16(port)).String()
	}
	pfx := func(a string) string { return a + "/" + strconv.Itoa(ad.bits) }
	noDAD := func(host *testutil.NS) {
		if err := host.Do(func() error { return os.WriteFile("/proc/sys/net/ipv6/conf/default/accept_dad", []byte("0"), 0) }); err != nil {
			t.Fatal(err)
		}
	}
	cg := newCgroup(t)
	cfg := LinuxConfig{Nodes: NodesConfig{Routing: RoutingNative}, Gateways: []netip.Addr{netip.MustParseAddr(ad.gw)}, GatewayDevice: "mbt_gw"}
	cfgA := cfg
	cfgA.Services = ServicesConfig{KubeProxyReplacement: true, Cgroup: cg}
	nodeB, hostB, nlB := newKPRNode(t, cfg, func(host *testutil.NS, _ *netlink.Handle) { noDAD(host) })
	client = testutil.NewNS(t, "mbt-cl")
	nodeA, _, _ = newKPRNode(t, cfgA, func(host *testutil.NS, nl *netlink.Handle) {
		noDAD(host)
		linkNS(t, host, nl, "up0", pfx(ad.nodeA), client, "eth0", pfx(ad.client))
		linkNS(t, host, nl, "ul0", pfx(ad.ulA), hostB, "ul0", pfx(ad.ulB))
	})
	if err := client.Netlink(t).RouteAdd(&netlink.Route{Gw: net.ParseIP(ad.nodeA)}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := nodeA.SyncNodes(ctx, []RemoteNode{{Name: "b", Addrs: []netip.Addr{netip.MustParseAddr(ad.ulB)}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix(ad.podCIDR)}}}); err != nil {
		t.Fatal(err)
	}
	cn := netip.MustParsePrefix(ad.clientNet)
	if err := nlB.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: cn.Addr().AsSlice(), Mask: net.CIDRMask(cn.Bits(), cn.Addr().BitLen())}, Gw: net.ParseIP(ad.ulA)}); err != nil {
		t.Fatal(err)
	}
	var pod *testPod
	if v6 {
		pod = addPod6(t, nlB, 32, 2002, ad.pod)
	} else {
		pod = addPod(t, nlB, 32, 2002, ad.pod)
	}
	if _, err := nodeB.Realize(ctx, pod.ep, 1); err != nil {
		t.Fatal(err)
	}
	whoServer(t, pod.ns, pod.addr(), 8080)
	m, err := nodeA.DumpServices(ctx)
	if err != nil || len(m.Hooks.Devices) != 2 {
		t.Fatalf("uplinks %v (%v), want up0 and ul0", m.Hooks.Devices, err)
	}
	upsertSvc(t, nodeA, 1, hp(ad.nodeA, 30080), service.TCP, true, false, 0, hp(ad.pod, 8080))
	upsertSvc(t, nodeA, 2, hp(ad.nodeA, 30053), service.UDP, true, false, 0, hp(ad.pod, 8080))
	return nodeA, client, ad
}

// remoteAddrs are one family's addresses of the remote-backend test.
type remoteAddrs struct {
	nodeA, client, ulA, ulB, clientNet, podCIDR, pod, gw string
	bits                                                 int
}

func testNodePortRemote(t *testing.T, v6 bool) {
	nodeA, client, ad := nodePortRemote(t, v6)
	ctx := context.Background()
	hp := func(a string, port int) string {
		return netip.AddrPortFrom(netip.MustParseAddr(a), uint16(port)).String()
	}
	seenFrom := hp(ad.nodeA, 0)
	seenFrom = seenFrom[:len(seenFrom)-1] // "addr:" or "[addr]:"
	for _, network := range []string{"tcp", "udp"} {
		fe := map[string]string{"tcp": hp(ad.nodeA, 30080), "udp": hp(ad.nodeA, 30053)}[network]
		for range 10 {
			from, reply := dialWho(t, client, network, fe)
			f := strings.Fields(reply)
			if from != fe || len(f) != 2 || f[0] != ad.pod || !strings.HasPrefix(f[1], seenFrom) {
				t.Fatalf("%s: reply %q from %s, want from %s, served by %s seeing node A's address", network, reply, from, fe, ad.pod)
			}
		}
	}
	if m, err := nodeA.DumpServices(ctx); err != nil || m.NodePortSNAT == 0 || m.NodePortNAT == 0 {
		t.Fatalf("node A's NAT entries %d/%d (%v), want some", m.NodePortNAT, m.NodePortSNAT, err)
	}
}

// cgroupProgs counts the programs attached to cgroup cg at attach.
func cgroupProgs(t *testing.T, cg string, attach ebpf.AttachType) int {
	t.Helper()
	f, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: attach})
	if err != nil {
		t.Fatal(err)
	}
	return len(r.Programs)
}

// tcxProgs counts the TCX ingress programs on host's device dev.
func tcxProgs(t *testing.T, host *testutil.NS, nl *netlink.Handle, dev string) int {
	t.Helper()
	lk, err := nl.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := host.Do(func() error {
		r, err := link.QueryPrograms(link.QueryOptions{Target: lk.Attrs().Index, Attach: ebpf.AttachTCXIngress})
		if r != nil {
			n = len(r.Programs)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestKubeProxyReplacementOff: with kube-proxy installed
// (KubeProxyReplacement false) nothing is attached: an agent started so
// on the bpffs and netns of one that ran kube-proxy-free detaches its
// socket programs and its uplink program, and a host process's
// connection to a ClusterIP is no longer translated.
func TestKubeProxyReplacementOff(t *testing.T) {
	cg := newCgroup(t)
	on := LinuxConfig{Services: ServicesConfig{KubeProxyReplacement: true, Cgroup: cg}}
	l, host, nl, _ := clientNode(t, on, nil)
	if got := cgroupProgs(t, cg, ebpf.AttachCGroupInet4Connect); got != 1 {
		t.Fatalf("connect4 programs on the cgroup with the mode on: %d, want 1", got)
	}
	if got := tcxProgs(t, host, nl, "up0"); got != 1 {
		t.Fatalf("uplink programs with the mode on: %d, want 1", got)
	}
	upsertSvc(t, l, 1, "10.96.0.10:80", service.TCP, false, true, 0, "10.244.60.11:8080")
	_ = l.Close()
	off := LinuxConfig{HostNetns: host.Path, BPFFS: l.cfg.BPFFS, Gateways: []netip.Addr{e2eGateway}, GatewayDevice: "mbt_gw", TeardownDelay: -1}
	l2, err := NewLinux(off, l.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l2.Close() })
	if err := l2.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Unpinning the last reference detaches; the kernel frees the links
	// in a work item, so wait (bounded) for them to go.
	testutil.Eventually(t, "socket programs detached from the cgroup", func() bool {
		for _, s := range sockHooks {
			if cgroupProgs(t, cg, s.attach) != 0 {
				return false
			}
		}
		return true
	})
	testutil.Eventually(t, "uplink program detached", func() bool { return tcxProgs(t, host, nl, "up0") == 0 })
	if m, err := l2.DumpServices(context.Background()); err != nil || m.Hooks.KubeProxyReplacement || len(m.Hooks.Devices) != 0 {
		t.Fatalf("hooks %+v (%v), want none", m.Hooks, err)
	}
	a := addPod(t, nl, 11, 1001, "10.244.60.11")
	if _, err := l2.Realize(context.Background(), a.ep, 1); err != nil {
		t.Fatal(err)
	}
	whoServer(t, a.ns, a.addr(), 8080)
	res := runSockClient(t, host, cg, "tcp", netip.MustParseAddrPort("10.96.0.10:80"), 1)
	if res[0].err == "" {
		t.Fatalf("host process reached the ClusterIP without the mode (%+v), want it untranslated", res[0])
	}
}

// TestKPRIPv6: the same paths over IPv6: a host process in the cgroup
// reaches an IPv6 ClusterIP (TCP, unconnected UDP) with the frontend as
// its peer, and a client outside reaches [nodeIP]:nodePort (TCP, UDP),
// DNATed to local IPv6 pods that see the client's address.
func TestKPRIPv6(t *testing.T) {
	testutil.RequireRoot(t)
	cg := newCgroup(t)
	client := testutil.NewNS(t, "mbt-cl6")
	cfg := LinuxConfig{GatewayDevice: "mbt_gw6", Gateways: []netip.Addr{netip.MustParseAddr("fd00:60::1")},
		Services: ServicesConfig{KubeProxyReplacement: true, Cgroup: cg}}
	l, node, nl := newKPRNode(t, cfg, func(host *testutil.NS, nl *netlink.Handle) {
		if err := host.Do(func() error { return os.WriteFile("/proc/sys/net/ipv6/conf/default/accept_dad", []byte("0"), 0) }); err != nil {
			t.Fatal(err)
		}
		linkNS(t, host, nl, "up0", "2001:db8:93::1/64", client, "eth0", "2001:db8:93::2/64")
	})
	cnl := client.Netlink(t)
	if err := cnl.RouteAdd(&netlink.Route{Gw: net.ParseIP("2001:db8:93::1")}); err != nil {
		t.Fatal(err)
	}
	a := addPod6(t, nl, 21, 2001, "fd00:60::11")
	b := addPod6(t, nl, 22, 2002, "fd00:60::12")
	for _, p := range []*testPod{a, b} {
		if _, err := l.Realize(context.Background(), p.ep, 1); err != nil {
			t.Fatal(err)
		}
		whoServer(t, p.ns, p.addr(), 8080)
	}
	upsertSvc(t, l, 1, "[fd00:96::10]:80", service.TCP, false, true, 0, "[fd00:60::11]:8080", "[fd00:60::12]:8080")
	upsertSvc(t, l, 2, "[fd00:96::10]:53", service.UDP, false, true, 0, "[fd00:60::11]:8080", "[fd00:60::12]:8080")
	upsertSvc(t, l, 3, "[2001:db8:93::1]:30080", service.TCP, true, true, 0, "[fd00:60::11]:8080", "[fd00:60::12]:8080")
	upsertSvc(t, l, 4, "[2001:db8:93::1]:30053", service.UDP, true, true, 0, "[fd00:60::11]:8080", "[fd00:60::12]:8080")
	for _, x := range []struct{ mode, fe string }{{"tcp", "[fd00:96::10]:80"}, {"udp", "[fd00:96::10]:53"}} {
		seen := backendsSeen(t, x.mode, runSockClient(t, node, cg, x.mode, netip.MustParseAddrPort(x.fe), 30), x.fe)
		if len(seen) != 2 {
			t.Fatalf("host %s: backends %v, want both pods", x.mode, seen)
		}
	}
	for _, network := range []string{"tcp", "udp"} {
		fe := map[string]string{"tcp": "[2001:db8:93::1]:30080", "udp": "[2001:db8:93::1]:30053"}[network]
		seen := map[string]bool{}
		for range 20 {
			from, reply := dialWho(t, client, network, fe)
			f := strings.Fields(reply)
			if from != fe || len(f) != 2 || !strings.HasPrefix(f[1], "[2001:db8:93::2]:") {
				t.Fatalf("%s: reply %q from %s, want from %s and the client's address seen by the pod", network, reply, from, fe)
			}
			seen[f[0]] = true
		}
		if len(seen) != 2 {
			t.Fatalf("NodePort %s: backends %v, want both", network, seen)
		}
	}
}
