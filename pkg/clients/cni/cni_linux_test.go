package cni_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/cni"
	"github.com/membrane-cni/membrane/pkg/clients/cni/delqueue"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// podIP returns the address of the ADD's result and checks its shape.
func podIP(t *testing.T, res *types100.Result, p *pod, gw netip.Addr) netip.Addr {
	t.Helper()
	if len(res.Interfaces) != 2 || res.Interfaces[1].Name != "eth0" || res.Interfaces[1].Sandbox != p.ns.Path {
		t.Fatalf("result interfaces = %+v", res.Interfaces)
	}
	host, _ := cni.VethNames(p.rt.ContainerID, p.rt.IfName)
	if res.Interfaces[0].Name != host || res.Interfaces[0].Sandbox != "" {
		t.Fatalf("result host interface = %+v, want %s", res.Interfaces[0], host)
	}
	if len(res.IPs) != 1 || res.IPs[0].Interface == nil || *res.IPs[0].Interface != 1 {
		t.Fatalf("result ips = %+v", res.IPs)
	}
	if got := res.IPs[0].Gateway.String(); got != gw.String() {
		t.Fatalf("result gateway = %s, want %s", got, gw)
	}
	if ones, _ := res.IPs[0].Address.Mask.Size(); ones != 32 {
		t.Fatalf("result address %s is not a /32", res.IPs[0].Address.String())
	}
	if len(res.Routes) != 2 {
		t.Fatalf("result routes = %v", res.Routes)
	}
	ip, _ := netip.AddrFromSlice(res.IPs[0].Address.IP.To4())
	return ip
}

