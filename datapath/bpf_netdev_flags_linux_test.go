package datapath

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/service"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestBPFNetdevDeliverOnly: from_netdev attached for native routing's
// direct delivery alone (no kube-proxy replacement, no host firewall:
// kube-proxy is in charge of NodePorts) leaves a SYN to an external
// frontend untranslated (TC_ACT_OK, the frame as it came) under
// node_config's NETDEV_F_DELIVER_ONLY; without the flag it translates
// it to the backend (BPF_PROG_TEST_RUN).
func TestBPFNetdevDeliverOnly(t *testing.T) {
	testutil.RequireRoot(t)
	b, err := openBPF(LinuxConfig{BPFFS: testutil.BPFFSDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.close)
	progs, err := loadNetdev(b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(progs.close)
	fe := netip.MustParseAddrPort("192.168.95.1:30080")
	be := netip.MustParseAddrPort("10.244.62.130:8080")
	s := LBService{ID: 7, External: true, Frontend: service.Frontend{Addr: fe.Addr(), Port: fe.Port(), Proto: service.TCP},
		Backends: []service.Backend{{Addr: be.Addr(), Port: be.Port()}}}
	if err := writeLBService(&b.maps.lb, s, 0); err != nil {
		t.Fatal(err)
	}
	client := netip.MustParseAddrPort("192.168.95.2:40000")
	run := func() (uint32, parsedFrame) {
		t.Helper()
		out := make([]byte, 256)
		opts := &ebpf.RunOptions{Data: lbFrame(client, fe, service.TCP), DataOut: out}
		ret, err := progs.from.Run(opts)
		if err != nil {
			t.Fatal(err)
		}
		return ret, checkFrame(t, opts.DataOut, service.TCP)
	}
	if err := setNetdevServices(b, false); err != nil {
		t.Fatal(err)
	}
	var v bpf.EndpointNodeConfigValue
	if err := b.maps.config.Lookup(uint32(0), &v); err != nil || v.NetdevFlags != netdevFlagDeliverOnly {
		t.Fatalf("node_config netdev_flags %#x (%v), want %#x", v.NetdevFlags, err, netdevFlagDeliverOnly)
	}
	if ret, got := run(); ret != 0 || got.src != client || got.dst != fe {
		t.Fatalf("deliver only: verdict %d, %s -> %s; want 0 (TC_ACT_OK), %s -> %s untouched", ret, got.src, got.dst, client, fe)
	}
	if err := setNetdevServices(b, true); err != nil {
		t.Fatal(err)
	}
	if _, got := run(); got.dst != be {
		t.Fatalf("with services: %s -> %s, want the backend %s", got.src, got.dst, be)
	}
}

// TestNativeUplinks: in native routing Init attaches from_netdev to the
// uplinks without the kube-proxy replacement or the host firewall and
// then names them in node_config (uplinks; deliver only); an agent
// started in tunnel mode on the same bpffs and netns clears the uplinks
// first and detaches the program.
func TestNativeUplinks(t *testing.T) {
	client := testutil.NewNS(t, "mbt-ncl")
	l, host, nl := newKPRNode(t, LinuxConfig{Nodes: NodesConfig{Routing: RoutingNative}}, func(host *testutil.NS, nl *netlink.Handle) {
		linkNS(t, host, nl, "up0", "192.168.96.1/24", client, "eth0", "192.168.96.2/24")
	})
	up, err := nl.LinkByName("up0")
	if err != nil {
		t.Fatal(err)
	}
	if got := tcxProgs(t, host, nl, "up0"); got != 1 {
		t.Fatalf("uplink programs in native routing: %d, want 1", got)
	}
	config := func(l *Linux) bpf.EndpointNodeConfigValue {
		t.Helper()
		var v bpf.EndpointNodeConfigValue
		if err := l.guardBPF(func(b *bpfState) error { return b.maps.config.Lookup(uint32(0), &v) }); err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := config(l); v.Uplinks != [4]uint32{uint32(up.Attrs().Index)} || v.NetdevFlags != netdevFlagDeliverOnly {
		t.Fatalf("node_config uplinks %v flags %#x, want [%d 0 0 0] and deliver only", v.Uplinks, v.NetdevFlags, up.Attrs().Index)
	}
	_ = l.Close()
	tunnel := LinuxConfig{HostNetns: host.Path, BPFFS: l.cfg.BPFFS, Gateways: []netip.Addr{e2eGateway}, GatewayDevice: "mbt_gw", TeardownDelay: -1}
	l2, err := NewLinux(tunnel, l.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l2.Close() })
	if err := l2.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	if v := config(l2); v.Uplinks != [4]uint32{} {
		t.Fatalf("node_config uplinks in tunnel mode %v, want none", v.Uplinks)
	}
	testutil.Eventually(t, "uplink program detached", func() bool { return tcxProgs(t, host, nl, "up0") == 0 })
}

// TestNativeUplinksDefaultRouteFirst: with more uplinks than
// node_config names, those holding the default route come first (the
// last of five detected here: veths whose peers stay in the node's
// netns without an address).
func TestNativeUplinksDefaultRouteFirst(t *testing.T) {
	var last int
	l, _, _ := newKPRNode(t, LinuxConfig{Nodes: NodesConfig{Routing: RoutingNative}}, func(host *testutil.NS, nl *netlink.Handle) {
		for i := range 5 {
			d := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("dm%d", i)}, PeerName: fmt.Sprintf("dp%d", i)}
			if err := nl.LinkAdd(d); err != nil {
				t.Fatal(err)
			}
			if p, err := nl.LinkByName(fmt.Sprintf("dp%d", i)); err != nil || nl.LinkSetUp(p) != nil {
				t.Fatalf("dp%d: %v", i, err)
			}
			a, err := netlink.ParseAddr(fmt.Sprintf("192.168.%d.1/24", 100+i))
			if err != nil {
				t.Fatal(err)
			}
			if err := nl.AddrAdd(d, a); err != nil {
				t.Fatal(err)
			}
			if err := nl.LinkSetUp(d); err != nil {
				t.Fatal(err)
			}
			last = d.Attrs().Index
		}
		if err := nl.RouteAdd(&netlink.Route{LinkIndex: last, Gw: net.ParseIP("192.168.104.254")}); err != nil {
			t.Fatal(err)
		}
	})
	var v bpf.EndpointNodeConfigValue
	if err := l.guardBPF(func(b *bpfState) error { return b.maps.config.Lookup(uint32(0), &v) }); err != nil {
		t.Fatal(err)
	}
	if v.Uplinks[0] != uint32(last) || slices.Contains(v.Uplinks[:], 0) {
		t.Fatalf("node_config uplinks %v, want four with dm4 (%d), the default route's, first", v.Uplinks, last)
	}
}
