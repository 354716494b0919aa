package datapath

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// Gateways of the source-check tests' pods.
var (
	spoofGW4 = netip.MustParseAddr("10.244.61.1")
	spoofGW6 = netip.MustParseAddr("fd00:61::1")
)

// stackPod is a pod of the source-check tests: its endpoint, its netns
// and its host veth.
type stackPod struct {
	*testPod
	host netlink.Link
	ll   netip.Addr // the host veth's link-local address
}

// addStackPod wires a pod with the addresses given ("" for none): a /32
// routed through spoofGW4, a /128 (no duplicate address detection)
// routed through the host veth's link-local address. The host netns
// must have accept_dad off.
func addStackPod(t *testing.T, hostNL *netlink.Handle, id endpoint.ID, ident identity.NumericIdentity, v4, v6 string) *stackPod {
	t.Helper()
	pod := testutil.NewNS(t, "mbt-src")
	if err := pod.Do(func() error { return os.WriteFile("/proc/sys/net/ipv6/conf/default/accept_dad", []byte("0"), 0) }); err != nil {
		t.Fatal(err)
	}
	host := podVeth(t, hostNL, pod)
	nl := pod.Netlink(t)
	eth0, err := nl.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkSetUp(eth0); err != nil {
		t.Fatal(err)
	}
	ep := &endpoint.Endpoint{ID: id, Identity: ident, IfName: host.Attrs().Name, IfIndex: host.Attrs().Index}
	idx := eth0.Attrs().Index
	if v4 != "" {
		ep.IPv4 = netip.MustParseAddr(v4)
		steps := []error{
			nl.AddrAdd(eth0, &netlink.Addr{IPNet: hostNet(ep.IPv4)}),
			nl.RouteAdd(&netlink.Route{LinkIndex: idx, Dst: hostNet(spoofGW4), Scope: netlink.SCOPE_LINK}),
			nl.RouteAdd(&netlink.Route{LinkIndex: idx, Gw: spoofGW4.AsSlice()}),
		}
		if err := errors.Join(steps...); err != nil {
			t.Fatalf("configure pod ipv4: %v", err)
		}
	}
	p := &stackPod{testPod: &testPod{ns: pod, ep: ep}, host: host, ll: linkLocal(t, hostNL, host)}
	if v6 != "" {
		ep.IPv6 = netip.MustParseAddr(v6)
		steps := []error{
			nl.AddrAdd(eth0, &netlink.Addr{IPNet: hostNet(ep.IPv6), Flags: unix.IFA_F_NODAD}),
			nl.RouteAdd(&netlink.Route{LinkIndex: idx, Gw: p.ll.AsSlice()}),
		}
		if err := errors.Join(steps...); err != nil {
			t.Fatalf("configure pod ipv6: %v", err)
		}
	}
	return p
}

// spoofAddr adds addr to the pod's eth0 (a /32 or a /128 without DAD),
// so that its sockets can bind to it, and a route of its family through
// the host if the pod has none; permanent neighbour entries for the
// gateways spare the pod ARP and neighbour discovery from that address
// (which the programs would drop as well).
func (p *stackPod) spoofAddr(t *testing.T, addr netip.Addr) {
	t.Helper()
	nl := p.ns.Netlink(t)
	eth0, err := nl.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	idx, mac := eth0.Attrs().Index, p.host.Attrs().HardwareAddr
	a := &netlink.Addr{IPNet: hostNet(addr)}
	gw, fam := p.ll, netlink.FAMILY_V6
	if addr.Is4() {
		gw, fam = spoofGW4, netlink.FAMILY_V4
	} else {
		a.Flags = unix.IFA_F_NODAD
	}
	steps := []error{nl.AddrAdd(eth0, a),
		nl.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: fam, State: netlink.NUD_PERMANENT, IP: gw.AsSlice(), HardwareAddr: mac})}
	if addr.Is4() && !p.ep.IPv4.IsValid() {
		steps = append(steps, nl.RouteAdd(&netlink.Route{LinkIndex: idx, Dst: hostNet(spoofGW4), Scope: netlink.SCOPE_LINK}),
			nl.RouteAdd(&netlink.Route{LinkIndex: idx, Gw: spoofGW4.AsSlice()}))
	}
	if addr.Is6() && !p.ep.IPv6.IsValid() {
		steps = append(steps, nl.RouteAdd(&netlink.Route{LinkIndex: idx, Gw: p.ll.AsSlice()}))
	}
	if err := errors.Join(steps...); err != nil {
		t.Fatalf("spoof address %s: %v", addr, err)
	}
}

