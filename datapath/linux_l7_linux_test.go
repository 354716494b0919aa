package datapath

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

type proxyEvents struct {
	mu    sync.Mutex
	acks  map[uint64]bool
	nacks map[uint64]string
}

func (p *proxyEvents) install(l *Linux) {
	p.acks, p.nacks = map[uint64]bool{}, map[uint64]string{}
	l.SetProxyAck(func(_ endpoint.ID, rev uint64, proxy string) {
		p.mu.Lock()
		p.acks[rev] = proxy == ProxyName
		p.mu.Unlock()
	})
	l.SetProxyNack(func(_ endpoint.ID, rev uint64, _, reason string) {
		p.mu.Lock()
		p.nacks[rev] = reason
		p.mu.Unlock()
	})
}

func (p *proxyEvents) acked(rev uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.acks[rev]
}

// waitAcked checks that revision rev of endpoint id, realised as r,
// reaches the proxy: either r waits for the proxy and the wait completes
// with an acknowledgement, or (the proxy was quicker than the
// registration of the wait: Tracker.Wait reports "already acknowledged")
// r waits for nothing and the tracker already counts the endpoint's
// configuration version as acknowledged.
func (p *proxyEvents) waitAcked(t *testing.T, l *Linux, id endpoint.ID, r Realized, rev uint64) {
	t.Helper()
	switch {
	case len(r.ProxyWaits) == 1 && r.ProxyWaits[0] == ProxyName:
		testutil.Eventually(t, fmt.Sprintf("revision %d acknowledged", rev), func() bool { return p.acked(rev) })
	case len(r.ProxyWaits) == 0:
		st := l.L7Status()
		for _, e := range st.Acks.Endpoints {
			if e.Endpoint == uint64(id) {
				if !e.Acked {
					t.Fatalf("revision %d: no wait, but the proxy has not acknowledged version %d (status %+v)", rev, e.Version, st.Acks)
				}
				return
			}
		}
		t.Fatalf("revision %d: no wait, and the endpoint has no configuration version (status %+v)", rev, st.Acks)
	default:
		t.Fatalf("revision %d: ProxyWaits = %v, want [%s]", rev, r.ProxyWaits, ProxyName)
	}
}

func l7Config(t *testing.T, bin string) LinuxConfig {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return LinuxConfig{TeardownDelay: -1, L7: L7Config{ProxyPath: bin, XDSSocket: filepath.Join(t.TempDir(), "xds.sock"), Listen: addr}}
}

func l7MapState(port uint16) *policy.MapState {
	k := policy.Key{Identity: 300, Port: port, Proto: policy.ProtoTCP, Dir: policy.Ingress}
	m := policy.NewMapState(1, true, false, []policy.Key{k})
	m.L7 = []policy.L7Entry{{Key: k, HTTP: []policy.HTTPRule{{Method: "GET", Path: "/public"}}}}
	return m
}

