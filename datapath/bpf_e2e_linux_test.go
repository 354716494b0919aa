package datapath

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// e2eGateway is the pods' gateway in the end-to-end tests.
var e2eGateway = netip.MustParseAddr("10.244.60.1")

// testPod is a pod netns wired to the test host netns as membrane-cni
// wires one: a veth whose peer is eth0 in the pod, a /32 address, a
// route to the gateway and a default route through it.
type testPod struct {
	ns *testutil.NS
	ep *endpoint.Endpoint
}

// podVeth creates a veth lxcbpf<random> in the host netns whose peer is
// eth0 in pod, and sets the host side up.
func podVeth(t *testing.T, hostNL *netlink.Handle, pod *testutil.NS) netlink.Link {
	t.Helper()
	h, err := pod.Handle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	attrs := netlink.NewLinkAttrs()
	attrs.Name = "lxcbpf" + testutil.RandomSuffix(6)
	if err := hostNL.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(h))}); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	host, err := hostNL.LinkByName(attrs.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := hostNL.LinkSetUp(host); err != nil {
		t.Fatal(err)
	}
	return host
}

func addPod(t *testing.T, hostNL *netlink.Handle, id endpoint.ID, ident identity.NumericIdentity, ip string) *testPod {
	t.Helper()
	pod := testutil.NewNS(t, "mbt-pod")
	host := podVeth(t, hostNL, pod)
	attrs := host.Attrs()
	addr := netip.MustParseAddr(ip)
	nl := pod.Netlink(t)
	eth0, err := nl.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	steps := []error{
		nl.AddrAdd(eth0, &netlink.Addr{IPNet: hostNet(addr)}),
		nl.LinkSetUp(eth0),
		nl.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: hostNet(e2eGateway), Scope: netlink.SCOPE_LINK}),
		nl.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: e2eGateway.AsSlice()}),
	}
	if err := errors.Join(steps...); err != nil {
		t.Fatalf("configure pod: %v", err)
	}
	return &testPod{ns: pod, ep: &endpoint.Endpoint{ID: id, Identity: ident, IfName: attrs.Name, IfIndex: host.Attrs().Index, IPv4: addr}}
}

// addr is the pod's address: its IPv4 one, else its IPv6 one.
func (p *testPod) addr() netip.Addr {
	if p.ep.IPv4.IsValid() {
		return p.ep.IPv4
	}
	return p.ep.IPv6
}

// listen starts a TCP echo server on port in the pod, closed by t.Cleanup.
func (p *testPod) listen(t *testing.T, port int) {
	t.Helper()
	testutil.EchoServer(t, p.ns, p.addr(), port)
}

// Bounds of connection attempts (not timing assertions): one that policy
// should drop is given up after dropTimeout; one that should pass has
// connectTimeout on a loaded machine.
const (
	dropTimeout    = 1500 * time.Millisecond
	connectTimeout = 10 * time.Second
)

// talk connects from p to dst:port within timeout and exchanges a
// message both ways.
func (p *testPod) talk(dst *testPod, port int, timeout time.Duration) error {
	return testutil.Exchange(p.ns, dst.addr(), port, timeout)
}

// tcpSYN is the flags byte of a TCP SYN (a refused connection's drops).
const tcpSYN = 0x02

// dropLog collects drop notifications.
type dropLog struct {
	mu     sync.Mutex
	events []DropEvent
}

func (d *dropLog) add(ev DropEvent) {
	d.mu.Lock()
	d.events = append(d.events, ev)
	d.mu.Unlock()
}

// has reports whether a drop matching want (Time ignored) arrived.
func (d *dropLog) has(want DropEvent) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, ev := range d.events {
		ev.Time, ev.SrcPort, ev.Length = time.Time{}, 0, 0
		if ev == want {
			return true
		}
	}
	return false
}

type e2eEnv struct {
	t       *testing.T
	l       *Linux
	host    *testutil.NS
	nl      *netlink.Handle
	drops   *dropLog
	a, b, c *testPod
}

