package datapath

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/ifname"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// newTestLinux starts a Linux datapath in a fresh netns standing in for
// the host; it is closed by tb.Cleanup.
func newTestLinux(t testing.TB, cfg LinuxConfig) (*Linux, *testutil.NS, *netlink.Handle) {
	t.Helper()
	testutil.RequireRoot(t)
	host := testutil.NewNS(t, "mbt-dp")
	cfg.HostNetns = host.Path
	if cfg.BPFFS == "" {
		cfg.BPFFS = testutil.BPFFSDir(t)
	}
	l, err := NewLinux(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Init(context.Background()); err != nil {
		t.Fatalf("Init: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l, host, host.Netlink(t)
}

// addVeth creates a veth pair in the host netns and returns an endpoint
// naming its host side.
func addVeth(t *testing.T, nl *netlink.Handle, id endpoint.ID, name string, ip string) *endpoint.Endpoint {
	t.Helper()
	attrs := netlink.NewLinkAttrs()
	attrs.Name = name
	if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "p" + name[1:]}); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	link, err := nl.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	return &endpoint.Endpoint{ID: id, IfName: name, IfIndex: link.Attrs().Index, IPv4: netip.MustParseAddr(ip)}
}

func routeTo(t *testing.T, nl *netlink.Handle, ip string) *netlink.Route {
	t.Helper()
	routes, err := nl.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: hostNet(netip.MustParseAddr(ip))}, netlink.RT_FILTER_DST)
	if err != nil {
		t.Fatal(err)
	}
	if len(routes) == 0 {
		return nil
	}
	return &routes[0]
}