// TestLinuxL7ProxyWaits: the Linux datapath runs the proxy process; a
// realize whose policy has L7 entries waits for the proxy's
// acknowledgement of the version holding them, as does the realize that
// withdraws them; a realize without L7 waits for nothing; a killed proxy
// is restarted and acknowledges what was published meanwhile.
func TestLinuxL7ProxyWaits(t *testing.T) {
	testutil.RequireRoot(t)
	bin := filepath.Join(testutil.BuildBinariesT(t, "membrane-proxy"), "membrane-proxy")
	l, _, nl := newTestLinux(t, l7Config(t, bin))
	var ev proxyEvents
	ev.install(l)
	ep := addVeth(t, nl, 9, "lxcl7000000001", "10.244.47.5")
	ctx := context.Background()
	if err := l.UpsertIPCache(ctx, netip.MustParsePrefix("10.244.47.6/32"), identity.NumericIdentity(300), netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	ep.Policy = l7MapState(80)
	r, err := l.Realize(ctx, ep, 1)
	if err != nil {
		t.Fatal(err)
	}
	ev.waitAcked(t, l, ep.ID, r, 1)

	st := l.L7Status()
	if st == nil || st.Process.PID == 0 || st.Acks.Acked < 1 {
		t.Fatalf("L7 status %+v", st)
	}
	if err := syscall.Kill(st.Process.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ep.Policy = l7MapState(8080)
	if r, err = l.Realize(ctx, ep, 2); err != nil {
		t.Fatalf("Realize 2: %v", err)
	}
	ev.waitAcked(t, l, ep.ID, r, 2)
	if s := l.L7Status(); s.Process.Restarts < 1 || s.Process.PID == st.Process.PID {
		t.Errorf("status after kill %+v, want a restarted process", s.Process)
	}

	ep.Policy = policy.NewMapState(2, true, false, []policy.Key{{Identity: 300, Port: 80, Proto: policy.ProtoTCP}})
	if r, err = l.Realize(ctx, ep, 3); err != nil {
		t.Fatalf("Realize 3 (L7 withdrawn): %v", err)
	}
	ev.waitAcked(t, l, ep.ID, r, 3)
	if r, err = l.Realize(ctx, ep, 4); err != nil || len(r.ProxyWaits) != 0 {
		t.Fatalf("Realize 4 (no L7): %v, %v; want no wait", r, err)
	}
	if err := l.Remove(ctx, ep); err != nil {
		t.Fatal(err)
	}
}

// TestLinuxL7AckNeverComes: a proxy that never acknowledges (here an
// executable that is no proxy and exits) leaves the wait pending and
// visible in the status while the supervisor keeps restarting it; the
// endpoint actor's timeout ends such waits (actors.TestProxyAcks).
func TestLinuxL7AckNeverComes(t *testing.T) {
	testutil.RequireRoot(t)
	bin, err := exec.LookPath("false")
	if err != nil {
		t.Fatalf("false(1), the stand-in proxy: %v", err)
	}
	l, _, nl := newTestLinux(t, l7Config(t, bin))
	var ev proxyEvents
	ev.install(l)
	ep := addVeth(t, nl, 10, "lxcl7000000002", "10.244.47.9")
	ep.Policy = l7MapState(80)
	r, err := l.Realize(context.Background(), ep, 1)
	if err != nil || len(r.ProxyWaits) != 1 {
		t.Fatalf("Realize: %v, %v", r, err)
	}
	testutil.Eventually(t, "the supervisor to restart the failing proxy", func() bool { return l.L7Status().Process.Restarts >= 2 })
	if st := l.L7Status(); st.Acks.Pending != 1 || ev.acked(1) || st.Process.LastExit == "" {
		t.Errorf("status %+v: want one pending wait, no acknowledgement, the last exit", st)
	}
}

// TestLinuxL7Off: without a proxy, a policy with L7 entries is refused
// naming the missing flag (never silently enforced as L4).
func TestLinuxL7Off(t *testing.T) {
	l, _, nl := newTestLinux(t, LinuxConfig{TeardownDelay: -1})
	ep := addVeth(t, nl, 11, "lxcl7000000003", "10.244.47.13")
	ep.Policy = l7MapState(80)
	if _, err := l.Realize(context.Background(), ep, 1); err == nil || l.L7Status() != nil {
		t.Fatalf("Realize with L7 and no proxy: %v, want an error", err)
	}
}

// TestPolicyMapProxyPorts (root): a redirected entry carries the proxy
// port in its policy map value; turning the redirect on, moving it and
// off rewrites the port and keeps the entry's counters; the realised
// state reads the ports back.
func TestPolicyMapProxyPorts(t *testing.T) {
	h := newProgHarness(t, 61, 1061)
	k := policy.Key{Identity: 300, Port: 80, Proto: policy.ProtoTCP, Dir: policy.Ingress}
	plain := policy.Key{Identity: 300, Port: 9090, Proto: policy.ProtoTCP, Dir: policy.Ingress}
	l4 := policy.NewMapState(1, true, false, []policy.Key{k, plain})
	l7 := policy.NewMapState(2, true, false, []policy.Key{k, plain})
	l7.L7 = []policy.L7Entry{{Key: k, HTTP: []policy.HTTPRule{{Path: "/public"}}}}
	readPorts := func() map[policy.Key]uint16 {
		t.Helper()
		_, ports, err := realisedState(h.pm, h.cm)
		if err != nil {
			t.Fatal(err)
		}
		return ports
	}
	h.setPolicy(t, l4)
	bk := encodePolicyKey(k)
	if err := h.pm.Update(bk, bpf.EndpointPolicyValue{Packets: 7}, ebpf.UpdateExist); err != nil {
		t.Fatal(err)
	}
	h.setPolicy(t, l7)
	if got := readPorts(); len(got) != 1 || got[k] != 15001 {
		t.Errorf("after the redirect: ports %v, want only %v -> 15001", got, k)
	}
	var v bpf.EndpointPolicyValue
	if err := h.pm.Lookup(bk, &v); err != nil || v.Packets != 7 {
		t.Errorf("entry after the redirect: %+v %v, want the counters kept", v, err)
	}
	old := harnessProxyPorts
	harnessProxyPorts = policy.ProxyPorts{policy.ParserHTTP: 15002}
	t.Cleanup(func() { harnessProxyPorts = old })
	h.setPolicy(t, l7)
	if got := readPorts(); got[k] != 15002 {
		t.Errorf("after moving the proxy: ports %v, want %v -> 15002", got, k)
	}
	h.setPolicy(t, l4)
	if got := readPorts(); len(got) != 0 {
		t.Errorf("after withdrawing L7: ports %v, want none", got)
	}
}

// TestApplyIPCacheOnePublication: a batch of ipcache changes reaches the
// BPF map entry by entry and the L7 proxy's mirror in one publication
// (one per entry made every remote update cost grow with the ipcache),
// which sends only the shards the batch changed; an invalid change fails
// alone.
func TestApplyIPCacheOnePublication(t *testing.T) {
	testutil.RequireRoot(t)
	bin := filepath.Join(testutil.BuildBinariesT(t, "membrane-proxy"), "membrane-proxy")
	l, _, _ := newTestLinux(t, l7Config(t, bin))
	ctx := context.Background()
	published := func() int {
		l.l7.mu.Lock()
		defer l.l7.mu.Unlock()
		return l.l7.ipcachePublished
	}
	before, version := published(), l.l7.srv.Version()
	var changes []IPCacheChange
	for i := range 200 {
		changes = append(changes, IPCacheChange{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 245, byte(i / 250), byte(1 + i%250)}), 32),
			Value: IPCacheValue{Identity: identity.NumericIdentity(5000 + i)}})
	}
	changes = append(changes, IPCacheChange{}) // invalid prefix
	errs := l.ApplyIPCache(ctx, changes)
	for i, err := range errs[:200] {
		if err != nil {
			t.Fatalf("change %d: %v", i, err)
		}
	}
	if errs[200] == nil {
		t.Error("an invalid prefix was accepted")
	}
	if n := published() - before; n != 1 {
		t.Errorf("%d publications of the L7 ipcache mirror for one batch, want 1", n)
	}
	if v := l.l7.srv.Version(); v != version+1 {
		t.Errorf("xDS version %d -> %d, want one more", version, v)
	}
	// One changed prefix: one shard sent, not the whole mirror.
	l.l7.mu.Lock()
	sent := l.l7.ipcacheShardsSent
	l.l7.mu.Unlock()
	one := changes[0]
	one.Value.Identity++
	for _, err := range l.ApplyIPCache(ctx, []IPCacheChange{one}) {
		if err != nil {
			t.Fatal(err)
		}
	}
	l.l7.mu.Lock()
	sent = l.l7.ipcacheShardsSent - sent
	l.l7.mu.Unlock()
	if sent != 1 {
		t.Errorf("a batch changing one prefix sent %d ipcache shards to the proxy, want 1", sent)
	}
	changes[0] = one
	held, err := l.DumpIPCache(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l.l7.mu.Lock()
	mirrored := l.l7.ipcache.all()
	l.l7.mu.Unlock()
	for _, c := range changes[:200] {
		if held[c.Prefix] != c.Value.Identity || mirrored[c.Prefix] != c.Value.Identity {
			t.Fatalf("%s: map %d, mirror %d, want %d", c.Prefix, held[c.Prefix], mirrored[c.Prefix], c.Value.Identity)
		}
	}
	// Deleting them is one batch too.
	for i := range changes[:200] {
		changes[i].Delete = true
	}
	for i, err := range l.ApplyIPCache(ctx, changes[:200]) {
		if err != nil {
			t.Fatalf("delete %d: %v", i, err)
		}
	}
	if n := published() - before; n != 3 {
		t.Errorf("%d publications after the deleting batch, want 3 (one per batch)", n)
	}
	l.l7.mu.Lock()
	defer l.l7.mu.Unlock()
	for _, c := range changes[:200] {
		if _, ok := l.l7.ipcache.get(c.Prefix); ok {
			t.Fatalf("%s still mirrored", c.Prefix)
		}
	}
}