// verifyPod checks eth0 inside the pod's netns: up, MTU, the /32, the
// link route to the gateway and the default route via it.
func verifyPod(t *testing.T, p *pod, ip, gw netip.Addr) {
	t.Helper()
	nl := p.ns.Netlink(t)
	link, err := nl.LinkByName("eth0")
	if err != nil {
		t.Fatalf("eth0 in pod: %v", err)
	}
	if link.Attrs().MTU != 1400 || link.Attrs().Flags&net.FlagUp == 0 || link.Type() != "veth" {
		t.Fatalf("eth0 = mtu %d flags %v type %s", link.Attrs().MTU, link.Attrs().Flags, link.Type())
	}
	addrs, err := nl.AddrList(link, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 || addrs[0].IPNet.String() != ip.String()+"/32" {
		t.Fatalf("eth0 addresses = %v, %v; want %s/32", addrs, err, ip)
	}
	routes, err := nl.RouteList(link, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var linkRoute, defRoute bool
	for _, r := range routes {
		if r.Dst != nil && r.Dst.String() == gw.String()+"/32" && r.Scope == netlink.SCOPE_LINK {
			linkRoute = true
		}
		if (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw.String() == gw.String() {
			defRoute = true
		}
	}
	if !linkRoute || !defRoute {
		t.Fatalf("eth0 routes = %v; want %s/32 scope link and default via %s", routes, gw, gw)
	}
}

func TestAddCheckDel(t *testing.T) {
	e := newEnv(t, "10.244.10.0/24")
	e.startAgent(nil)
	gw := netip.MustParseAddr("10.244.10.1")
	a, b := e.newPod("web-a"), e.newPod("web-b")
	resA, resB := e.mustAdd(a), e.mustAdd(b)
	ipA, ipB := podIP(t, resA, a, gw), podIP(t, resB, b, gw)
	verifyPod(t, a, ipA, gw)
	verifyPod(t, b, ipB, gw)

	// The agent knows both endpoints, ready, with what the plugin sent.
	ep, err := e.client().EndpointGet(context.Background(), "container-id:"+a.rt.ContainerID)
	if err != nil {
		t.Fatal(err)
	}
	host, _ := cni.VethNames(a.rt.ContainerID, a.rt.IfName)
	if ep.State != "ready" || ep.InterfaceName != host || ep.InterfaceIndex == 0 || ep.Netns != a.ns.Path ||
		ep.K8sNamespace != "default" || ep.K8sPodName != "web-a" || ep.Addressing.IPv4 != ipA.String() ||
		ep.ContainerInterfaceName != "eth0" || ep.Mac != resA.Interfaces[1].Mac || ep.HostMac != resA.Interfaces[0].Mac {
		t.Fatalf("endpoint = %+v", ep)
	}

	// Pods reach each other and the gateway.
	for _, target := range []string{ipB.String(), gw.String()} {
		if out, err := a.ns.Exec("ping", "-c", "1", "-W", "5", target); err != nil {
			t.Fatalf("ping %s from pod a: %v\n%s", target, err, out)
		}
	}
	if out, err := b.ns.Exec("ping", "-c", "1", "-W", "5", ipA.String()); err != nil {
		t.Fatalf("ping pod a from pod b: %v\n%s", err, out)
	}

	if err := e.check(a); err != nil {
		t.Fatalf("CHECK: %v", err)
	}

	// DEL releases the endpoint and the address at once; the host veth
	// goes lazily; a second DEL is success.
	for i := range 2 {
		if err := e.del(a); err != nil {
			t.Fatalf("DEL #%d: %v", i+1, err)
		}
	}
	if _, err := e.client().EndpointGet(context.Background(), "container-id:"+a.rt.ContainerID); err == nil {
		t.Fatal("endpoint still exists after DEL")
	}
	if e.allocated(ipA) {
		t.Fatalf("%s still allocated after DEL", ipA)
	}
	testutil.Eventually(t, "host veth of pod a to go", func() bool { return !e.hostLinkExists(a) })

	// CHECK of a deleted attachment fails; pod b is untouched.
	if err := e.check(b); err != nil {
		t.Fatalf("CHECK of pod b: %v", err)
	}
	if err := e.del(b); err != nil {
		t.Fatalf("DEL b: %v", err)
	}
}

// TestWithoutKubernetes: a runtime that sends no K8S_* args (cnitool,
// podman) still gets an endpoint, labelled with the network's name.
func TestWithoutKubernetes(t *testing.T) {
	e := newEnv(t, "10.244.20.0/24")
	e.startAgent(nil)
	p := e.newPod("plain")
	p.rt.Args = nil
	e.mustAdd(p)
	ep, err := e.client().EndpointGet(context.Background(), "container-id:"+p.rt.ContainerID)
	if err != nil || ep.State != "ready" || len(ep.Labels) != 1 || ep.Labels[0] != "cni:network="+e.network {
		t.Fatalf("endpoint = %+v, %v", ep, err)
	}
	if err := e.del(p); err != nil {
		t.Fatal(err)
	}
}

// TestReAddSameNetns: DEL deletes CNI_IFNAME in a netns the runtime
// keeps (and with it the pair, whatever the teardown delay), so an ADD in
// the same netns starts clean; an ADD the runtime repeats without a DEL
// (a retry after a partial failure or a lost answer) replaces the
// attachment instead of failing.
func TestReAddSameNetns(t *testing.T) {
	e := newEnv(t, "10.244.11.0/24")
	e.startAgent(func(c *agent.Config) { c.Linux.TeardownDelay = time.Hour })
	gw := netip.MustParseAddr("10.244.11.1")
	p := e.newPod("retry")
	e.mustAdd(p)
	if err := e.del(p); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if _, err := p.ns.Netlink(t).LinkByName("eth0"); err == nil {
		t.Fatal("eth0 still in the pod's netns after DEL")
	}
	if e.hostLinkExists(p) {
		t.Fatal("host veth still there after DEL deleted its peer")
	}
	first := podIP(t, e.mustAdd(p), p, gw)

	// ADD again, no DEL: the attachment is replaced.
	res, err := e.add(p)
	if err != nil {
		t.Fatalf("repeated ADD: %v", err)
	}
	second := podIP(t, res, p, gw)
	verifyPod(t, p, second, gw)
	if out, err := p.ns.Exec("ping", "-c", "1", "-W", "5", gw.String()); err != nil {
		t.Fatalf("ping gateway after repeated ADD: %v\n%s", err, out)
	}
	if err := e.check(p); err != nil {
		t.Fatalf("CHECK after repeated ADD: %v", err)
	}
	eps, err := e.client().EndpointList(context.Background(), nil)
	if err != nil || len(eps) != 1 || eps[0].Addressing == nil || eps[0].Addressing.IPv4 != second.String() {
		t.Fatalf("endpoints after repeated ADD = %+v, %v; want one with %s", eps, err, second)
	}
	if first != second && e.allocated(first) {
		t.Fatalf("address %s of the replaced attachment still allocated", first)
	}
}

// TestMultipleAttachments: one container ID with two CNI_IFNAMEs (Multus)
// gets two attachments, each with its own veth, address and endpoint, and
// each deleted alone.
func TestMultipleAttachments(t *testing.T) {
	e := newEnv(t, "10.244.22.0/24")
	e.startAgent(nil)
	eth0 := e.newPod("multi")
	net1 := &pod{ns: eth0.ns, rt: &libcni.RuntimeConf{ContainerID: eth0.rt.ContainerID, NetNS: eth0.rt.NetNS, IfName: "net1", Args: eth0.rt.Args}}
	r0, r1 := e.mustAdd(eth0), e.mustAdd(net1)
	if len(r1.Interfaces) != 2 || r1.Interfaces[1].Name != "net1" || r0.Interfaces[0].Name == r1.Interfaces[0].Name {
		t.Fatalf("results: eth0 %+v, net1 %+v", r0.Interfaces, r1.Interfaces)
	}
	if r0.IPs[0].Address.IP.Equal(r1.IPs[0].Address.IP) {
		t.Fatalf("both attachments got %s", r0.IPs[0].Address.IP)
	}
	if eps, err := e.client().EndpointList(context.Background(), nil); err != nil || len(eps) != 2 {
		t.Fatalf("endpoints = %+v, %v; want 2", eps, err)
	}
	for _, p := range []*pod{eth0, net1} {
		if err := e.check(p); err != nil {
			t.Fatalf("CHECK %s: %v", p.rt.IfName, err)
		}
	}
	if err := e.del(net1); err != nil {
		t.Fatalf("DEL net1: %v", err)
	}
	nl := eth0.ns.Netlink(t)
	if _, err := nl.LinkByName("net1"); err == nil {
		t.Fatal("net1 still in the pod after its DEL")
	}
	if _, err := nl.LinkByName("eth0"); err != nil {
		t.Fatalf("eth0 after net1's DEL: %v", err)
	}
	if err := e.check(eth0); err != nil {
		t.Fatalf("CHECK eth0 after net1's DEL: %v", err)
	}
	if err := e.del(eth0); err != nil {
		t.Fatalf("DEL eth0: %v", err)
	}
	if eps, err := e.client().EndpointList(context.Background(), nil); err != nil || len(eps) != 0 {
		t.Fatalf("endpoints after both DELs = %+v, %v", eps, err)
	}
}

// TestDelWhileAgentDown: a DEL while the agent is down is queued with
// both of the pod's addresses (dual-stack); the agent drains it at start:
// endpoint, both addresses and host veth go.
func TestDelWhileAgentDown(t *testing.T) {
	e := newEnvStack(t, "10.244.12.0/24", "fd00:244:12::/120")
	e.startAgent(nil)
	p := e.newPod("queued")
	v4, v6 := podIPs(t, e.mustAdd(p), netip.MustParseAddr("10.244.12.1"), netip.MustParseAddr("fd00:244:12::1"))
	e.stopAgent()

	if err := e.del(p); err != nil {
		t.Fatalf("DEL with the agent stopped: %v", err)
	}
	paths, err := delqueue.List(e.queue)
	if err != nil || len(paths) != 1 {
		t.Fatalf("delete queue = %v, %v; want one entry", paths, err)
	}
	entry, err := delqueue.Read(paths[0])
	if err != nil || entry.ContainerID != p.rt.ContainerID || len(entry.IPs) != 2 || entry.IPs[0] != v4.String() || entry.IPs[1] != v6.String() {
		t.Fatalf("queued entry = %+v, %v; want addresses %s and %s", entry, err, v4, v6)
	}
	if _, err := p.ns.Netlink(t).LinkByName("eth0"); err == nil {
		t.Fatal("eth0 still in the pod after DEL (the netns exists)")
	}

	e.startAgent(nil) // drains the queue before it turns ready
	if paths, _ := delqueue.List(e.queue); len(paths) != 0 {
		t.Fatalf("delete queue after start = %v", paths)
	}
	testutil.Eventually(t, "queued deletion to remove the host veth", func() bool { return !e.hostLinkExists(p) })
	if _, err := p.ns.Netlink(t).LinkByName("eth0"); err == nil {
		t.Fatal("eth0 still in the pod after the queued deletion")
	}
	if left := e.allocations(); len(left) != 0 {
		t.Fatalf("allocations after the queued deletion = %+v, want neither %s nor %s", left, v4, v6)
	}
}

func TestDeleteQueueFull(t *testing.T) {
	e := newEnv(t, "10.244.13.0/24")
	for i := range delqueue.MaxEntries {
		if _, err := delqueue.Write(e.queue, &delqueue.Entry{ContainerID: "old" + strings.Repeat("x", i%3) + string(rune('a'+i%26)) + itoa(i), IfName: "eth0"}); err != nil {
			t.Fatal(err)
		}
	}
	p := e.newPod("full")
	err := e.del(p) // no agent
	if cniCode(err) != types.ErrTryAgainLater {
		t.Fatalf("DEL with a full queue = %v, want code 11", err)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestAddFailureRollsBack(t *testing.T) {
	t.Run("ipam exhausted", func(t *testing.T) {
		e := newEnv(t, "10.244.14.0/30") // one allocatable address
		e.startAgent(nil)
		first := e.newPod("first")
		e.mustAdd(first)
		p := e.newPod("second")
		_, err := e.add(p)
		if cniCode(err) != cni.CodeIPAMExhausted {
			t.Fatalf("ADD = %v, want code %d", err, cni.CodeIPAMExhausted)
		}
		assertNothingLeft(t, e, p)
		if err := e.status(); cniCode(err) != types.ErrPluginNotAvailable {
			t.Fatalf("STATUS with an exhausted pool = %v, want 50", err)
		}
	})
	t.Run("agent gone", func(t *testing.T) {
		e := newEnv(t, "10.244.15.0/24")
		p := e.newPod("orphan")
		_, err := e.add(p)
		if cniCode(err) != cni.CodeAgentUnreachable {
			t.Fatalf("ADD = %v, want code %d", err, cni.CodeAgentUnreachable)
		}
		assertNothingLeft(t, e, p)
	})
	t.Run("interface name taken in the netns is replaced", func(t *testing.T) {
		e := newEnv(t, "10.244.21.0/24")
		e.startAgent(nil)
		p := e.newPod("taken")
		nl := p.ns.Netlink(t)
		attrs := netlink.NewLinkAttrs()
		attrs.Name = "eth0"
		if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "other0"}); err != nil {
			t.Fatal(err)
		}
		// As Cilium's ADD: the existing CNI_IFNAME is deleted first.
		res, err := e.add(p)
		if err != nil {
			t.Fatalf("ADD over an existing eth0: %v", err)
		}
		gw := netip.MustParseAddr("10.244.21.1")
		verifyPod(t, p, podIP(t, res, p, gw), gw)
		if _, err := nl.LinkByName("other0"); err == nil {
			t.Fatal("the old eth0's peer survived: the old eth0 was not deleted")
		}
	})
	t.Run("endpoint fails after veth and address", func(t *testing.T) {
		e := newEnv(t, "10.244.16.0/24")
		fake := datapath.NewFake(1)
		fake.Set(datapath.FakeHooks{BeforeRealize: func(context.Context, *endpoint.Endpoint, uint64) error {
			return errors.New("injected")
		}})
		e.startAgent(func(c *agent.Config) { c.Datapath, c.Fake = "fake", fake })
		p := e.newPod("broken")
		_, err := e.add(p)
		if cniCode(err) != cni.CodeAgentError {
			t.Fatalf("ADD = %v, want code %d", err, cni.CodeAgentError)
		}
		assertNothingLeft(t, e, p)
		st, err := e.client().IPAMStatus(context.Background())
		if err != nil || len(st.IPv4.Allocations) != 0 {
			t.Fatalf("allocations after failed ADD = %+v, %v", st.IPv4.Allocations, err)
		}
	})
	t.Run("configure fails while the endpoint is created", func(t *testing.T) {
		e := newEnv(t, "10.244.22.0/24")
		e.startAgent(nil)
		p := e.newPod("noroute")
		// A default route already in the pod's netns: the ADD's own
		// default route fails (EEXIST), while its endpoint PUT runs.
		nl := p.ns.Netlink(t)
		attrs := netlink.NewLinkAttrs()
		attrs.Name = "side0"
		if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "side1"}); err != nil {
			t.Fatal(err)
		}
		d, err := nl.LinkByName("side0")
		if err != nil {
			t.Fatal(err)
		}
		if err := nl.LinkSetUp(d); err != nil {
			t.Fatal(err)
		}
		if err := nl.RouteAdd(&netlink.Route{LinkIndex: d.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}, Scope: netlink.SCOPE_LINK}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.add(p); err == nil || !strings.Contains(err.Error(), "default route") {
			t.Fatalf("ADD with a default route taken = %v, want a default-route error", err)
		}
		if e.hostLinkExists(p) {
			t.Fatal("host veth left behind")
		}
		if _, err := nl.LinkByName("eth0"); err == nil {
			t.Fatal("eth0 left in the pod's netns")
		}
		if _, err := e.client().EndpointGet(context.Background(), "container-id:"+p.rt.ContainerID); err == nil {
			t.Fatal("endpoint left behind")
		}
		st, err := e.client().IPAMStatus(context.Background())
		if err != nil || len(st.IPv4.Allocations) != 0 {
			t.Fatalf("allocations after failed ADD = %+v, %v", st.IPv4.Allocations, err)
		}
	})
}

// assertNothingLeft checks a failed ADD left no veth and no endpoint.
func assertNothingLeft(t *testing.T, e *env, p *pod) {
	t.Helper()
	if e.hostLinkExists(p) {
		t.Fatal("host veth left behind")
	}
	links, err := p.ns.Netlink(t).LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if l.Attrs().Name != "lo" {
			t.Fatalf("interface %s left in the pod's netns", l.Attrs().Name)
		}
	}
	if e.agent != nil {
		if _, err := e.client().EndpointGet(context.Background(), "container-id:"+p.rt.ContainerID); err == nil {
			t.Fatal("endpoint left behind")
		}
	}
}