func readSysctl(t *testing.T, ns *testutil.NS, path string) string {
	t.Helper()
	var v []byte
	if err := ns.Do(func() error {
		var err error
		v, err = os.ReadFile(path)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(v))
}

func TestLinuxInitGateway(t *testing.T) {
	gw := netip.MustParseAddr("10.244.40.1")
	l, _, nl := newTestLinux(t, LinuxConfig{Gateways: []netip.Addr{gw}, GatewayDevice: "mbt_gw"})
	if err := l.Init(context.Background()); err != nil {
		t.Fatalf("second Init: %v", err)
	}
	link, err := nl.LinkByName("mbt_gw")
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := nl.AddrList(link, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 || addrs[0].IPNet.String() != "10.244.40.1/32" {
		t.Fatalf("gateway addresses = %v, %v", addrs, err)
	}
}

func TestLinuxRealizeCheckRemove(t *testing.T) {
	l, host, nl := newTestLinux(t, LinuxConfig{TeardownDelay: time.Hour})
	ep := addVeth(t, nl, 7, "lxctest0000001", "10.244.41.5")
	ctx := context.Background()
	for range 2 { // idempotent
		if _, err := l.Realize(ctx, ep, 1); err != nil {
			t.Fatalf("Realize: %v", err)
		}
	}
	r := routeTo(t, nl, "10.244.41.5")
	if r == nil || r.LinkIndex != ep.IfIndex || r.Scope != netlink.SCOPE_LINK {
		t.Fatalf("route = %+v, want 10.244.41.5/32 dev %s scope link", r, ep.IfName)
	}
	for key, want := range map[string]string{"rp_filter": "0", "forwarding": "1"} {
		if got := readSysctl(t, host, "/proc/sys/net/ipv4/conf/"+ep.IfName+"/"+key); got != want {
			t.Errorf("%s = %s, want %s", key, got, want)
		}
	}
	if err := l.Check(ctx, ep); err != nil {
		t.Fatalf("Check: %v", err)
	}

	for range 2 { // removing twice is success
		if err := l.Remove(ctx, ep); err != nil {
			t.Fatalf("Remove: %v", err)
		}
	}
	// Once Remove returned: no route, the host veth down under its
	// tombstone name, the attachment's name free.
	if r := routeTo(t, nl, "10.244.41.5"); r != nil {
		t.Fatalf("route %+v left after Remove", r)
	}
	link, err := nl.LinkByIndex(ep.IfIndex)
	if err != nil {
		t.Fatal("host veth deleted before the teardown delay")
	}
	if name := link.Attrs().Name; name != ifname.Tombstone(ep.IfIndex) || link.Attrs().Flags&net.FlagUp != 0 {
		t.Fatalf("host veth after Remove: %s, flags %v; want %s, down", name, link.Attrs().Flags, ifname.Tombstone(ep.IfIndex))
	}
	if _, err := nl.LinkByName(ep.IfName); err == nil {
		t.Fatalf("%s still names a link after Remove", ep.IfName)
	}
	if l.PendingTeardowns() != 1 {
		t.Fatalf("pending teardowns = %d, want 1", l.PendingTeardowns())
	}
	if err := l.Close(); err != nil { // runs pending teardowns
		t.Fatal(err)
	}
	if _, err := host.Netlink(t).LinkByIndex(ep.IfIndex); err == nil {
		t.Fatal("host veth left after Close ran the pending teardown")
	}
}

// TestLinuxRealizeHostDown: a removal sets the host veth down before it
// renames it to its tombstone, and removes the endpoint's state only
// after; an agent killed between the two restores the endpoint with its
// veth down under its own name. Realizing it brings the veth back up
// (the kernel refuses a route to a down device with ENETDOWN, and the
// restored endpoint would retry that forever).
func TestLinuxRealizeHostDown(t *testing.T) {
	l, _, nl := newTestLinux(t, LinuxConfig{TeardownDelay: time.Hour})
	ep := addVeth(t, nl, 7, "lxctest0000002", "10.244.41.6")
	ctx := context.Background()
	if _, err := l.Realize(ctx, ep, 1); err != nil {
		t.Fatalf("Realize: %v", err)
	}
	link, err := nl.LinkByIndex(ep.IfIndex)
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkSetDown(link); err != nil { // tombstone's first step
		t.Fatal(err)
	}
	if r := routeTo(t, nl, "10.244.41.6"); r != nil {
		t.Fatalf("route %+v kept on a down device", r)
	}
	restored, err := NewLinux(l.cfg, slog.New(slog.NewTextHandler(io.Discard, nil))) // the restarted agent's datapath
	if err != nil {
		t.Fatal(err)
	}
	if err := restored.Init(ctx); err != nil {
		t.Fatalf("Init: %v", err)
	}
	t.Cleanup(func() { _ = restored.Close() })
	if err := restored.Check(ctx, ep); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if _, err := restored.Realize(ctx, ep, 1); err != nil {
		t.Fatalf("Realize after the veth was set down: %v", err)
	}
	if link, err = nl.LinkByIndex(ep.IfIndex); err != nil || link.Attrs().Flags&net.FlagUp == 0 || link.Attrs().Name != ep.IfName {
		t.Fatalf("host veth after Realize: %v, %v; want %s up", link, err, ep.IfName)
	}
	if r := routeTo(t, nl, "10.244.41.6"); r == nil || r.LinkIndex != ep.IfIndex {
		t.Fatalf("route = %+v, want 10.244.41.6/32 dev %s", r, ep.IfName)
	}
}

func TestLinuxDeferredTeardown(t *testing.T) {
	l, _, nl := newTestLinux(t, LinuxConfig{TeardownDelay: 50 * time.Millisecond, EndpointTCX: true})
	var mu sync.Mutex
	var ops []string
	l.SetHooks(LinuxHooks{Submit: func(op string, fn func(context.Context) error) {
		mu.Lock()
		ops = append(ops, op)
		mu.Unlock()
		go func() { _ = fn(context.Background()) }()
	}})
	ep := addVeth(t, nl, 8, "lxctest0000002", "10.244.41.6")
	ctx := context.Background()
	if _, err := l.Realize(ctx, ep, 1); err != nil {
		t.Fatal(err)
	}
	if err := l.Remove(ctx, ep); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the host veth to be torn down", func() bool {
		_, err := nl.LinkByIndex(ep.IfIndex)
		return err != nil
	})
	mu.Lock()
	defer mu.Unlock()
	if len(ops) != 2 || ops[0] != "bpf-detach" || ops[1] != "teardown" {
		t.Fatalf("submitted ops = %v, want bpf-detach and teardown through the pool", ops)
	}
	if err := l.Check(ctx, ep); !errors.Is(err, ErrEndpointMissing) {
		t.Fatalf("Check of a removed interface = %v, want ErrEndpointMissing", err)
	}
	if _, err := l.Realize(ctx, ep, 2); !errors.Is(err, ErrEndpointMissing) {
		t.Fatalf("Realize of a removed interface = %v, want ErrEndpointMissing", err)
	}
}

