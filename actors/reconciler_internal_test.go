package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// recHarness drives a reconciler[string] synchronously: jobs wait in
// jobs until finish runs one (as the pool would) and hands its answer
// back; the retry timer is recorded instead of armed.
type recHarness struct {
	r        *reconciler[string]
	own      owner
	jobs     []recJob
	updates  [][]string // the keys of every update job, sorted
	prunes   int        // prune jobs made
	fail     map[string]error
	pruneErr error
	delays   []time.Duration // retry timers armed
	timers   []*time.Timer
	done     []string // the done callbacks' reports, in order
}

type recJob struct {
	work *messages.DatapathWork
	cont func(any, error)
}

var errRec = errors.New("injected")

func newRecHarness(tb testing.TB, withPrune bool) *recHarness {
	tb.Helper()
	h := &recHarness{r: &reconciler[string]{}, fail: map[string]error{}}
	ops := reconcileOps[string]{update: func(_ actor.Context, keys []string) reconcileJob {
		h.updates = append(h.updates, slices.Sorted(slices.Values(keys)))
		keys = slices.Clone(keys)
		return reconcileJob{op: "test", run: func(context.Context) ([]error, error) {
			errs := make([]error, len(keys))
			for i, k := range keys {
				errs[i] = h.fail[k]
			}
			return errs, nil
		}, done: func(errs []error, err error) {
			h.done = append(h.done, "update")
		}}
	}}
	if withPrune {
		ops.prune = func(actor.Context) reconcileJob {
			h.prunes++
			return reconcileJob{op: "test-prune", run: func(context.Context) ([]error, error) { return nil, h.pruneErr },
				done: func(_ []error, err error) { h.done = append(h.done, "prune") }}
		}
	}
	h.r.init(&h.own, nil, slog.New(slog.DiscardHandler), ops)
	h.r.submit = func(_ actor.Context, w *messages.DatapathWork, cont func(any, error)) {
		h.jobs = append(h.jobs, recJob{w, cont})
	}
	h.r.after = func(_ actor.Context, d time.Duration) *time.Timer {
		h.delays = append(h.delays, d)
		t := time.NewTimer(time.Hour)
		tb.Cleanup(func() { t.Stop() })
		h.timers = append(h.timers, t)
		return t
	}
	return h
}

// finish runs the job in flight and passes its answer back.
func (h *recHarness) finish(tb testing.TB) {
	tb.Helper()
	if len(h.jobs) != 1 {
		tb.Fatalf("%d jobs in flight, want 1", len(h.jobs))
	}
	j := h.jobs[0]
	h.jobs = h.jobs[1:]
	v, err := j.work.Run(context.Background())
	j.cont(v, err)
}

// failWhole answers the job in flight with err, as the pool does when the
// job timed out.
func (h *recHarness) failWhole(tb testing.TB, err error) {
	tb.Helper()
	if len(h.jobs) != 1 {
		tb.Fatalf("%d jobs in flight, want 1", len(h.jobs))
	}
	j := h.jobs[0]
	h.jobs = h.jobs[1:]
	j.cont(nil, err)
}

func (h *recHarness) mark(keys ...string) {
	for _, k := range keys {
		h.r.mark(k)
	}
	h.r.sync(nil)
}

func (h *recHarness) wantUpdates(tb testing.TB, want ...[]string) {
	tb.Helper()
	if !slices.EqualFunc(h.updates, want, slices.Equal) {
		tb.Fatalf("update jobs %v, want %v", h.updates, want)
	}
}

func (h *recHarness) wantState(tb testing.TB, k string, kind reconcileKind, attempts uint32) {
	tb.Helper()
	st := h.r.state(k)
	if st.Kind != kind || st.Attempts != attempts || (kind == reconcileFailed) != (st.Err != nil) {
		tb.Fatalf("state of %s = %+v, want kind %d, %d attempts", k, st, kind, attempts)
	}
}