// sendUDP sends payload from src (bound) to dst:port inside the pod.
func (p *stackPod) sendUDP(t *testing.T, src, dst netip.Addr, port int, payload string) {
	t.Helper()
	err := p.ns.Do(func() error {
		c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)),
			net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, uint16(port))))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte(payload))
		return err
	})
	if err != nil {
		t.Fatalf("send %q from %s to %s:%d: %v", payload, src, dst, port, err)
	}
}

// udpSink receives datagrams on a pod's addresses.
type udpSink struct {
	mu   sync.Mutex
	got  []string
	port int
}

// listenUDP receives datagrams on every address of the pod at port until
// t ends.
func listenUDP(t *testing.T, p *stackPod, port int) *udpSink {
	t.Helper()
	s := &udpSink{port: port}
	var c *net.UDPConn
	if err := p.ns.Do(func() error {
		var err error
		c, err = net.ListenUDP("udp", &net.UDPAddr{Port: port})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 256)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.got = append(s.got, string(buf[:n]))
			s.mu.Unlock()
		}
	}()
	return s
}

// received reports whether payload arrived, and lists what arrived.
func (s *udpSink) received(payload string) (bool, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.got {
		if g == payload {
			return true, copyOf(s.got)
		}
	}
	return false, copyOf(s.got)
}

func copyOf(in []string) []string { return append([]string(nil), in...) }

// srcEnv is a node of the source-check tests: a dual-stack pod, an
// IPv4-only pod, an IPv6-only pod and a dual-stack target.
type srcEnv struct {
	*e2eEnv
	dual, v4, v6, dst *stackPod
	sink              *udpSink
	n                 int // payload sequence
}

func newSrcEnv(t *testing.T, cfg LinuxConfig) *srcEnv {
	t.Helper()
	cfg.Gateways, cfg.GatewayDevice, cfg.TeardownDelay = []netip.Addr{spoofGW4, spoofGW6}, "mbt_gwsrc", -1
	l, host, nl := newTestLinux(t, cfg)
	if err := host.Do(func() error { return os.WriteFile("/proc/sys/net/ipv6/conf/default/accept_dad", []byte("0"), 0) }); err != nil {
		t.Fatal(err)
	}
	e := &srcEnv{e2eEnv: &e2eEnv{t: t, l: l, host: host, nl: nl, drops: &dropLog{}}}
	l.SetHooks(LinuxHooks{OnDrop: e.drops.add})
	e.dual = addStackPod(t, nl, 31, 3001, "10.244.61.11", "fd00:61::11")
	e.v4 = addStackPod(t, nl, 32, 3002, "10.244.61.12", "")
	e.v6 = addStackPod(t, nl, 33, 3003, "", "fd00:61::13")
	e.dst = addStackPod(t, nl, 34, 3004, "10.244.61.14", "fd00:61::14")
	for _, p := range e.pods() {
		for _, a := range []netip.Addr{p.ep.IPv4, p.ep.IPv6} {
			if a.IsValid() {
				if err := l.UpsertIPCache(context.Background(), netip.PrefixFrom(a, a.BitLen()), p.ep.Identity, netip.Addr{}); err != nil {
					t.Fatal(err)
				}
			}
		}
		e.realize(p.testPod)
	}
	e.sink = listenUDP(t, e.dst, 9999)
	return e
}

func (e *srcEnv) pods() []*stackPod { return []*stackPod{e.dual, e.v4, e.v6, e.dst} }

