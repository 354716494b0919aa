package actors

import (
	"context"
	"errors"
	"fmt"

	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// svTimeout bounds every wait of the supervision tests.
const svTimeout = 10 * time.Second

// svLog records the messages logged at Info and above, so that a test can
// wait for an actor's restart ("endpoint actor rebuilt from the index").
// A failed test prints the whole log.
type svLog struct {
	mu   sync.Mutex
	msgs []string
	text strings.Builder
}

func (l *svLog) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelInfo }
func (l *svLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	l.text.WriteString(r.Time.Format("15:04:05.000000") + " " + r.Level.String() + " " + r.Message)
	r.Attrs(func(a slog.Attr) bool {
		l.text.WriteString(" " + a.String())
		return true
	})
	l.text.WriteString("\n")
	return nil
}
func (l *svLog) WithAttrs(as []slog.Attr) slog.Handler { return &svLogAttrs{l, as} }
func (l *svLog) WithGroup(string) slog.Handler         { return l }

// svLogAttrs is svLog with attributes from With.
type svLogAttrs struct {
	*svLog
	attrs []slog.Attr
}

func (l *svLogAttrs) Handle(ctx context.Context, r slog.Record) error {
	r.AddAttrs(l.attrs...)
	return l.svLog.Handle(ctx, r)
}
func (l *svLogAttrs) WithAttrs(as []slog.Attr) slog.Handler {
	return &svLogAttrs{l.svLog, append(append([]slog.Attr(nil), l.attrs...), as...)}
}

// count returns how many records contain sub.
func (l *svLog) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.Contains(m, sub) {
			n++
		}
	}
	return n
}

// msgRebuilt is logged by an endpoint actor's restarted incarnation.
const msgRebuilt = "endpoint actor rebuilt from the index"

// svSystem starts an actor system for supervision tests.
func svSystem(tb testing.TB, mutate func(*Config)) (*System, *datapath.Fake) {
	sys, dp, _ := svSystemLog(tb, mutate)
	return sys, dp
}

// svSystemLog is svSystem that also returns the log recorder.
func svSystemLog(tb testing.TB, mutate func(*Config)) (*System, *datapath.Fake, *svLog) {
	tb.Helper()
	ix, err := index.New()
	if err != nil {
		tb.Fatal(err)
	}
	dp := datapath.NewFake(11)
	cfg := Config{IPAM: IPAMConfig{IPv4: netip.MustParsePrefix("10.78.0.0/24")},
		Endpoint: EndpointConfig{RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond}}
	if mutate != nil {
		mutate(&cfg)
	}
	rec := &svLog{}
	sys, err := Start(cfg, ix, dp, slog.New(rec))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		sys.Stop()
		if tb.Failed() {
			rec.mu.Lock()
			tb.Logf("agent log:\n%s", rec.text.String())
			rec.mu.Unlock()
		}
	})
	return sys, dp, rec
}

func svAsk(tb testing.TB, sys *System, pid *actor.PID, msg any) any {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), svTimeout)
	defer cancel()
	res, err := sys.ask(ctx, pid, msg)
	if err != nil {
		tb.Fatalf("ask %T: %v", msg, err)
	}
	return res
}

// svCreate allocates an IPv4 address and creates a ready endpoint with it.
func svCreate(tb testing.TB, sys *System, name string) *endpoint.Endpoint {
	tb.Helper()
	alloc := svAsk(tb, sys, sys.ipam, &messages.IPAMAllocate{Family: ipam.IPv4, Owner: "sv/" + name}).(*messages.IPAMAllocated)
	if alloc.Err != nil {
		tb.Fatal(alloc.Err)
	}
	ls, err := labels.ParseSet([]string{"k8s:app=" + name})
	if err != nil {
		tb.Fatal(err)
	}
	spec := &endpoint.Endpoint{ContainerID: "sv-" + name, Namespace: "sv", PodName: name, Labels: ls, IPv4: alloc.IPv4}
	res := svAsk(tb, sys, sys.endpoints, &messages.CreateEndpoint{Spec: spec, Sync: true}).(*messages.EndpointResult)
	if res.Err != nil {
		tb.Fatal(res.Err)
	}
	return res.Endpoint
}

func svPID(sys *System, id endpoint.ID) *actor.PID {
	return actor.NewPID(sys.Actors.Address(), sys.endpoints.Id+"/"+endpointActorName(id))
}

