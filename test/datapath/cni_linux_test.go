package datapath_test

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
	"github.com/membrane-cni/membrane/test/nodeharness"
)

// podIP returns the address of the ADD's result and checks its shape.
func podIP(t *testing.T, res *types100.Result, p *nodeharness.Pod, gw netip.Addr) netip.Addr {
	t.Helper()
	if len(res.Interfaces) != 2 || res.Interfaces[1].Name != "eth0" || res.Interfaces[1].Sandbox != p.NS.Path {
		t.Fatalf("result interfaces = %+v", res.Interfaces)
	}
	host, _ := cni.VethNames(p.RT.ContainerID, p.RT.IfName)
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
func verifyPod(t *testing.T, p *nodeharness.Pod, ip, gw netip.Addr) {
	t.Helper()
	nl := p.NS.Netlink(t)
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
	startAgent(e, nil)
	gw := netip.MustParseAddr("10.244.10.1")
	a, b := e.NewPod("web-a"), e.NewPod("web-b")
	resA, resB := e.MustAdd(a), e.MustAdd(b)
	ipA, ipB := podIP(t, resA, a, gw), podIP(t, resB, b, gw)
	verifyPod(t, a, ipA, gw)
	verifyPod(t, b, ipB, gw)

	// The agent knows both endpoints, ready, with what the plugin sent.
	ep, err := e.Client().EndpointGet(context.Background(), "container-id:"+a.RT.ContainerID)
	if err != nil {
		t.Fatal(err)
	}
	host, _ := cni.VethNames(a.RT.ContainerID, a.RT.IfName)
	if ep.State != "ready" || ep.InterfaceName != host || ep.InterfaceIndex == 0 || ep.Netns != a.NS.Path ||
		ep.K8sNamespace != "default" || ep.K8sPodName != "web-a" || ep.Addressing.IPv4 != ipA.String() ||
		ep.ContainerInterfaceName != "eth0" || ep.Mac != resA.Interfaces[1].Mac || ep.HostMac != resA.Interfaces[0].Mac {
		t.Fatalf("endpoint = %+v", ep)
	}

	// Pods reach each other and the gateway.
	for _, target := range []string{ipB.String(), gw.String()} {
		if out, err := a.NS.Exec("ping", "-c", "1", "-W", "5", target); err != nil {
			t.Fatalf("ping %s from pod a: %v\n%s", target, err, out)
		}
	}
	if out, err := b.NS.Exec("ping", "-c", "1", "-W", "5", ipA.String()); err != nil {
		t.Fatalf("ping pod a from pod b: %v\n%s", err, out)
	}

	if err := e.Check(a); err != nil {
		t.Fatalf("CHECK: %v", err)
	}

	// DEL releases the endpoint and the address at once; the host veth
	// goes lazily; a second DEL is success.
	for i := range 2 {
		if err := e.Del(a); err != nil {
			t.Fatalf("DEL #%d: %v", i+1, err)
		}
	}
	if _, err := e.Client().EndpointGet(context.Background(), "container-id:"+a.RT.ContainerID); err == nil {
		t.Fatal("endpoint still exists after DEL")
	}
	if allocated(t, e, ipA) {
		t.Fatalf("%s still allocated after DEL", ipA)
	}
	testutil.Eventually(t, "host veth of pod a to go", func() bool { return !hostLinkExists(t, e, a) })

	// CHECK of a deleted attachment fails; pod b is untouched.
	if err := e.Check(b); err != nil {
		t.Fatalf("CHECK of pod b: %v", err)
	}
	if err := e.Del(b); err != nil {
		t.Fatalf("DEL b: %v", err)
	}
}

// TestWithoutKubernetes: a runtime that sends no K8S_* args (cnitool,
// podman) still gets an endpoint, labelled with the network's name.
func TestWithoutKubernetes(t *testing.T) {
	e := newEnv(t, "10.244.20.0/24")
	startAgent(e, nil)
	p := e.NewPod("plain")
	p.RT.Args = nil
	e.MustAdd(p)
	ep, err := e.Client().EndpointGet(context.Background(), "container-id:"+p.RT.ContainerID)
	if err != nil || ep.State != "ready" || len(ep.Labels) != 1 || ep.Labels[0] != "cni:network="+e.Network {
		t.Fatalf("endpoint = %+v, %v", ep, err)
	}
	if err := e.Del(p); err != nil {
		t.Fatal(err)
	}
}

// TestReAddSameNetns: DEL frees CNI_IFNAME in a netns the runtime keeps
// and the host veth's name (both ends renamed to their tombstones, the
// pair's deletion deferred), so an ADD in the same netns starts clean; an ADD the runtime repeats without a DEL
// (a retry after a partial failure or a lost answer) replaces the
// attachment instead of failing.
func TestReAddSameNetns(t *testing.T) {
	e := newEnv(t, "10.244.11.0/24")
	startAgent(e, func(c *agent.Config) { c.Linux.TeardownDelay = time.Hour })
	gw := netip.MustParseAddr("10.244.11.1")
	p := e.NewPod("retry")
	e.MustAdd(p)
	if err := e.Del(p); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if _, err := p.NS.Netlink(t).LinkByName("eth0"); err == nil {
		t.Fatal("eth0 still in the pod's netns after DEL")
	}
	if hostLinkExists(t, e, p) {
		t.Fatal("host veth's name still taken after DEL")
	}
	first := podIP(t, e.MustAdd(p), p, gw)

	// ADD again, no DEL: the attachment is replaced.
	res, err := e.Add(p)
	if err != nil {
		t.Fatalf("repeated ADD: %v", err)
	}
	second := podIP(t, res, p, gw)
	verifyPod(t, p, second, gw)
	if out, err := p.NS.Exec("ping", "-c", "1", "-W", "5", gw.String()); err != nil {
		t.Fatalf("ping gateway after repeated ADD: %v\n%s", err, out)
	}
	if err := e.Check(p); err != nil {
		t.Fatalf("CHECK after repeated ADD: %v", err)
	}
	eps, err := e.Client().EndpointList(context.Background(), nil)
	if err != nil || len(eps) != 1 || eps[0].Addressing == nil || eps[0].Addressing.IPv4 != second.String() {
		t.Fatalf("endpoints after repeated ADD = %+v, %v; want one with %s", eps, err, second)
	}
	if first != second && allocated(t, e, first) {
		t.Fatalf("address %s of the replaced attachment still allocated", first)
	}
}

// TestMultipleAttachments: one container ID with two CNI_IFNAMEs (Multus)
// gets two attachments, each with its own veth, address and endpoint, and
// each deleted alone.
func TestMultipleAttachments(t *testing.T) {
	e := newEnv(t, "10.244.22.0/24")
	startAgent(e, nil)
	eth0 := e.NewPod("multi")
	net1 := &nodeharness.Pod{Namespace: eth0.Namespace, Name: eth0.Name, NS: eth0.NS, RT: &libcni.RuntimeConf{ContainerID: eth0.RT.ContainerID, NetNS: eth0.RT.NetNS, IfName: "net1", Args: eth0.RT.Args}}
	r0, r1 := e.MustAdd(eth0), e.MustAdd(net1)
	if len(r1.Interfaces) != 2 || r1.Interfaces[1].Name != "net1" || r0.Interfaces[0].Name == r1.Interfaces[0].Name {
		t.Fatalf("results: eth0 %+v, net1 %+v", r0.Interfaces, r1.Interfaces)
	}
	if r0.IPs[0].Address.IP.Equal(r1.IPs[0].Address.IP) {
		t.Fatalf("both attachments got %s", r0.IPs[0].Address.IP)
	}
	if eps, err := e.Client().EndpointList(context.Background(), nil); err != nil || len(eps) != 2 {
		t.Fatalf("endpoints = %+v, %v; want 2", eps, err)
	}
	for _, p := range []*nodeharness.Pod{eth0, net1} {
		if err := e.Check(p); err != nil {
			t.Fatalf("CHECK %s: %v", p.RT.IfName, err)
		}
	}
	if err := e.Del(net1); err != nil {
		t.Fatalf("DEL net1: %v", err)
	}
	nl := eth0.NS.Netlink(t)
	if _, err := nl.LinkByName("net1"); err == nil {
		t.Fatal("net1 still in the pod after its DEL")
	}
	if _, err := nl.LinkByName("eth0"); err != nil {
		t.Fatalf("eth0 after net1's DEL: %v", err)
	}
	if err := e.Check(eth0); err != nil {
		t.Fatalf("CHECK eth0 after net1's DEL: %v", err)
	}
	if err := e.Del(eth0); err != nil {
		t.Fatalf("DEL eth0: %v", err)
	}
	if eps, err := e.Client().EndpointList(context.Background(), nil); err != nil || len(eps) != 0 {
		t.Fatalf("endpoints after both DELs = %+v, %v", eps, err)
	}
}

// TestDelWhileAgentDown: a DEL while the agent is down is queued with
// both of the pod's addresses (dual-stack); the agent drains it at start:
// endpoint, both addresses and host veth go.
func TestDelWhileAgentDown(t *testing.T) {
	e := newEnvStack(t, "10.244.12.0/24", "fd00:244:12::/120")
	startAgent(e, nil)
	p := e.NewPod("queued")
	v4, v6 := podIPs(t, e.MustAdd(p), netip.MustParseAddr("10.244.12.1"), netip.MustParseAddr("fd00:244:12::1"))
	e.StopAgent()

	if err := e.Del(p); err != nil {
		t.Fatalf("DEL with the agent stopped: %v", err)
	}
	paths, err := delqueue.List(e.DeleteQueue)
	if err != nil || len(paths) != 1 {
		t.Fatalf("delete queue = %v, %v; want one entry", paths, err)
	}
	entry, err := delqueue.Read(paths[0])
	if err != nil || entry.ContainerID != p.RT.ContainerID || len(entry.IPs) != 2 || entry.IPs[0] != v4.String() || entry.IPs[1] != v6.String() {
		t.Fatalf("queued entry = %+v, %v; want addresses %s and %s", entry, err, v4, v6)
	}
	if _, err := p.NS.Netlink(t).LinkByName("eth0"); err == nil {
		t.Fatal("eth0 still in the pod after DEL (the netns exists)")
	}

	startAgent(e, nil) // drains the queue before it turns ready
	if paths, _ := delqueue.List(e.DeleteQueue); len(paths) != 0 {
		t.Fatalf("delete queue after start = %v", paths)
	}
	testutil.Eventually(t, "queued deletion to remove the host veth", func() bool { return !hostLinkExists(t, e, p) })
	if _, err := p.NS.Netlink(t).LinkByName("eth0"); err == nil {
		t.Fatal("eth0 still in the pod after the queued deletion")
	}
	if left := allocations(t, e); len(left) != 0 {
		t.Fatalf("allocations after the queued deletion = %+v, want neither %s nor %s", left, v4, v6)
	}
}

func TestDeleteQueueFull(t *testing.T) {
	e := newEnv(t, "10.244.13.0/24")
	for i := range delqueue.MaxEntries {
		if _, err := delqueue.Write(e.DeleteQueue, &delqueue.Entry{ContainerID: "old" + strings.Repeat("x", i%3) + string(rune('a'+i%26)) + itoa(i), IfName: "eth0"}); err != nil {
			t.Fatal(err)
		}
	}
	p := e.NewPod("full")
	err := e.Del(p) // no agent
	if nodeharness.Code(err) != types.ErrTryAgainLater {
		t.Fatalf("DEL with a full queue = %v, want code 11", err)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestAddFailureRollsBack(t *testing.T) {
	t.Run("ipam exhausted", func(t *testing.T) {
		e := newEnv(t, "10.244.14.0/30") // one allocatable address
		startAgent(e, nil)
		first := e.NewPod("first")
		e.MustAdd(first)
		p := e.NewPod("second")
		_, err := e.Add(p)
		if nodeharness.Code(err) != cni.CodeIPAMExhausted {
			t.Fatalf("ADD = %v, want code %d", err, cni.CodeIPAMExhausted)
		}
		assertNothingLeft(t, e, p)
		if err := e.Status(); nodeharness.Code(err) != types.ErrPluginNotAvailable {
			t.Fatalf("STATUS with an exhausted pool = %v, want 50", err)
		}
	})
	t.Run("agent gone", func(t *testing.T) {
		e := newEnv(t, "10.244.15.0/24")
		p := e.NewPod("orphan")
		_, err := e.Add(p)
		if nodeharness.Code(err) != cni.CodeAgentUnreachable {
			t.Fatalf("ADD = %v, want code %d", err, cni.CodeAgentUnreachable)
		}
		assertNothingLeft(t, e, p)
	})
	t.Run("interface name taken in the netns is replaced", func(t *testing.T) {
		e := newEnv(t, "10.244.21.0/24")
		startAgent(e, nil)
		p := e.NewPod("taken")
		nl := p.NS.Netlink(t)
		attrs := netlink.NewLinkAttrs()
		attrs.Name = "eth0"
		if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "other0"}); err != nil {
			t.Fatal(err)
		}
		// As Cilium's ADD: the existing CNI_IFNAME is deleted first.
		res, err := e.Add(p)
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
		startAgent(e, func(c *agent.Config) { c.Datapath, c.Fake = "fake", fake })
		p := e.NewPod("broken")
		_, err := e.Add(p)
		if nodeharness.Code(err) != cni.CodeAgentError {
			t.Fatalf("ADD = %v, want code %d", err, cni.CodeAgentError)
		}
		assertNothingLeft(t, e, p)
		st, err := e.Client().IPAMStatus(context.Background())
		if err != nil || len(st.IPv4.Allocations) != 0 {
			t.Fatalf("allocations after failed ADD = %+v, %v", st.IPv4.Allocations, err)
		}
	})
	t.Run("configure fails while the endpoint is created", func(t *testing.T) {
		e := newEnv(t, "10.244.22.0/24")
		startAgent(e, nil)
		p := e.NewPod("noroute")
		// A default route already in the pod's netns: the ADD's own
		// default route fails (EEXIST), while its endpoint PUT runs.
		nl := p.NS.Netlink(t)
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
		if _, err := e.Add(p); err == nil || !strings.Contains(err.Error(), "default route") {
			t.Fatalf("ADD with a default route taken = %v, want a default-route error", err)
		}
		if hostLinkExists(t, e, p) {
			t.Fatal("host veth left behind")
		}
		if _, err := nl.LinkByName("eth0"); err == nil {
			t.Fatal("eth0 left in the pod's netns")
		}
		if _, err := e.Client().EndpointGet(context.Background(), "container-id:"+p.RT.ContainerID); err == nil {
			t.Fatal("endpoint left behind")
		}
		st, err := e.Client().IPAMStatus(context.Background())
		if err != nil || len(st.IPv4.Allocations) != 0 {
			t.Fatalf("allocations after failed ADD = %+v, %v", st.IPv4.Allocations, err)
		}
	})
}

// assertNothingLeft checks a failed ADD left no veth and no endpoint.
func assertNothingLeft(t *testing.T, e *nodeharness.Node, p *nodeharness.Pod) {
	t.Helper()
	if hostLinkExists(t, e, p) {
		t.Fatal("host veth left behind")
	}
	links, err := p.NS.Netlink(t).LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if l.Attrs().Name != "lo" {
			t.Fatalf("interface %s left in the pod's netns", l.Attrs().Name)
		}
	}
	if e.Agent != nil {
		if _, err := e.Client().EndpointGet(context.Background(), "container-id:"+p.RT.ContainerID); err == nil {
			t.Fatal("endpoint left behind")
		}
	}
}