// mustPass sends a datagram from p's src to the target's address of its
// family, which must arrive.
func (e *srcEnv) mustPass(p *stackPod, src netip.Addr) {
	e.t.Helper()
	e.n++
	payload := fmt.Sprintf("pass-%d-%s", e.n, src)
	p.sendUDP(e.t, src, e.dstAddr(src), e.sink.port, payload)
	testutil.Eventually(e.t, payload+" at the target", func() bool { ok, _ := e.sink.received(payload); return ok })
}

// mustDrop sends a datagram from p's src, which the programs must drop
// as invalid-source: notified and counted under p's endpoint, and never
// delivered (a datagram from p's own address sent after it arrives
// alone).
func (e *srcEnv) mustDrop(p *stackPod, src netip.Addr) {
	e.t.Helper()
	before := e.dropCount(p.ep.ID, DropInvalidSource, policy.Egress)
	e.n++
	payload := fmt.Sprintf("spoof-%d-%s", e.n, src)
	dst := e.dstAddr(src)
	p.sendUDP(e.t, src, dst, e.sink.port, payload)
	e.waitDrop(DropEvent{Endpoint: p.ep.ID, Reason: DropInvalidSource, Dir: policy.Egress, Src: src, Dst: dst,
		DstPort: uint16(e.sink.port), Proto: policy.ProtoUDP})
	if after := e.dropCount(p.ep.ID, DropInvalidSource, policy.Egress); after <= before {
		e.t.Fatalf("endpoint %d invalid-source drops %d -> %d, want more", p.ep.ID, before, after)
	}
	if own := p.ep.IPv4; own.IsValid() {
		e.mustPass(p, own)
	} else {
		e.mustPass(p, p.ep.IPv6)
	}
	if ok, got := e.sink.received(payload); ok {
		e.t.Fatalf("spoofed %q delivered (target got %q)", payload, got)
	}
}

func (e *srcEnv) dstAddr(src netip.Addr) netip.Addr {
	if src.Is4() {
		return e.dst.ep.IPv4
	}
	return e.dst.ep.IPv6
}

// TestBPFSourceSpoofingDropped: on real veths, a pod's datagrams from its
// own addresses arrive; from another pod's address (bound to a second
// address inside the pod), or of a family the pod has no address of,
// they are dropped as invalid-source, notified and counted under the
// pod's endpoint; a dual-stack and both single-stack pods; neighbour
// discovery from the pod's link-local address still resolves (other
// link-local traffic is dropped); after an
// agent restart (same build: the attachments are adopted) the check
// still holds.
func TestBPFSourceSpoofingDropped(t *testing.T) {
	for _, tcx := range []bool{false, true} {
		t.Run(map[bool]string{false: "tc", true: "tcx"}[tcx], func(t *testing.T) { testSourceSpoofing(t, tcx) })
	}
}

func testSourceSpoofing(t *testing.T, tcx bool) {
	e := newSrcEnv(t, LinuxConfig{EndpointTCX: tcx})
	// Own addresses pass (the IPv6-only pod resolves its gateway, the
	// host veth's link-local address, by neighbour discovery).
	e.mustPass(e.dual, e.dual.ep.IPv4)
	e.mustPass(e.dual, e.dual.ep.IPv6)
	e.mustPass(e.v4, e.v4.ep.IPv4)
	e.mustPass(e.v6, e.v6.ep.IPv6)
	for _, p := range e.pods() {
		if n := e.dropCount(p.ep.ID, DropInvalidSource, policy.Egress); n != 0 {
			t.Fatalf("endpoint %d: %d invalid-source drops of its own traffic", p.ep.ID, n)
		}
	}
	e.neighbourResolves(e.v6)

	// Another pod's address, and a family without an address.
	e.dual.spoofAddr(t, e.v4.ep.IPv4)
	e.dual.spoofAddr(t, e.v6.ep.IPv6)
	e.mustDrop(e.dual, e.v4.ep.IPv4)
	e.mustDrop(e.dual, e.v6.ep.IPv6)
	e.v4.spoofAddr(t, netip.MustParseAddr("fd00:61::99"))
	e.mustDrop(e.v4, netip.MustParseAddr("fd00:61::99"))
	e.v6.spoofAddr(t, netip.MustParseAddr("10.244.61.99"))
	e.mustDrop(e.v6, netip.MustParseAddr("10.244.61.99"))
	if n := e.dropCount(0, DropNoEndpoint, policy.Egress); n != 0 {
		t.Fatalf("%d no-endpoint drops, want none", n)
	}
	if n := e.dropCount(e.dst.ep.ID, DropInvalidSource, policy.Egress); n != 0 {
		t.Fatalf("the target (its neighbour discovery, its port unreachables) dropped as invalid-source %d times", n)
	}

	// An agent restart of the same build adopts the attachments; the
	// entries keep the addresses and the check holds.
	e.l = reopen(t, e.l)
	e.l.SetHooks(LinuxHooks{OnDrop: e.drops.add})
	for _, p := range e.pods() {
		e.realize(p.testPod)
		e.attachedNode(p.testPod)
		v, ok := endpointEntry(t, e.l, p.ep.IfIndex)
		if !ok || infoAddrs(v) != addrsOf(p.ep) {
			t.Fatalf("endpoint %d entry after restart: %+v (%v), want addresses %+v", p.ep.ID, v, ok, addrsOf(p.ep))
		}
	}
	e.mustDrop(e.dual, e.v4.ep.IPv4)
	e.mustDrop(e.dual, e.v6.ep.IPv6)
	e.mustPass(e.dual, e.dual.ep.IPv6)
}

