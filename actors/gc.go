package actors

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/index"
)

// GCConfig configures the garbage collector actor.
type GCConfig struct {
	// Interval is the time between passes (default 1 min; negative
	// disables the periodic passes, RunGC still works). It must exceed
	// the longest CNI ADD: a veth orphaned in two consecutive passes is
	// deleted, and an ADD creates its veth before its endpoint exists.
	Interval time.Duration
}

// gcTick is the timer message of the garbage collector actor.
type gcTick struct{ gen int }

// gcActor runs the datapath's Collector periodically in the worker pool
// and deletes the endpoints it reports missing (their host interface
// vanished in two consecutive passes). It never blocks: the pass runs in
// the pool and the actor continues when its answer comes back (request.go).
type gcActor struct {
	owner   // no index writes: its batch stays empty
	cfg     GCConfig
	deps    *endpointDeps
	manager *actor.PID         // the endpoint manager, which deletes missing endpoints
	coll    datapath.Collector // nil: the datapath has nothing to collect
	log     *slog.Logger
	enabled *atomic.Bool // set by StartGC; survives restarts of this actor
	gen     int          // timer generation: a restarted incarnation ignores old ticks
	running bool
	waiters []*actor.PID // RunGC callers waiting for the running pass
	timer   *time.Timer
}

func newGCActor(cfg GCConfig, deps *endpointDeps, manager *actor.PID, enabled *atomic.Bool, log *slog.Logger) *gcActor {
	coll, _ := deps.dp.(datapath.Collector)
	g := &gcActor{cfg: cfg, deps: deps, manager: manager, enabled: enabled, coll: coll, log: log.With("actor", "gc")}
	g.onStart = g.schedule // a restarted incarnation resumes the passes
	g.onStop = g.stopTimer
	return g
}

// Receive implements actor.Actor.
func (g *gcActor) Receive(ctx actor.Context) {
	if g.lifecycle(ctx) {
		return
	}
	switch msg := ctx.Message().(type) {
	case *messages.StartGC:
		if !g.enabled.Swap(true) {
			g.schedule(ctx)
		}
	case *gcTick:
		if msg.gen == g.gen && !g.running {
			g.pass(ctx, nil)
		}
	case *messages.RunGC:
		g.pass(ctx, ctx.Sender())
	}
}

func (g *gcActor) schedule(ctx actor.Context) {
	g.stopTimer()
	if !g.enabled.Load() || g.cfg.Interval <= 0 || g.coll == nil {
		return
	}
	g.gen++
	self, system, tick := ctx.Self(), ctx.ActorSystem(), &gcTick{gen: g.gen}
	g.timer = time.AfterFunc(g.cfg.Interval, func() { system.Root.Send(self, tick) })
}

func (g *gcActor) stopTimer() {
	if g.timer != nil {
		g.timer.Stop()
		g.timer = nil
	}
}

// pass runs one collection in the worker pool; waiter (may be nil) gets
// the GCResult. A RunGC during a pass waits for that pass.
func (g *gcActor) pass(ctx actor.Context, waiter *actor.PID) {
	if waiter != nil {
		g.waiters = append(g.waiters, waiter)
	}
	if g.running {
		return
	}
	if g.coll == nil {
		g.answer(ctx, &messages.GCResult{})
		return
	}
	g.running = true
	coll, ix := g.coll, g.deps.ix
	work := &messages.DatapathWork{Op: "gc", Run: func(c context.Context) (any, error) {
		// The index is read here, just before the kernel is listed, so
		// that the window in which a new endpoint looks orphaned is short.
		return coll.GC(c, ix.Endpoints(index.EndpointFilter{}))
	}}
	g.req.inPool(ctx, g.deps, work, func(v any, err error) {
		g.running = false
		out := &messages.GCResult{Err: err}
		out.Report, _ = v.(datapath.GCReport)
		g.finish(ctx, out)
	})
}

// finish deletes the endpoints reported missing, answers the waiters and
// schedules the next pass.
func (g *gcActor) finish(ctx actor.Context, res *messages.GCResult) {
	if res.Err != nil {
		g.log.Warn("gc pass failed", "err", res.Err)
	}
	for _, id := range res.Report.Missing {
		g.log.Info("deleting endpoint whose host interface vanished", "endpoint", id)
		g.req.request(ctx, g.manager, &messages.DeleteEndpoint{ID: id}, g.deps.cfg.RequestTimeout, func(res any, err error) {
			if r, ok := res.(*messages.EndpointResult); ok && err == nil {
				err = r.Err
			}
			if err != nil && !errors.Is(err, ErrEndpointNotFound) && !errors.Is(err, ErrEndpointDeleting) {
				g.log.Warn("deleting endpoint without host interface failed", "endpoint", id, "err", err)
			}
		})
	}
	g.answer(ctx, res)
	g.schedule(ctx)
}

func (g *gcActor) answer(ctx actor.Context, res *messages.GCResult) {
	for _, w := range g.waiters {
		ctx.Send(w, res)
	}
	g.waiters = nil
}