func TestLinuxEndpointWithoutInterface(t *testing.T) {
	l, _, _ := newTestLinux(t, LinuxConfig{})
	ep := &endpoint.Endpoint{ID: 3, IPv4: netip.MustParseAddr("10.244.41.9")}
	ctx := context.Background()
	if _, err := l.Realize(ctx, ep, 1); err != nil {
		t.Fatalf("Realize: %v", err)
	}
	if err := l.Check(ctx, ep); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if err := l.Remove(ctx, ep); err != nil {
		t.Fatalf("Remove: %v", err)
	}
}

func TestLinuxClosed(t *testing.T) {
	l, _, nl := newTestLinux(t, LinuxConfig{})
	ep := addVeth(t, nl, 9, "lxctest0000005", "10.244.41.10")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Realize(context.Background(), ep, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Realize after Close = %v, want ErrClosed", err)
	}
}

func TestLinuxConfigValidate(t *testing.T) {
	if _, err := NewLinux(LinuxConfig{GatewayDevice: "a-very-long-device-name"}, slog.Default()); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("NewLinux with a 23-byte device name = %v", err)
	}
}

// TestLinuxIPv6: on a dual-stack node Init turns on IPv6 forwarding and
// proxy_ndp (and IPv4 forwarding) and puts the IPv6 gateway on the
// gateway device; Realize gives an IPv6 endpoint its /128 route, a
// permanent neighbour entry with the pod's MAC and a proxy entry for the
// gateway on its host veth, with no proxy delay; removing the endpoint
// drops the route and the neighbour entry. An IPv6-only node leaves IPv4
// forwarding alone.
func TestLinuxIPv6(t *testing.T) {
	gw4, gw6 := netip.MustParseAddr("10.244.42.1"), netip.MustParseAddr("fd00:42::1")
	l, host, nl := newTestLinux(t, LinuxConfig{TeardownDelay: time.Hour, GatewayDevice: "mbt_gw6", Gateways: []netip.Addr{gw4, gw6}})
	for _, p := range []string{"/proc/sys/net/ipv4/conf/all/forwarding", "/proc/sys/net/ipv6/conf/all/forwarding", "/proc/sys/net/ipv6/conf/all/proxy_ndp"} {
		if v := readSysctl(t, host, p); v != "1" {
			t.Fatalf("%s = %s after Init, want 1", p, v)
		}
	}
	gwLink, err := nl.LinkByName("mbt_gw6")
	if err != nil {
		t.Fatal(err)
	}
	if addrs, err := nl.AddrList(gwLink, netlink.FAMILY_V6); err != nil || !slices.ContainsFunc(addrs, func(a netlink.Addr) bool { return a.IPNet.String() == "fd00:42::1/128" }) {
		t.Fatalf("gateway device's IPv6 addresses = %v, %v; want fd00:42::1/128", addrs, err)
	}

	ep := addVeth(t, nl, 9, "lxctest0000006", "10.244.42.5")
	ep.IPv6, ep.MAC = netip.MustParseAddr("fd00:42::5"), "02:00:00:00:42:05"
	for range 2 { // idempotent
		if _, err := l.Realize(context.Background(), ep, 1); err != nil {
			t.Fatalf("Realize: %v", err)
		}
	}
	routes, err := nl.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Dst: hostNet(ep.IPv6)}, netlink.RT_FILTER_DST)
	if err != nil || len(routes) != 1 || routes[0].LinkIndex != ep.IfIndex {
		t.Fatalf("routes to %s = %v, %v; want one through %s", ep.IPv6, routes, err, ep.IfName)
	}
	neigh := func() (perm, proxy bool) {
		t.Helper()
		ns, err := nl.NeighList(ep.IfIndex, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range ns {
			perm = perm || (n.IP.Equal(ep.IPv6.AsSlice()) && n.State == netlink.NUD_PERMANENT && n.HardwareAddr.String() == ep.MAC)
		}
		px, err := nl.NeighProxyList(ep.IfIndex, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range px {
			proxy = proxy || n.IP.Equal(gw6.AsSlice())
		}
		return perm, proxy
	}
	if perm, proxy := neigh(); !perm || !proxy {
		t.Fatalf("neighbours on %s: permanent %s -> %s %v, proxy %s %v; want both", ep.IfName, ep.IPv6, ep.MAC, perm, gw6, proxy)
	}
	if v := readSysctl(t, host, "/proc/sys/net/ipv6/neigh/"+ep.IfName+"/proxy_delay"); v != "0" {
		t.Fatalf("proxy_delay of %s = %s, want 0", ep.IfName, v)
	}
	if err := l.Remove(context.Background(), ep); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the IPv6 route and neighbour to go", func() bool {
		routes, _ := nl.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Dst: hostNet(ep.IPv6)}, netlink.RT_FILTER_DST)
		perm, _ := neigh()
		return len(routes) == 0 && !perm
	})
}