// TestReconcilerCoalesces: changes made while a job runs wait for it and
// then go together as one job; never more than one job is in flight.
func TestReconcilerCoalesces(t *testing.T) {
	h := newRecHarness(t, false)
	h.mark("a")
	h.wantState(t, "a", reconcilePending, 0)
	h.mark("b")
	h.mark("c", "b")
	h.r.sync(nil)
	if len(h.jobs) != 1 {
		t.Fatalf("%d jobs in flight, want 1", len(h.jobs))
	}
	h.wantUpdates(t, []string{"a"})
	h.wantState(t, "b", reconcilePending, 0)
	h.finish(t) // starts the next job at once
	h.wantUpdates(t, []string{"a"}, []string{"b", "c"})
	h.wantState(t, "a", reconcileDone, 0)
	h.finish(t)
	if len(h.jobs) != 0 || len(h.r.status) != 0 || h.r.due() {
		t.Fatalf("after the last job: %d jobs, statuses %v", len(h.jobs), h.r.status)
	}
	h.r.sync(nil)
	h.wantUpdates(t, []string{"a"}, []string{"b", "c"}) // nothing due: no job

	// A key changed while it is written is written again.
	h.mark("a")
	h.mark("a")
	h.finish(t)
	h.wantState(t, "a", reconcilePending, 0)
	h.finish(t)
	h.wantUpdates(t, []string{"a"}, []string{"b", "c"}, []string{"a"}, []string{"a"})
	h.wantState(t, "a", reconcileDone, 0)
	if len(h.delays) != 0 {
		t.Fatalf("retry timers %v without a failure", h.delays)
	}
}

// TestReconcilerRetriesFailedKeys: a partly failed job retries only its
// failed keys, after the backoff or with the next change, and counts each
// key's attempts.
func TestReconcilerRetriesFailedKeys(t *testing.T) {
	h := newRecHarness(t, false)
	h.fail["b"] = errRec
	h.mark("a", "b", "c")
	h.finish(t)
	h.wantState(t, "a", reconcileDone, 0)
	h.wantState(t, "b", reconcileFailed, 1)
	h.wantState(t, "c", reconcileDone, 0)
	if !errors.Is(h.r.state("b").Err, errRec) {
		t.Fatalf("b's error %v", h.r.state("b").Err)
	}
	if len(h.jobs) != 0 || !slices.Equal(h.delays, []time.Duration{reconcileRetryMin}) {
		t.Fatalf("after a failure: %d jobs, retry timers %v; want none and one of %v", len(h.jobs), h.delays, reconcileRetryMin)
	}
	h.r.retried(nil)
	h.finish(t)
	h.wantState(t, "b", reconcileFailed, 2)
	// A change before the timer fires takes the failed key along.
	h.mark("d")
	h.wantUpdates(t, []string{"a", "b", "c"}, []string{"b"}, []string{"b", "d"})
	delete(h.fail, "b")
	h.finish(t)
	h.wantState(t, "b", reconcileDone, 0)
	h.wantState(t, "d", reconcileDone, 0)
	if want := []time.Duration{reconcileRetryMin, 2 * reconcileRetryMin}; !slices.Equal(h.delays, want) {
		t.Fatalf("retry timers %v, want %v", h.delays, want)
	}

	// A job that fails whole (the pool timed it out) fails every key.
	h.mark("x", "y")
	h.failWhole(t, actor.ErrTimeout)
	for _, k := range []string{"x", "y"} {
		if st := h.r.state(k); st.Kind != reconcileFailed || !errors.Is(st.Err, actor.ErrTimeout) {
			t.Fatalf("state of %s after a timeout: %+v", k, st)
		}
	}
	if len(h.delays) != 2 {
		t.Fatalf("retry timers %v: a failure armed another while one was armed", h.delays)
	}
	// An update whose result does not match its keys failed too.
	h.r.retried(nil)
	h.jobs[0].cont([]error{nil}, nil)
	h.jobs = h.jobs[1:]
	h.wantState(t, "x", reconcileFailed, 2)
	h.wantState(t, "y", reconcileFailed, 2)
}