func newE2E(t *testing.T, cfg LinuxConfig) *e2eEnv {
	t.Helper()
	cfg.Gateways, cfg.GatewayDevice = []netip.Addr{e2eGateway}, "mbt_gw"
	cfg.TeardownDelay = -1
	l, host, nl := newTestLinux(t, cfg)
	e := &e2eEnv{t: t, l: l, host: host, nl: nl, drops: &dropLog{}}
	l.SetHooks(LinuxHooks{OnDrop: e.drops.add})
	e.a = addPod(t, nl, 11, 1001, "10.244.60.11")
	e.b = addPod(t, nl, 12, 1002, "10.244.60.12")
	e.c = addPod(t, nl, 13, 1003, "10.244.60.13")
	for _, p := range []*testPod{e.a, e.b, e.c} {
		e.ipcache(p)
		e.realize(p)
	}
	e.b.listen(t, 8080)
	e.b.listen(t, 8081)
	e.a.listen(t, 8080)
	return e
}

func (e *e2eEnv) ipcache(p *testPod) {
	e.t.Helper()
	if err := e.l.UpsertIPCache(context.Background(), netip.PrefixFrom(p.addr(), p.addr().BitLen()), p.ep.Identity, netip.Addr{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *e2eEnv) realize(p *testPod) {
	e.t.Helper()
	if _, err := e.l.Realize(context.Background(), p.ep, 1); err != nil {
		e.t.Fatalf("Realize endpoint %d: %v", p.ep.ID, err)
	}
}

func (e *e2eEnv) mustTalk(from, to *testPod, port int) {
	e.t.Helper()
	if err := from.talk(to, port, connectTimeout); err != nil {
		e.t.Fatalf("endpoint %d -> %d:%d: %v, want a connection", from.ep.ID, to.ep.ID, port, err)
	}
}

func (e *e2eEnv) mustNotTalk(from, to *testPod, port int) {
	e.t.Helper()
	if err := from.talk(to, port, dropTimeout); err == nil {
		e.t.Fatalf("endpoint %d -> %d:%d connected, want it dropped", from.ep.ID, to.ep.ID, port)
	}
}

// waitDrop waits (bounded) for a drop notification.
func (e *e2eEnv) waitDrop(want DropEvent) {
	e.t.Helper()
	testutil.Eventually(e.t, fmt.Sprintf("drop notification %+v", want), func() bool { return e.drops.has(want) })
}

func (e *e2eEnv) dropCount(id endpoint.ID, reason string, dir policy.Direction) uint64 {
	e.t.Helper()
	c, err := e.l.DropCounters(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	k := DropKey{Endpoint: id, Reason: reason, Dir: dir}
	// The per-endpoint read (GET /v1/endpoint/{id}/policy) agrees with
	// the full dump.
	mine, err := e.l.EndpointDrops(context.Background(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	if mine[k] != c[k] {
		e.t.Errorf("EndpointDrops(%d)[%v] = %+v, DropCounters has %+v", id, k, mine[k], c[k])
	}
	for mk := range mine {
		if mk.Endpoint != id {
			e.t.Errorf("EndpointDrops(%d) returned a counter of endpoint %d", id, mk.Endpoint)
		}
	}
	return c[k].Packets
}

// progID is the ID of the program the endpoint's pinned TCX link runs.
func (e *e2eEnv) linkInfo(p *testPod, pin string) (linkID, progID uint32) {
	e.t.Helper()
	lk, err := link.LoadPinnedLink(filepath.Join(e.l.bpf.endpointDir(p.ep.ID), pin), nil)
	if err != nil {
		e.t.Fatalf("load pinned link: %v", err)
	}
	defer lk.Close()
	info, err := lk.Info()
	if err != nil {
		e.t.Fatal(err)
	}
	return uint32(info.ID), uint32(info.Program)
}

// requireLegacyFilters checks that p's programs run as cls_bpf filters
// and that no TCX link is pinned.
func (e *e2eEnv) requireLegacyFilters(p *testPod) {
	e.t.Helper()
	for _, h := range hooks {
		filters, err := e.nl.FilterList(&netlink.GenericLink{LinkAttrs: netlink.LinkAttrs{Index: p.ep.IfIndex}}, h.parent)
		if err != nil {
			e.t.Fatal(err)
		}
		found := false
		for _, f := range filters {
			if bf, ok := f.(*netlink.BpfFilter); ok && bf.Name == h.name && bf.DirectAction {
				found = true
			}
		}
		if !found {
			e.t.Fatalf("no cls_bpf filter %s on %s: %+v", h.name, p.ep.IfName, filters)
		}
		if _, err := link.LoadPinnedLink(filepath.Join(e.l.bpf.endpointDir(p.ep.ID), h.pin), nil); err == nil {
			e.t.Fatalf("TCX link %s pinned in legacy mode", h.pin)
		}
	}
}

// bOnly8080FromA is B's policy: ingress from A's identity to TCP 8080.
func bOnly8080From(ids ...identity.NumericIdentity) *policy.MapState {
	var keys []policy.Key
	for _, id := range ids {
		keys = append(keys, policy.Key{Identity: id, Port: 8080, Proto: policy.ProtoTCP, Dir: policy.Ingress})
	}
	return policy.NewMapState(2, true, false, keys)
}

func TestBPFEndToEnd(t *testing.T) {
	for _, mode := range []struct {
		name   string
		legacy bool
	}{{"tcx", false}, {"legacy-cls-bpf", true}} {
		t.Run(mode.name, func(t *testing.T) { testEndToEnd(t, mode.legacy) })
	}
}

func testEndToEnd(t *testing.T, legacy bool) {
	e := newE2E(t, LinuxConfig{ForceLegacyTC: legacy, EndpointTCX: !legacy})
	a, b, c := e.a, e.b, e.c
	// No policy: TCP passes both ways.
	e.mustTalk(a, b, 8080)
	e.mustTalk(b, a, 8080)
	e.mustTalk(c, b, 8081)

	// B admits A on 8080 only; A admits nothing (B's replies to A pass
	// through conntrack).
	if legacy {
		e.requireLegacyFilters(b)
	}
	var linkBefore, progBefore uint32
	if !legacy {
		linkBefore, progBefore = e.linkInfo(b, pinLinkTo)
	}
	b.ep.Policy = bOnly8080From(a.ep.Identity)
	a.ep.Policy = policy.NewMapState(2, true, false, nil)
	e.realize(b)
	e.realize(a)
	if !legacy {
		linkAfter, progAfter := e.linkInfo(b, pinLinkTo)
		if linkAfter != linkBefore || progAfter != progBefore {
			t.Fatalf("policy-only change replaced link/program (%d/%d -> %d/%d)", linkBefore, progBefore, linkAfter, progAfter)
		}
	}
	e.mustTalk(a, b, 8080)
	e.mustNotTalk(a, b, 8081)
	e.mustNotTalk(c, b, 8080)
	e.mustNotTalk(b, a, 8080) // A's ingress is default-deny
	e.waitDrop(DropEvent{Endpoint: b.ep.ID, Reason: DropPolicy, Dir: policy.Ingress, Src: a.ep.IPv4, Dst: b.ep.IPv4,
		DstPort: 8081, Proto: policy.ProtoTCP, TCPFlags: tcpSYN, PeerIdentity: a.ep.Identity})
	e.waitDrop(DropEvent{Endpoint: b.ep.ID, Reason: DropPolicy, Dir: policy.Ingress, Src: c.ep.IPv4, Dst: b.ep.IPv4,
		DstPort: 8080, Proto: policy.ProtoTCP, TCPFlags: tcpSYN, PeerIdentity: c.ep.Identity})
	if n := e.dropCount(b.ep.ID, DropPolicy, policy.Ingress); n < 2 {
		t.Fatalf("B's ingress policy drops = %d, want at least 2", n)
	}
	entries, ingress, egress, err := e.l.DumpPolicy(context.Background(), b.ep.ID)
	if err != nil || !ingress || egress || len(entries) != 1 || entries[0].Packets == 0 {
		t.Fatalf("DumpPolicy(B) = %+v in=%v eg=%v err=%v, want the A:8080 entry with packets", entries, ingress, egress, err)
	}

	// C gets a new identity that B admits: C's program is reloaded (new
	// identity), B's policy map gains an entry.
	c.ep.Identity = 1004
	e.ipcache(c)
	e.realize(c)
	b.ep.Policy = bOnly8080From(a.ep.Identity, 1004)
	e.realize(b)
	e.mustTalk(c, b, 8080)

	// Removing the policies restores traffic.
	a.ep.Policy, b.ep.Policy = nil, nil
	e.realize(a)
	e.realize(b)
	e.mustTalk(a, b, 8081)
	e.mustTalk(b, a, 8080)

	// Remove detaches and unpins.
	if err := e.l.Remove(context.Background(), b.ep); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := e.l.DumpPolicy(context.Background(), b.ep.ID); !errors.Is(err, ErrEndpointMissing) {
		t.Fatalf("DumpPolicy after Remove = %v, want ErrEndpointMissing", err)
	}
}

// TestBPFRestartContinuityLegacy: the cls_bpf filters keep enforcing
// while no agent runs; a new datapath replaces them in place.
func TestBPFRestartContinuityLegacy(t *testing.T) {
	e := newE2E(t, LinuxConfig{ForceLegacyTC: true})
	a, b := e.a, e.b
	b.ep.Policy = bOnly8080From(a.ep.Identity)
	e.realize(b)
	if err := e.l.Close(); err != nil {
		t.Fatal(err)
	}
	e.mustTalk(a, b, 8080)
	e.mustNotTalk(a, b, 8081)
	l2, err := NewLinux(e.l.cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l2.Close() })
	e.l = l2
	b.ep.Policy = policy.NewMapState(3, true, false, append(bOnly8080From(a.ep.Identity).Allow,
		policy.Key{Identity: a.ep.Identity, Port: 8081, Proto: policy.ProtoTCP, Dir: policy.Ingress}))
	e.realize(b)
	e.requireLegacyFilters(b)
	e.mustTalk(a, b, 8081)
	e.mustNotTalk(e.c, b, 8080)
}

// TestBPFRestartContinuity: the pinned programs keep enforcing while no
// agent runs, and a new datapath on the same bpffs takes them over
// without detaching (the pinned link is updated in place).
func TestBPFRestartContinuity(t *testing.T) {
	e := newE2E(t, LinuxConfig{EndpointTCX: true})
	a, b := e.a, e.b
	b.ep.Policy = bOnly8080From(a.ep.Identity)
	e.realize(b)
	linkBefore, progBefore := e.linkInfo(b, pinLinkTo)
	if err := e.l.Close(); err != nil {
		t.Fatal(err)
	}
	// Down: still enforced.
	e.mustTalk(a, b, 8080)
	e.mustNotTalk(a, b, 8081)

	cfg := e.l.cfg
	l2, err := NewLinux(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l2.Close() })
	e.l = l2
	entries, ingress, _, err := l2.DumpPolicy(context.Background(), b.ep.ID)
	if err != nil || !ingress || len(entries) != 1 || entries[0].Key != b.ep.Policy.Allow[0] {
		t.Fatalf("DumpPolicy after restart = %+v, %v, %v", entries, ingress, err)
	}
	e.realize(b)
	linkAfter, progAfter := e.linkInfo(b, pinLinkTo)
	if linkAfter != linkBefore {
		t.Fatalf("link %d replaced by %d after restart: it was detached", linkBefore, linkAfter)
	}
	if progAfter != progBefore {
		t.Fatalf("program %d reloaded as %d after restart: same build, identity and interface should be adopted", progBefore, progAfter)
	}
	e.mustTalk(a, b, 8080)
	e.mustNotTalk(a, b, 8081)
	// The realised state was read back: a policy-only change applies by
	// difference.
	b.ep.Policy = policy.NewMapState(3, true, false, append(bOnly8080From(a.ep.Identity).Allow,
		policy.Key{Identity: a.ep.Identity, Port: 8081, Proto: policy.ProtoTCP, Dir: policy.Ingress}))
	e.realize(b)
	e.mustTalk(a, b, 8081)
	if l, p := e.linkInfo(b, pinLinkTo); l != linkAfter || p != progAfter {
		t.Fatal("policy-only change after restart reloaded the program")
	}
	// A new identity after restart is a write of the endpoints map entry:
	// the same link runs the same (the node's) program.
	b.ep.Identity = 1099
	e.realize(b)
	if l, p := e.linkInfo(b, pinLinkTo); l != linkAfter || p != progAfter {
		t.Fatalf("identity change after restart: link %d->%d, program %d->%d; want both kept", linkAfter, l, progAfter, p)
	}
	if v, ok := endpointEntry(t, e.l, b.ep.IfIndex); !ok || v.Identity != 1099 {
		t.Fatalf("endpoints entry after the identity change = %+v, %v", v, ok)
	}
	e.mustTalk(a, b, 8081)
	e.mustNotTalk(e.c, b, 8080)
}