func TestStatusAndGC(t *testing.T) {
	e := newEnv(t, "10.244.17.0/24")
	if err := e.status(); cniCode(err) != types.ErrPluginNotAvailable {
		t.Fatalf("STATUS without agent = %v, want 50", err)
	}
	e.startAgent(nil)
	if err := e.status(); err != nil {
		t.Fatalf("STATUS: %v", err)
	}
	keep, drop := e.newPod("keep"), e.newPod("drop")
	e.mustAdd(keep)
	resDrop := e.mustAdd(drop)
	dropIP := podIP(t, resDrop, drop, netip.MustParseAddr("10.244.17.1"))

	if err := e.gc(keep); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if _, err := e.client().EndpointGet(context.Background(), "container-id:"+drop.rt.ContainerID); err == nil {
		t.Fatal("GC kept the endpoint of an attachment not listed")
	}
	if e.allocated(dropIP) {
		t.Fatalf("GC kept %s allocated", dropIP)
	}
	testutil.Eventually(t, "GC'd host veth to go", func() bool { return !e.hostLinkExists(drop) })
	if err := e.check(keep); err != nil {
		t.Fatalf("CHECK of the kept pod after GC: %v", err)
	}
}

// TestInterfaceVanishes: when a pod's netns disappears without a DEL,
// the agent's garbage collector deletes the endpoint (two passes) and
// frees its addresses, both families.
func TestInterfaceVanishes(t *testing.T) {
	e := newEnvStack(t, "10.244.18.0/24", "fd00:244:18::/120")
	e.startAgent(nil)
	p := e.newPod("vanish")
	v4, v6 := podIPs(t, e.mustAdd(p), netip.MustParseAddr("10.244.18.1"), netip.MustParseAddr("fd00:244:18::1"))
	if err := p.ns.Remove(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the endpoint to be deleted", func() bool {
		_, err := e.client().EndpointGet(context.Background(), "container-id:"+p.rt.ContainerID)
		return err != nil
	})
	testutil.Eventually(t, "the addresses to be released", func() bool { return !e.allocated(v4) && !e.allocated(v6) })
}