// neighbourResolves flushes the pod's neighbour entry of the host veth's
// link-local address and sends a datagram to that address from the
// pod's link-local one: the pod's neighbour solicitation (from
// fe80::/10) must reach the host, whose advertisement resolves the
// entry; the datagram itself, link-local traffic that is not neighbour
// discovery, is dropped as invalid-source.
func (e *srcEnv) neighbourResolves(p *stackPod) {
	e.t.Helper()
	nl := p.ns.Netlink(e.t)
	eth0, err := nl.LinkByName("eth0")
	if err != nil {
		e.t.Fatal(err)
	}
	n := &netlink.Neigh{LinkIndex: eth0.Attrs().Index, Family: netlink.FAMILY_V6, IP: p.ll.AsSlice()}
	if err := nl.NeighDel(n); err != nil && !errors.Is(err, unix.ENOENT) {
		e.t.Fatalf("flush neighbour %s: %v", p.ll, err)
	}
	dst := netip.AddrPortFrom(p.ll.WithZone("eth0"), 9)
	if err := p.ns.Do(func() error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("ndp"))
		return err
	}); err != nil {
		e.t.Fatalf("send to %s: %v", dst, err)
	}
	want := p.host.Attrs().HardwareAddr.String()
	testutil.Eventually(e.t, "the pod's neighbour entry of "+p.ll.String(), func() bool {
		ns, err := nl.NeighList(eth0.Attrs().Index, netlink.FAMILY_V6)
		for _, x := range ns {
			ip, _ := netip.AddrFromSlice(x.IP)
			if err == nil && ip == p.ll && strings.EqualFold(x.HardwareAddr.String(), want) &&
				x.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_DELAY|netlink.NUD_PROBE) != 0 {
				return true
			}
		}
		return false
	})
	var src netip.Addr
	testutil.Eventually(e.t, "the link-local datagram's invalid-source drop", func() bool {
		e.drops.mu.Lock()
		defer e.drops.mu.Unlock()
		for _, ev := range e.drops.events {
			if ev.Endpoint == p.ep.ID && ev.Reason == DropInvalidSource && ev.Dst == p.ll && ev.DstPort == 9 {
				src = ev.Src
				return true
			}
		}
		return false
	})
	if !src.IsLinkLocalUnicast() {
		e.t.Fatalf("link-local datagram dropped with source %s, want the pod's link-local address", src)
	}
}

// TestBPFEndpointsMapLayoutUpgrade: an agent started on a node whose
// pinned endpoints map has the layout before the addresses (16-byte
// values) does not fail: it replaces the map with one of today's layout,
// carrying the entries over (the running programs keep their own map and
// the pods' slots stay, so traffic flows before the endpoints are
// realised again), and the realised endpoints enforce their sources.
func TestBPFEndpointsMapLayoutUpgrade(t *testing.T) {
	for _, tcx := range []bool{false, true} {
		t.Run(map[bool]string{false: "tc", true: "tcx"}[tcx], func(t *testing.T) { testLayoutUpgrade(t, tcx) })
	}
}

