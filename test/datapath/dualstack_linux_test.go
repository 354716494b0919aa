package datapath_test

import (
	"context"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/pkg/clients/cni"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

// podIPs returns the result's IPv4 and IPv6 address (invalid when
// absent) and checks each against its family's gateway: one entry per
// family on interface 1 (the container's), a host prefix, the gateway,
// and two routes per family.
func podIPs(t *testing.T, res *types100.Result, gw4, gw6 netip.Addr) (v4, v6 netip.Addr) {
	t.Helper()
	want := 0
	for _, gw := range []netip.Addr{gw4, gw6} {
		if gw.IsValid() {
			want++
		}
	}
	if len(res.IPs) != want || len(res.Routes) != 2*want {
		t.Fatalf("result ips %+v routes %v; want %d families", res.IPs, res.Routes, want)
	}
	for _, ipc := range res.IPs {
		ip, _ := netip.AddrFromSlice(ipc.Address.IP)
		ip = ip.Unmap()
		gw := gw4
		if ip.Is6() {
			gw = gw6
		}
		ones, bits := ipc.Address.Mask.Size()
		if ipc.Interface == nil || *ipc.Interface != 1 || ones != ip.BitLen() || bits != ip.BitLen() || ipc.Gateway.String() != gw.String() {
			t.Fatalf("result ip %+v: want interface 1, a host prefix and gateway %s", ipc, gw)
		}
		if ip.Is4() {
			v4 = ip
		} else {
			v6 = ip
		}
	}
	return v4, v6
}

// disableIPv6 turns IPv6 off in the pod's netns, as some runtimes do.
func disableIPv6(t *testing.T, p *nodeharness.Pod) {
	t.Helper()
	err := p.NS.Do(func() error {
		for _, dev := range []string{"all", "default", "lo"} {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+dev+"/disable_ipv6", []byte("1"), 0); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// ipv6Disabled reads disable_ipv6 of dev in the pod's netns.
func ipv6Disabled(t *testing.T, p *nodeharness.Pod, dev string) string {
	t.Helper()
	var v []byte
	if err := p.NS.Do(func() (err error) {
		v, err = os.ReadFile("/proc/sys/net/ipv6/conf/" + dev + "/disable_ipv6")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(v))
}

// mustReach checks ICMPv6/ICMP (ping) and TCP (an echo exchange) from p
// to ip, where a TCP echo listens on port.
func mustReach(t *testing.T, from *nodeharness.Pod, ip netip.Addr, port int) {
	t.Helper()
	if out, err := from.NS.Exec("ping", "-c", "1", "-W", "5", ip.String()); err != nil {
		t.Fatalf("ping %s: %v\n%s", ip, err, out)
	}
	if err := testutil.Exchange(from.NS, ip, port, 5*time.Second); err != nil {
		t.Fatalf("tcp to %s:%d: %v", ip, port, err)
	}
}

// TestDualStackAddCheckDel: on a dual-stack node the plugin gives each
// pod an address of both families (IPv6 turned on in the pod's netns even
// where the runtime turned it off), the result lists both with their
// gateways, pods reach each other and the host over IPv6 (ICMPv6, TCP)
// and IPv4, CHECK verifies both families, and DEL releases both addresses
// (GET /v1/ipam).
func TestDualStackAddCheckDel(t *testing.T) {
	e := newEnvStack(t, "10.244.30.0/24", "fd00:244:30::/120")
	startAgent(e, nil)
	gw4, gw6 := netip.MustParseAddr("10.244.30.1"), netip.MustParseAddr("fd00:244:30::1")
	a, b := e.NewPod("web-a"), e.NewPod("web-b")
	disableIPv6(t, a)
	a4, a6 := podIPs(t, e.MustAdd(a), gw4, gw6)
	b4, b6 := podIPs(t, e.MustAdd(b), gw4, gw6)
	for _, dev := range []string{"lo", "eth0"} {
		if v := ipv6Disabled(t, a, dev); v != "0" {
			t.Fatalf("disable_ipv6 of %s in the pod = %s, want 0", dev, v)
		}
	}
	verifyPod(t, a, a4, gw4)
	verifyPod6(t, a, a6, gw6)

	ep, err := e.Client().EndpointGet(context.Background(), "container-id:"+a.RT.ContainerID)
	if err != nil || ep.Addressing == nil || ep.Addressing.IPv4 != a4.String() || ep.Addressing.IPv6 != a6.String() {
		t.Fatalf("endpoint addressing = %+v, %v; want %s and %s", ep, err, a4, a6)
	}

	// Pod to pod both ways and pod to host, over both families.
	for _, ip := range []netip.Addr{a4, a6} {
		testutil.EchoServer(t, a.NS, ip, 8080)
	}
	for _, ip := range []netip.Addr{b4, b6} {
		testutil.EchoServer(t, b.NS, ip, 8080)
	}
	for _, gw := range []netip.Addr{gw4, gw6} {
		testutil.EchoServer(t, e.NS, gw, 8081)
	}
	mustReach(t, a, b6, 8080)
	mustReach(t, b, a6, 8080)
	mustReach(t, a, gw6, 8081)
	mustReach(t, a, b4, 8080)
	mustReach(t, b, gw4, 8081)

	if err := e.Check(a); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	// CHECK looks at IPv6 too: without the IPv6 address it fails.
	nl := a.NS.Netlink(t)
	eth0, err := nl.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.AddrDel(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: a6.AsSlice(), Mask: net.CIDRMask(128, 128)}}); err != nil {
		t.Fatal(err)
	}
	if err := e.Check(a); nodeharness.Code(err) != cni.CodeCheckFailed || !strings.Contains(err.Error(), a6.String()) {
		t.Fatalf("CHECK without the IPv6 address = %v, want code %d naming %s", err, cni.CodeCheckFailed, a6)
	}

	if err := e.Del(a); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	for _, ip := range []netip.Addr{a4, a6} {
		if allocated(t, e, ip) {
			t.Fatalf("%s still allocated after DEL", ip)
		}
	}
	if !allocated(t, e, b4) || !allocated(t, e, b6) {
		t.Fatalf("pod b's addresses %s, %s released by pod a's DEL", b4, b6)
	}
	if err := e.Del(b); err != nil {
		t.Fatalf("DEL b: %v", err)
	}
	if left := allocations(t, e); len(left) != 0 {
		t.Fatalf("allocations after every DEL = %+v", left)
	}
}

// verifyPod6 checks eth0's IPv6 side: the /128, the link route to the
// gateway and the default route via it.
func verifyPod6(t *testing.T, p *nodeharness.Pod, ip, gw netip.Addr) {
	t.Helper()
	nl := p.NS.Netlink(t)
	link, err := nl.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := nl.AddrList(link, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	var has bool
	for _, a := range addrs {
		has = has || a.IPNet.String() == ip.String()+"/128"
	}
	routes, err := nl.RouteList(link, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	var linkRoute, defRoute bool
	for _, r := range routes {
		linkRoute = linkRoute || (r.Dst != nil && r.Dst.String() == gw.String()+"/128")
		defRoute = defRoute || ((r.Dst == nil || r.Dst.String() == "::/0") && r.Gw.String() == gw.String())
	}
	if !has || !linkRoute || !defRoute {
		t.Fatalf("eth0 ipv6: addresses %v routes %v; want %s/128, %s/128 and default via it", addrs, routes, ip, gw)
	}
}

// TestDualStackAddRollsBack: when the second family fails, the ADD
// releases both addresses (GET /v1/ipam shows none) and leaves nothing.
func TestDualStackAddRollsBack(t *testing.T) {
	t.Run("ipv6 pool exhausted", func(t *testing.T) {
		e := newEnvStack(t, "10.244.31.0/24", "fd00:244:31::/126") // IPv6: 2 addresses
		startAgent(e, nil)
		e.MustAdd(e.NewPod("first"))
		e.MustAdd(e.NewPod("second"))
		before := len(allocations(t, e))
		p := e.NewPod("third")
		if _, err := e.Add(p); nodeharness.Code(err) != cni.CodeIPAMExhausted {
			t.Fatalf("ADD = %v, want code %d", err, cni.CodeIPAMExhausted)
		}
		assertNothingLeft(t, e, p)
		if n := len(allocations(t, e)); n != before {
			t.Fatalf("allocations after the failed ADD = %d, want %d", n, before)
		}
		if err := e.Status(); nodeharness.Code(err) != types.ErrPluginNotAvailable {
			t.Fatalf("STATUS with the IPv6 pool exhausted = %v, want 50", err)
		}
	})
	t.Run("ipv6 configuration fails in the pod", func(t *testing.T) {
		e := newEnvStack(t, "10.244.32.0/24", "fd00:244:32::/120")
		startAgent(e, nil)
		p := e.NewPod("clash")
		// An IPv6 default route already in the pod's netns: the IPv4 side
		// is configured, then adding the IPv6 default route fails.
		nl := p.NS.Netlink(t)
		attrs := netlink.NewLinkAttrs()
		attrs.Name = "other0" // a bridge: kernels may lack the dummy driver
		if err := nl.LinkAdd(&netlink.Bridge{LinkAttrs: attrs}); err != nil {
			t.Fatal(err)
		}
		other, err := nl.LinkByName("other0")
		if err != nil {
			t.Fatal(err)
		}
		if err := nl.LinkSetUp(other); err != nil {
			t.Fatal(err)
		}
		def := &netlink.Route{LinkIndex: other.Attrs().Index, Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}}
		if err := nl.RouteAdd(def); err != nil {
			t.Fatal(err)
		}
		_, err = e.Add(p)
		if nodeharness.Code(err) != cni.CodeKernel || !strings.Contains(err.Error(), "default route via fd00:244:32::1") {
			t.Fatalf("ADD = %v, want code %d about the IPv6 default route", err, cni.CodeKernel)
		}
		if hostLinkExists(t, e, p) {
			t.Fatal("host veth left behind")
		}
		if _, err := nl.LinkByName("eth0"); err == nil {
			t.Fatal("eth0 left in the pod's netns")
		}
		if left := allocations(t, e); len(left) != 0 {
			t.Fatalf("allocations after the failed ADD = %+v, want none of either family", left)
		}
		if _, err := e.Client().EndpointGet(context.Background(), "container-id:"+p.RT.ContainerID); err == nil {
			t.Fatal("endpoint left behind")
		}
	})
}

// TestIPv6OnlyNode: an agent without an IPv4 range (--ipv4-range "")
// serves pods: STATUS succeeds, ADD gives one IPv6 address, pods talk
// over IPv6 to each other and the host, CHECK passes, GC removes an
// attachment not listed and releases its address, DEL releases.
func TestIPv6OnlyNode(t *testing.T) {
	e := newEnvStack(t, "", "fd00:244:33::/120")
	startAgent(e, nil)
	if err := e.Status(); err != nil {
		t.Fatalf("STATUS on an IPv6-only node: %v", err)
	}
	gw6 := netip.MustParseAddr("fd00:244:33::1")
	a, b, c := e.NewPod("v6-a"), e.NewPod("v6-b"), e.NewPod("v6-c")
	_, a6 := podIPs(t, e.MustAdd(a), netip.Addr{}, gw6)
	_, b6 := podIPs(t, e.MustAdd(b), netip.Addr{}, gw6)
	_, c6 := podIPs(t, e.MustAdd(c), netip.Addr{}, gw6)
	testutil.EchoServer(t, b.NS, b6, 8080)
	testutil.EchoServer(t, a.NS, a6, 8080)
	testutil.EchoServer(t, e.NS, gw6, 8081)
	mustReach(t, a, b6, 8080)
	mustReach(t, b, a6, 8080)
	mustReach(t, a, gw6, 8081)
	if err := e.Check(a); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	if err := e.GC(a, b); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if allocated(t, e, c6) {
		t.Fatalf("GC kept %s allocated", c6)
	}
	testutil.Eventually(t, "GC'd host veth to go", func() bool { return !hostLinkExists(t, e, c) })
	for _, p := range []*nodeharness.Pod{a, b} {
		if err := e.Del(p); err != nil {
			t.Fatalf("DEL: %v", err)
		}
	}
	if left := allocations(t, e); len(left) != 0 {
		t.Fatalf("allocations after every DEL = %+v", left)
	}
}