// TestSpecVersions: every supported version, dual-stack: the result is
// in the version asked for and lists both addresses with their gateways.
func TestSpecVersions(t *testing.T) {
	e := newEnvStack(t, "10.244.19.0/24", "fd00:244:19::/120")
	e.startAgent(nil)
	gw4, gw6 := netip.MustParseAddr("10.244.19.1"), netip.MustParseAddr("fd00:244:19::1")
	for _, v := range cni.SupportedVersions {
		t.Run(v, func(t *testing.T) {
			e.conf = e.conflist(v)
			p := e.newPod("v" + strings.ReplaceAll(v, ".", ""))
			var raw types.Result
			if err := e.inHost(func(ctx context.Context) (err error) {
				raw, err = e.cni.AddNetworkList(ctx, e.conf, p.rt)
				return err
			}); err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if raw.Version() != v {
				t.Fatalf("result version %s, want %s", raw.Version(), v)
			}
			res, err := types100.NewResultFromResult(raw)
			if err != nil {
				t.Fatal(err)
			}
			podIPs(t, res, gw4, gw6)
			if v != "0.3.1" {
				if err := e.check(p); err != nil {
					t.Fatalf("CHECK: %v", err)
				}
			}
			if err := e.del(p); err != nil {
				t.Fatalf("DEL: %v", err)
			}
		})
	}
}