// TestReconcilerBackoff: each consecutive failed job doubles the delay up
// to the maximum; a success resets it.
func TestReconcilerBackoff(t *testing.T) {
	h := newRecHarness(t, false)
	h.fail["a"] = errRec
	h.mark("a")
	var want []time.Duration
	for i := range 12 {
		h.finish(t)
		want = append(want, min(reconcileRetryMin<<i, reconcileRetryMax))
		h.r.stop()
		h.r.retried(nil)
	}
	if !slices.Equal(h.delays, want) {
		t.Fatalf("delays %v, want %v", h.delays, want)
	}
	if h.delays[len(h.delays)-1] != reconcileRetryMax {
		t.Fatalf("delay not capped at %v: %v", reconcileRetryMax, h.delays)
	}
	delete(h.fail, "a")
	h.finish(t)
	h.fail["a"] = errRec
	h.mark("a")
	h.finish(t)
	if got := h.delays[len(h.delays)-1]; got != reconcileRetryMin {
		t.Fatalf("delay after a success and a failure %v, want %v", got, reconcileRetryMin)
	}
	h.wantState(t, "a", reconcileFailed, 1)
}

func TestBackoff(t *testing.T) {
	for _, c := range []struct {
		attempt int
		want    time.Duration
	}{{0, time.Second}, {1, 2 * time.Second}, {3, 8 * time.Second}, {4, 10 * time.Second}, {100, 10 * time.Second}} {
		if got := backoff(time.Second, 10*time.Second, c.attempt); got != c.want {
			t.Errorf("backoff(1s, 10s, %d) = %v, want %v", c.attempt, got, c.want)
		}
	}
	if got := backoff(1<<50, 1<<62, 20); got != 1<<62 { // 1<<70 overflows
		t.Errorf("backoff past overflow = %v, want the maximum", got)
	}
}

// TestReconcilerPrune: a full sync covers the keys due, a failed one is
// due again with them, and without a prune operation resync does nothing.
func TestReconcilerPrune(t *testing.T) {
	h := newRecHarness(t, true)
	h.r.mark("a")
	h.r.resync()
	h.r.sync(nil)
	if h.prunes != 1 || len(h.updates) != 0 {
		t.Fatalf("%d prunes, updates %v; want one prune", h.prunes, h.updates)
	}
	h.mark("b") // waits for the prune
	h.pruneErr = errRec
	h.finish(t)
	h.wantState(t, "a", reconcileFailed, 1)
	h.wantState(t, "b", reconcilePending, 0)
	if !h.r.resyncDue || len(h.jobs) != 0 || len(h.delays) != 1 {
		t.Fatalf("after a failed prune: due %v, %d jobs, timers %v", h.r.resyncDue, len(h.jobs), h.delays)
	}
	h.pruneErr = nil
	h.r.retried(nil)
	if h.prunes != 2 {
		t.Fatalf("%d prunes, want the retry's", h.prunes)
	}
	h.finish(t)
	h.wantState(t, "a", reconcileDone, 0)
	h.wantState(t, "b", reconcileDone, 0)
	if len(h.updates) != 0 || len(h.jobs) != 0 {
		t.Fatalf("updates %v, %d jobs after a prune that covered them", h.updates, len(h.jobs))
	}
	if want := []string{"prune", "prune"}; !slices.Equal(h.done, want) {
		t.Fatalf("done callbacks %v, want %v", h.done, want)
	}

	n := newRecHarness(t, false)
	n.r.resync()
	n.r.sync(nil)
	if n.r.resyncDue || len(n.jobs) != 0 {
		t.Fatal("resync without a prune operation started a job")
	}
}

// TestReconcilerBarrier: a barrier is answered once every change made
// before it is written: at once when idle, after the job covering them,
// and only after the retry when that job failed.
func TestReconcilerBarrier(t *testing.T) {
	h := newRecHarness(t, true)
	var answered []string
	barrier := func(name string) { h.r.barrier(func() { answered = append(answered, name) }) }
	want := func(names ...string) {
		t.Helper()
		if !slices.Equal(answered, names) {
			t.Fatalf("barriers answered %v, want %v", answered, names)
		}
	}
	barrier("idle")
	want("idle")

	h.mark("a")
	barrier("in-flight") // nothing else due: the job in flight covers it
	h.mark("b")
	barrier("pending") // b waits for the next job
	h.fail["a"] = errRec
	h.finish(t) // a failed: both wait for the retry
	want("idle")
	h.r.retried(nil) // a and b together
	h.finish(t)
	want("idle")
	delete(h.fail, "a")
	h.r.retried(nil)
	h.finish(t)
	want("idle", "in-flight", "pending")

	// A barrier waits for a due full sync, then for its retry.
	h.r.resync()
	barrier("prune")
	h.pruneErr = errRec
	h.r.sync(nil)
	h.finish(t)
	want("idle", "in-flight", "pending")
	h.pruneErr = nil
	h.r.retried(nil)
	h.finish(t)
	want("idle", "in-flight", "pending", "prune")
}