// svGate holds datapath operations until opened.
type svGate struct {
	entered chan struct{}
	release chan struct{}
}

func newSvGate(tb testing.TB) *svGate {
	g := &svGate{entered: make(chan struct{}, 64), release: make(chan struct{})}
	tb.Cleanup(g.open)
	return g
}

func (g *svGate) hold(ctx context.Context) error {
	g.entered <- struct{}{}
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *svGate) open() {
	select {
	case <-g.release:
	default:
		close(g.release)
	}
}

func (g *svGate) await(tb testing.TB) {
	tb.Helper()
	select {
	case <-g.entered:
	case <-time.After(svTimeout):
		tb.Fatal("no datapath operation reached the gate")
	}
}

// svLeasesGone waits until ep's address and identity are released.
func svLeasesGone(tb testing.TB, sys *System, ep *endpoint.Endpoint) {
	tb.Helper()
	testutil.Eventually(tb, "the endpoint's row removed", func() bool { _, ok := sys.Index.Endpoint(ep.ID); return !ok })
	testutil.Eventually(tb, "the address released", func() bool { _, ok := sys.Index.IP(ep.IPv4); return !ok })
	testutil.Eventually(tb, "the identity released", func() bool { _, ok := sys.Index.Identity(ep.Identity); return !ok })
}

// TestEndpointRestartBudget: an endpoint actor that keeps failing is
// restarted RestartBudget times within 10 s, then stopped; its leases are
// then released through death-watch.
func TestEndpointRestartBudget(t *testing.T) {
	const budget = 2
	sys, dp := svSystem(t, func(c *Config) { c.Endpoint.RestartBudget = budget })
	ep := svCreate(t, sys, "budget")
	pid := svPID(sys, ep.ID)

	for i := 1; i <= budget; i++ {
		_, before, _ := dp.Stats()
		sys.Actors.Root.Send(pid, &crashForTest{})
		testutil.Eventually(t, "the restarted incarnation's regeneration", func() bool {
			_, n, _ := dp.Stats()
			cur, ok := sys.Index.Endpoint(ep.ID)
			return n > before && ok && cur.State == endpoint.StateReady
		})
	}
	// One failure more than the budget within 10 s: the actor is stopped.
	sys.Actors.Root.Send(pid, &crashForTest{})
	svLeasesGone(t, sys, ep)
	testutil.Eventually(t, "the address out of the ipcache", func() bool {
		_, ok := dp.IPCache()[netip.PrefixFrom(ep.IPv4, 32)]
		return !ok
	})
	infos := svAsk(t, sys, sys.endpoints, &getActors{}).([]ActorInfo)
	for _, info := range infos {
		if info.Endpoint == ep.ID {
			t.Fatalf("endpoint %d still has an actor after exceeding its restart budget", ep.ID)
		}
	}
}

// TestEndpointRestartDuringSyncCreate: a sync create whose endpoint actor
// restarts during the first regeneration is still answered, with a ready
// endpoint holding one identity reference and its address.
func TestEndpointRestartDuringSyncCreate(t *testing.T) {
	sys, dp, rec := svSystemLog(t, nil)
	g := newSvGate(t)
	dp.Set(datapath.FakeHooks{BeforeRealize: func(ctx context.Context, _ *endpoint.Endpoint, _ uint64) error { return g.hold(ctx) }})
	alloc := svAsk(t, sys, sys.ipam, &messages.IPAMAllocate{Family: ipam.IPv4, Owner: "sv/sync"}).(*messages.IPAMAllocated)
	ls, _ := labels.ParseSet([]string{"k8s:app=sync"})
	spec := &endpoint.Endpoint{ID: 33, ContainerID: "sv-sync", Namespace: "sv", PodName: "sync", Labels: ls, IPv4: alloc.IPv4}
	create := sys.Actors.Root.RequestFuture(sys.endpoints, &messages.CreateEndpoint{Spec: spec, Sync: true}, svTimeout)
	g.await(t)
	// The restarted incarnation rebuilds from the index: wait for the
	// manager's commit of the new row (a restart before it rebuilds an
	// empty record; see the report).
	testutil.Eventually(t, "the endpoint's row", func() bool { _, ok := sys.Index.Endpoint(33); return ok })
	sys.Actors.Root.Send(svPID(sys, 33), &crashForTest{})
	testutil.Eventually(t, "the restart", func() bool { return rec.count(msgRebuilt) == 1 })
	g.await(t) // the rebuilt incarnation regenerates again
	g.open()

	res, err := create.Result()
	if err != nil {
		t.Fatalf("sync create lost across a restart: %v", err)
	}
	r := res.(*messages.EndpointResult)
	if r.Err != nil {
		t.Fatalf("sync create: %v", r.Err)
	}
	if r.Endpoint.State != endpoint.StateReady || r.Endpoint.RealizedRevision == 0 {
		t.Fatalf("sync create answered %+v, want ready", r.Endpoint)
	}
	testutil.Eventually(t, "one identity reference", func() bool {
		row, ok := sys.Index.Identity(r.Endpoint.Identity)
		return ok && row.RefCount == 1
	})
	testutil.Eventually(t, "the address claimed", func() bool {
		row, ok := sys.Index.IP(alloc.IPv4)
		return ok && row.Endpoint == 33
	})
}