// TestL7ProxyGetsNamedSecretsOnly: of the policy secrets namespace's
// Secrets, the proxy is sent only those a published endpoint's rules
// name, before the endpoint's rules; a Secret no rule names, or no
// longer names, is not (or no longer) sent.
func TestL7ProxyGetsNamedSecretsOnly(t *testing.T) {
	testutil.RequireRoot(t)
	bin := filepath.Join(testutil.BuildBinariesT(t, "membrane-proxy"), "membrane-proxy")
	l, _, nl := newTestLinux(t, l7Config(t, bin))
	var ev proxyEvents
	ev.install(l)
	sent := func() map[string]string {
		l.l7.mu.Lock()
		defer l.l7.mu.Unlock()
		return maps.Clone(l.l7.sentSecrets)
	}
	l.SetPolicySecrets(map[string]string{"sec/token": "t0k3n", "sec/other": "not-for-the-proxy"})
	if s := sent(); len(s) != 0 {
		t.Fatalf("with no endpoint the proxy was sent %d secrets", len(s))
	}
	ep := addVeth(t, nl, 9, "lxcl7000000002", "10.244.47.7")
	ctx := context.Background()
	m := l7MapState(80)
	m.L7[0].HTTP[0].HeaderMatches = []policy.HeaderMatch{{Name: "X-Token", Secret: &policy.HeaderSecretRef{Namespace: "sec", Name: "token"}}}
	ep.Policy = m
	r, err := l.Realize(ctx, ep, 1)
	if err != nil {
		t.Fatal(err)
	}
	ev.waitAcked(t, l, ep.ID, r, 1)
	if s := sent(); len(s) != 1 || s["sec/token"] != "t0k3n" {
		t.Fatalf("the proxy was sent %v, want only sec/token", slices.Sorted(maps.Keys(s)))
	}
	l.SetPolicySecrets(map[string]string{"sec/token": "n3w", "sec/other": "still-not"})
	if s := sent(); len(s) != 1 || s["sec/token"] != "n3w" {
		t.Fatalf("after the Secret changed the proxy was sent %v", slices.Sorted(maps.Keys(s)))
	}
	ep.Policy = l7MapState(80) // the rule no longer names it
	if r, err = l.Realize(ctx, ep, 2); err != nil {
		t.Fatal(err)
	}
	ev.waitAcked(t, l, ep.ID, r, 2)
	if s := sent(); len(s) != 0 {
		t.Fatalf("no rule names a secret, the proxy still holds %v", slices.Sorted(maps.Keys(s)))
	}
	ep.Policy = m
	if r, err = l.Realize(ctx, ep, 3); err != nil {
		t.Fatal(err)
	}
	ev.waitAcked(t, l, ep.ID, r, 3)
	if err := l.Remove(ctx, ep); err != nil {
		t.Fatal(err)
	}
	if s := sent(); len(s) != 0 {
		t.Fatalf("the endpoint naming it is gone, the proxy still holds %v", slices.Sorted(maps.Keys(s)))
	}
}