// TestReconcilerWait: a wait is answered after the job that wrote its keys,
// with their error (not another key's), without waiting for the retry; a
// failed full sync reports no key, so its waits move to the retry.
func TestReconcilerWait(t *testing.T) {
	h := newRecHarness(t, true)
	got := map[string]error{}
	wait := func(name string, keys ...string) {
		h.r.wait(keys, func(err error) { got[name] = err })
	}
	h.mark("a")
	h.r.mark("b")
	h.r.mark("c")
	wait("bc", "b", "c")
	h.r.mark("d")
	wait("d", "d")
	h.fail["c"] = errRec
	h.finish(t)
	if len(got) != 0 {
		t.Fatalf("waits answered by a job that did not write their keys: %v", got)
	}
	h.finish(t)
	if len(got) != 2 || !errors.Is(got["bc"], errRec) || got["d"] != nil {
		t.Fatalf("waits answered %v, want bc failed and d written", got)
	}

	clear(got)
	h.r.stop()
	delete(h.fail, "c")
	h.r.resync()
	wait("prune", "c")
	h.pruneErr = errRec
	h.r.sync(nil)
	h.finish(t)
	if len(got) != 0 {
		t.Fatalf("a failed full sync answered %v", got)
	}
	h.pruneErr = nil
	h.r.retried(nil)
	h.finish(t)
	if err, ok := got["prune"]; !ok || err != nil {
		t.Fatalf("wait after the full sync: %v", got)
	}
}

// TestReconcilerNoOps: without an update operation (an owner without a
// datapath) marks stay out of the statuses and waits are answered at once.
func TestReconcilerNoOps(t *testing.T) {
	r := &reconciler[string]{}
	r.init(&owner{}, nil, slog.New(slog.DiscardHandler), reconcileOps[string]{})
	r.mark("a")
	r.resync()
	r.sync(nil)
	answered := false
	r.wait([]string{"a"}, func(err error) { answered = err == nil })
	if len(r.status) != 0 || r.inFlight || !answered {
		t.Fatalf("statuses %v, in flight %v, answered %v", r.status, r.inFlight, answered)
	}
}

// TestReconcilerPaused: a paused reconciler starts no job; unpaused, the
// next sync starts one with everything due.
func TestReconcilerPaused(t *testing.T) {
	h := newRecHarness(t, false)
	h.r.paused = true
	h.mark("a")
	h.mark("b")
	if len(h.jobs) != 0 {
		t.Fatal("a paused reconciler started a job")
	}
	h.r.paused = false
	h.r.sync(nil)
	h.wantUpdates(t, []string{"a", "b"})
}

// reconcilingActor is an owner actor with a reconciler whose every job
// fails, so a retry timer is armed; its onStop reports whether the
// timer was stopped before it.
type reconcilingActor struct {
	owner
	rec reconciler[string]
}

func (a *reconcilingActor) Receive(ctx actor.Context) {
	if a.lifecycle(ctx) {
		return
	}
	switch msg := ctx.Message().(type) {
	case string:
		a.rec.mark(msg)
		a.rec.sync(ctx)
	case *crashForTest:
		panic("reconciling actor: crash requested by a test")
	}
}