// TestEndpointRestartDuringDelete: an endpoint actor that restarts while
// tearing down (its row already left the index) still finishes the delete:
// the caller is answered and the leases are released.
func TestEndpointRestartDuringDelete(t *testing.T) {
	sys, dp, rec := svSystemLog(t, nil)
	ep := svCreate(t, sys, "del")
	g := newSvGate(t)
	dp.Set(datapath.FakeHooks{BeforeRemove: func(ctx context.Context, _ *endpoint.Endpoint) error { return g.hold(ctx) }})
	del := sys.Actors.Root.RequestFuture(sys.endpoints, &messages.DeleteEndpoint{ID: ep.ID}, svTimeout)
	g.await(t)
	sys.Actors.Root.Send(svPID(sys, ep.ID), &crashForTest{})
	testutil.Eventually(t, "the restart", func() bool { return rec.count(msgRebuilt) == 1 })
	g.open()

	res, err := del.Result()
	if err != nil {
		t.Fatalf("delete lost across a restart: %v", err)
	}
	if r := res.(*messages.EndpointResult); r.Err != nil && !errors.Is(r.Err, ErrEndpointNotFound) {
		t.Fatalf("delete: %v", r.Err)
	}
	svLeasesGone(t, sys, ep)
	testutil.Eventually(t, "the endpoint's actor gone", func() bool {
		for _, info := range svAsk(t, sys, sys.endpoints, &getActors{}).([]ActorInfo) {
			if info.Endpoint == ep.ID {
				return false
			}
		}
		return true
	})
}

// TestStopReleasesNothing: stopping the system (the agent stops) stops
// the endpoint actors without releasing what they hold: the endpoint
// rows, their addresses and their ipcache entries stay for the next
// start to restore. The manager hears each child's Terminated while it
// stops; it must not treat that as an endpoint gone.
func TestStopReleasesNothing(t *testing.T) {
	ix, err := index.New()
	if err != nil {
		t.Fatal(err)
	}
	dp := datapath.NewFake(11)
	sys, err := Start(Config{IPAM: IPAMConfig{IPv4: netip.MustParsePrefix("10.78.0.0/24")}}, ix, dp, slog.New(&svLog{}))
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			sys.Stop()
		}
	})
	var eps []*endpoint.Endpoint
	for i := range 16 {
		eps = append(eps, svCreate(t, sys, fmt.Sprintf("stop-%d", i)))
	}
	testutil.Eventually(t, "every endpoint's ipcache entry", func() bool {
		held := dp.IPCache()
		for _, ep := range eps {
			if _, ok := held[netip.PrefixFrom(ep.IPv4, 32)]; !ok {
				return false
			}
		}
		return true
	})
	sys.Stop()
	stopped = true
	// Work a release would have queued runs in the pool; give it the
	// time it would take before looking (a bound, not an assertion).
	time.Sleep(200 * time.Millisecond)
	held := dp.IPCache()
	for _, ep := range eps {
		if _, ok := held[netip.PrefixFrom(ep.IPv4, 32)]; !ok {
			t.Errorf("endpoint %d: ipcache entry %s deleted by the stop", ep.ID, ep.IPv4)
		}
		if _, ok := sys.Index.Endpoint(ep.ID); !ok {
			t.Errorf("endpoint %d: row deleted by the stop", ep.ID)
		}
	}
	if n := len(sys.Index.IPs("")); n != len(eps) {
		t.Errorf("%d address leases after the stop, want %d", n, len(eps))
	}
}