func testLayoutUpgrade(t *testing.T, tcx bool) {
	e := newSrcEnv(t, LinuxConfig{EndpointTCX: tcx})
	slots := map[endpoint.ID]uint32{}
	for _, p := range e.pods() {
		slots[p.ep.ID] = slotOf(e.l, p.ep.ID)
	}
	pinOldLayout(t, filepath.Join(e.l.cfg.BPFFS, pinEndpointInfo))
	objectDigest = func() string { return "before-addresses" }
	t.Cleanup(func() { objectDigest = bpf.EndpointObjectDigest })
	e.l = reopen(t, e.l)
	e.l.SetHooks(LinuxHooks{OnDrop: e.drops.add})
	if vs := e.l.bpf.maps.endpoints.ValueSize(); vs != uint32(binary.Size(bpf.EndpointEndpointInfo{})) {
		t.Fatalf("endpoints map value size %d after the upgrade", vs)
	}
	for _, p := range e.pods() {
		v, ok := endpointEntry(t, e.l, p.ep.IfIndex)
		if !ok || v.Id != uint32(p.ep.ID) || v.Identity != uint32(p.ep.Identity) || v.Slot != slots[p.ep.ID] || v.Flags != 0 {
			t.Fatalf("endpoint %d entry carried over as %+v (%v), want its identity and slot %d, no addresses", p.ep.ID, v, ok, slots[p.ep.ID])
		}
	}
	// The previous programs still run, on their own map: traffic flows.
	e.mustPass(e.dual, e.dual.ep.IPv4)
	e.mustPass(e.v6, e.v6.ep.IPv6)
	for _, p := range e.pods() {
		e.realize(p.testPod)
		e.attachedNode(p.testPod)
		if got := slotOf(e.l, p.ep.ID); got != slots[p.ep.ID] {
			t.Fatalf("endpoint %d slot %d after the upgrade, want its %d", p.ep.ID, got, slots[p.ep.ID])
		}
		if v, _ := endpointEntry(t, e.l, p.ep.IfIndex); infoAddrs(v) != addrsOf(p.ep) {
			t.Fatalf("endpoint %d entry %+v, want addresses %+v", p.ep.ID, v, addrsOf(p.ep))
		}
	}
	e.dual.spoofAddr(t, e.v4.ep.IPv4)
	e.mustDrop(e.dual, e.v4.ep.IPv4)
	e.mustPass(e.dual, e.dual.ep.IPv6)
	e.mustPass(e.v4, e.v4.ep.IPv4)
	if n := e.dropCount(0, DropNoEndpoint, policy.Egress) + e.dropCount(0, DropNoEndpoint, policy.Ingress); n != 0 {
		t.Fatalf("%d no-endpoint drops across the upgrade, want none", n)
	}
}

// pinOldLayout replaces the endpoints map pinned at path with one of the
// layout before the addresses ({id, identity, slot, flags}) holding the
// same entries, as a previous build left it. The programs keep the map
// they were loaded with.
func pinOldLayout(t *testing.T, path string) {
	t.Helper()
	cur, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: "endpoints", Type: ebpf.Hash, KeySize: 4, ValueSize: oldEndpointInfoSize,
		MaxEntries: cur.MaxEntries(), Flags: cur.Flags()})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	var k uint32
	var v bpf.EndpointEndpointInfo
	it := cur.Iterate()
	for it.Next(&k, &v) {
		b := binary.NativeEndian.AppendUint32(nil, v.Id)
		b = binary.NativeEndian.AppendUint32(b, v.Identity)
		b = binary.NativeEndian.AppendUint32(b, v.Slot)
		b = binary.NativeEndian.AppendUint32(b, 0)
		if err := old.Put(k, b); err != nil {
			t.Fatal(err)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := old.Pin(path); err != nil {
		t.Fatal(err)
	}
}