// TestReconcilerStopStopsTimer: the owner's Stopping and Restarting stop
// the reconciler's armed retry timer.
func TestReconcilerStopStopsTimer(t *testing.T) {
	for _, restart := range []bool{false, true} {
		sys := NewSystem(slog.New(slog.DiscardHandler))
		stopped := make(chan bool, 4)
		armed := make(chan struct{}, 4)
		props := actor.PropsFromProducer(func() actor.Actor {
			a := &reconcilingActor{}
			a.rec.init(&a.owner, nil, slog.New(slog.DiscardHandler), reconcileOps[string]{
				update: func(actor.Context, []string) reconcileJob { return reconcileJob{op: "test"} },
			})
			a.rec.submit = func(_ actor.Context, _ *messages.DatapathWork, cont func(any, error)) { cont(nil, errRec) }
			after := a.rec.after
			a.rec.after = func(ctx actor.Context, d time.Duration) *time.Timer {
				armed <- struct{}{}
				return after(ctx, d)
			}
			a.onStop = func() { stopped <- a.rec.retry == nil }
			return a
		}) // the root's default strategy restarts it
		pid := sys.Root.Spawn(props)
		sys.Root.Send(pid, "a")
		select {
		case <-armed:
		case <-time.After(10 * time.Second):
			t.Fatal("no retry timer armed")
		}
		if restart {
			sys.Root.Send(pid, &crashForTest{})
		} else {
			sys.Root.Stop(pid)
		}
		select {
		case ok := <-stopped:
			if !ok {
				t.Fatalf("restart %v: the retry timer was still armed in onStop", restart)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("restart %v: no Stopping/Restarting", restart)
		}
		sys.Shutdown()
	}
}

// msgCtx is an actor.Context that only holds a message: what
// owner.lifecycle reads for Stopping and Restarting.
type msgCtx struct {
	actor.Context
	msg any
}

func (c msgCtx) Message() any { return c.msg }

// TestOwnersStopTimers: every owner's Stopping and Restarting stop its
// armed timers (the reconciler's retry, the gc's pass, the IPAM sweep,
// the cluster identity's acquire and release retries).
func TestOwnersStopTimers(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	deps := &endpointDeps{log: log, writer: &indexWriter{}}
	armed := func() *time.Timer { return time.AfterFunc(time.Hour, func() {}) }
	for _, c := range []struct {
		name string
		make func() (o *owner, stopped func() bool)
	}{
		{name: "ipcache", make: func() (*owner, func() bool) {
			a := newIPCacheActor(deps, nil, nil)
			a.rec.retry = armed()
			return &a.owner, func() bool { return a.rec.retry == nil }
		}},
		{name: "nodes", make: func() (*owner, func() bool) {
			a := newNodesActor(deps, nil, 0)
			a.rec.retry = armed()
			return &a.owner, func() bool { return a.rec.retry == nil }
		}},
		{name: "services", make: func() (*owner, func() bool) {
			a := newServicesActor(deps)
			a.rec.retry = armed()
			return &a.owner, func() bool { return a.rec.retry == nil }
		}},
		{name: "gc", make: func() (*owner, func() bool) {
			a := newGCActor(GCConfig{}, deps, nil, nil, log)
			a.timer = armed()
			return &a.owner, func() bool { return a.timer == nil }
		}},
		{name: "ipam", make: func() (*owner, func() bool) {
			a := newIPAMActor(IPAMConfig{}, deps.writer, log)
			a.sweep = armed()
			return &a.owner, func() bool { return a.sweep == nil }
		}},
		{name: "identity", make: func() (*owner, func() bool) {
			a := newIdentityActor(nil, deps.writer, nil, log)
			p := &pendingAcquire{retry: armed()}
			r := &releaseRetry{timer: armed()}
			a.cluster = &clusterMode{pending: map[string]*pendingAcquire{"k": p}, releases: map[identity.NumericIdentity]*releaseRetry{1000: r}}
			return &a.owner, func() bool { return p.retry == nil && r.timer == nil }
		}},
	} {
		for _, msg := range []any{&actor.Stopping{}, &actor.Restarting{}} {
			t.Run(fmt.Sprintf("%s/%T", c.name, msg), func(t *testing.T) {
				o, stopped := c.make()
				if !o.lifecycle(msgCtx{msg: msg}) {
					t.Fatal("lifecycle did not handle it")
				}
				if !stopped() {
					t.Fatal("timer still armed")
				}
			})
		}
	}
}