func TestStatusAndGC(t *testing.T) {
	e := newEnv(t, "10.244.17.0/24")
	if err := e.Status(); nodeharness.Code(err) != types.ErrPluginNotAvailable {
		t.Fatalf("STATUS without agent = %v, want 50", err)
	}
	startAgent(e, nil)
	if err := e.Status(); err != nil {
		t.Fatalf("STATUS: %v", err)
	}
	keep, drop := e.NewPod("keep"), e.NewPod("drop")
	e.MustAdd(keep)
	resDrop := e.MustAdd(drop)
	dropIP := podIP(t, resDrop, drop, netip.MustParseAddr("10.244.17.1"))

	if err := e.GC(keep); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if _, err := e.Client().EndpointGet(context.Background(), "container-id:"+drop.RT.ContainerID); err == nil {
		t.Fatal("GC kept the endpoint of an attachment not listed")
	}
	if allocated(t, e, dropIP) {
		t.Fatalf("GC kept %s allocated", dropIP)
	}
	testutil.Eventually(t, "GC'd host veth to go", func() bool { return !hostLinkExists(t, e, drop) })
	if err := e.Check(keep); err != nil {
		t.Fatalf("CHECK of the kept pod after GC: %v", err)
	}
}

// TestInterfaceVanishes: when a pod's netns disappears without a DEL,
// the agent's garbage collector deletes the endpoint (two passes) and
// frees its addresses, both families.
func TestInterfaceVanishes(t *testing.T) {
	e := newEnvStack(t, "10.244.18.0/24", "fd00:244:18::/120")
	startAgent(e, nil)
	p := e.NewPod("vanish")
	v4, v6 := podIPs(t, e.MustAdd(p), netip.MustParseAddr("10.244.18.1"), netip.MustParseAddr("fd00:244:18::1"))
	if err := p.NS.Remove(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the endpoint to be deleted", func() bool {
		_, err := e.Client().EndpointGet(context.Background(), "container-id:"+p.RT.ContainerID)
		return err != nil
	})
	testutil.Eventually(t, "the addresses to be released", func() bool { return !allocated(t, e, v4) && !allocated(t, e, v6) })
}

// TestSpecVersions: every supported version, dual-stack: the result is
// in the version asked for and lists both addresses with their gateways.
func TestSpecVersions(t *testing.T) {
	e := newEnvStack(t, "10.244.19.0/24", "fd00:244:19::/120")
	startAgent(e, nil)
	gw4, gw6 := netip.MustParseAddr("10.244.19.1"), netip.MustParseAddr("fd00:244:19::1")
	for _, v := range cni.SupportedVersions {
		t.Run(v, func(t *testing.T) {
			e.Conf = e.Conflist(v)
			p := e.NewPod("v" + strings.ReplaceAll(v, ".", ""))
			var raw types.Result
			if err := e.Do(func(ctx context.Context) (err error) {
				raw, err = e.CNI().AddNetworkList(ctx, e.Conf, p.RT)
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
				if err := e.Check(p); err != nil {
					t.Fatalf("CHECK: %v", err)
				}
			}
			if err := e.Del(p); err != nil {
				t.Fatalf("DEL: %v", err)
			}
		})
	}
}