// TestLinuxIPv6OnlyForwarding: a node with only IPv6 gateways turns on
// IPv6 forwarding and leaves IPv4 forwarding as it was (off here: a new
// netns may inherit the machine's IPv4 setting, so the test turns it off
// first).
func TestLinuxIPv6OnlyForwarding(t *testing.T) {
	testutil.RequireRoot(t)
	host := testutil.NewNS(t, "mbt-dp6")
	if err := host.Do(func() error { return os.WriteFile("/proc/sys/net/ipv4/conf/all/forwarding", []byte("0"), 0) }); err != nil {
		t.Fatal(err)
	}
	l, err := NewLinux(LinuxConfig{HostNetns: host.Path, BPFFS: testutil.BPFFSDir(t), GatewayDevice: "mbt_gw6o",
		Gateways: []netip.Addr{netip.MustParseAddr("fd00:43::1")}}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	if err := l.Init(context.Background()); err != nil {
		t.Fatalf("Init: %v", err)
	}
	if v := readSysctl(t, host, "/proc/sys/net/ipv6/conf/all/forwarding"); v != "1" {
		t.Fatalf("ipv6 forwarding = %s, want 1", v)
	}
	if v := readSysctl(t, host, "/proc/sys/net/ipv4/conf/all/forwarding"); v != "0" {
		t.Fatalf("ipv4 forwarding = %s on an IPv6-only node, want it untouched (0)", v)
	}
}

// TestLinuxForeignInterfaces: the datapath realises and deletes only
// veths of the plugin's pattern. An endpoint naming the host's eth0 (a
// tampered record or queued deletion) is refused by Realize and left
// alone by Remove, and a non-veth link of the pattern survives Remove.
func TestLinuxForeignInterfaces(t *testing.T) {
	l, _, nl := newTestLinux(t, LinuxConfig{TeardownDelay: -1})
	ctx := context.Background()
	addBridge := func(name string) netlink.Link {
		t.Helper()
		attrs := netlink.NewLinkAttrs()
		attrs.Name = name
		// A bridge: this kernel may lack the dummy driver.
		if err := nl.LinkAdd(&netlink.Bridge{LinkAttrs: attrs}); err != nil {
			t.Fatalf("add bridge %s: %v", name, err)
		}
		link, err := nl.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		return link
	}
	eth0 := addBridge("eth0")
	fake := addBridge("lxc0000bridge")
	foreign := &endpoint.Endpoint{ID: 11, IfName: "eth0", IPv4: netip.MustParseAddr("10.244.43.1")}
	if _, err := l.Realize(ctx, foreign, 1); !errors.Is(err, ErrForeignInterface) {
		t.Fatalf("Realize naming eth0 = %v, want ErrForeignInterface", err)
	}
	byIndex := &endpoint.Endpoint{ID: 15, IfIndex: eth0.Attrs().Index, IPv4: netip.MustParseAddr("10.244.43.2")}
	if _, err := l.Realize(ctx, byIndex, 1); !errors.Is(err, ErrForeignInterface) {
		t.Fatalf("Realize by eth0's index = %v, want ErrForeignInterface", err)
	}
	for _, ep := range []*endpoint.Endpoint{
		foreign,
		{ID: 12, IfName: "eth0", IfIndex: eth0.Attrs().Index},
		{ID: 13, IfName: "lxc0000bridge"},
		{ID: 14, IfName: "lxc0000bridge", IfIndex: fake.Attrs().Index},
		byIndex,
	} {
		if err := l.Remove(ctx, ep); err != nil {
			t.Fatalf("Remove %+v: %v", ep, err)
		}
	}
	other := addVeth(t, nl, 16, "vethforeign1", "10.244.43.3") // a veth, not of the pattern
	if err := l.Remove(ctx, &endpoint.Endpoint{ID: 16, IfIndex: other.IfIndex}); err != nil {
		t.Fatalf("Remove by a foreign veth's index: %v", err)
	}
	for _, name := range []string{"eth0", "lxc0000bridge", "vethforeign1"} {
		if _, err := nl.LinkByName(name); err != nil {
			t.Errorf("%s after Remove: %v (deleted a link membrane did not create)", name, err)
		}
	}
}
