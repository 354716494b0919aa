package actors

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
)

// PoolConfig configures the datapath worker pool actor.
type PoolConfig struct {
	// Workers is the number of goroutines running blocking work
	// (default DefaultPoolWorkers, at least 2x GOMAXPROCS; 1..1024).
	Workers int
	// DefaultTimeout bounds work that sets no Timeout (default 30 s).
	DefaultTimeout time.Duration
}

// DefaultPoolWorkers is the datapath pool's default size. The pool's
// work mostly waits (netlink answers, RCU grace periods in the kernel, a
// slow call), not computes: a waiting worker costs a parked goroutine,
// and with 4 workers (the earlier default) membrane-sim's 1% of datapath
// calls slowed by 50 ms kept three of them asleep, throttling every other
// endpoint behind them (BENCHMARKS.md, "Datapath pool size").
const DefaultPoolWorkers = 16

// job is a DatapathWork with who asked and when.
type job struct {
	work    *messages.DatapathWork
	replyTo *actor.PID
	queued  time.Time
}

// workerDone tells the pool actor that a worker of incarnation gen
// finished a job while work waited in the backlog.
type workerDone struct {
	gen int
}

// workerSet is what the pool actor and one incarnation of its workers
// share. A worker that finishes a job frees its slot here and wakes the
// pool actor (workerDone) only when work is waiting: a message per job
// back to the pool cost a mailbox pass per datapath call.
type workerSet struct {
	busy       atomic.Int32
	backlogged atomic.Bool // the pool actor has work waiting for a slot
	done       atomic.Uint64
	failed     atomic.Uint64
}

// finished frees a worker's slot and reports whether the pool actor must
// be woken to hand out waiting work.
func (w *workerSet) finished(failed bool) bool {
	w.done.Add(1)
	if failed {
		w.failed.Add(1)
	}
	w.busy.Add(-1)
	return w.backlogged.Load()
}

// PoolStats is a snapshot of the pool, answered to *getPoolStats.
type PoolStats struct {
	Workers, Busy, Backlog int
	Done, Failed           uint64
}

// getPoolStats asks the pool actor for its PoolStats. Reply: *PoolStats.
type getPoolStats struct{}

// poolActor hands DatapathWork to a fixed set of worker goroutines. It
// never blocks: work beyond the free workers waits in its own FIFO backlog
// (actor state), and workers tell it when they finish.
type poolActor struct {
	cfg     PoolConfig
	log     *slog.Logger
	jobs    chan job // capacity Workers; never full when the actor sends
	workers *workerSet
	backlog []job
	gen     int // incarnation of the worker set; stale workerDone are ignored
	stop    context.CancelFunc
}

func newPoolActor(cfg PoolConfig, log *slog.Logger) *poolActor {
	return &poolActor{cfg: cfg, log: log.With("actor", "datapath")}
}

// Receive implements actor.Actor.
func (p *poolActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		p.start(ctx)
	case *actor.Stopping, *actor.Restarting:
		if p.stop != nil {
			p.stop()
		}
		p.failBacklog(ctx)
	case *messages.DatapathWork:
		p.backlog = append(p.backlog, job{work: msg, replyTo: ctx.Sender(), queued: time.Now()})
		p.dispatch()
	case *workerDone:
		if msg.gen == p.gen {
			p.dispatch()
		}
	case *getPoolStats:
		w := p.workers
		ctx.Respond(&PoolStats{Workers: p.cfg.Workers, Busy: int(w.busy.Load()), Backlog: len(p.backlog),
			Done: w.done.Load(), Failed: w.failed.Load()})
	}
}

func (p *poolActor) start(ctx actor.Context) {
	p.jobs = make(chan job, p.cfg.Workers)
	wctx, cancel := context.WithCancel(context.Background())
	p.stop = cancel
	p.gen++
	self, system := ctx.Self(), ctx.ActorSystem()
	p.workers = &workerSet{} // workers of an earlier incarnation keep theirs
	for i := 0; i < p.cfg.Workers; i++ {
		go p.worker(wctx, system, self, p.jobs, p.workers, p.gen)
	}
}

// dispatch hands backlog work to free workers. With work left it marks
// the set backlogged, then looks again: a worker frees its slot before
// it reads the mark, so one that finished meanwhile is seen here or
// wakes the actor.
func (p *poolActor) dispatch() {
	w := p.workers
	for {
		for len(p.backlog) > 0 && int(w.busy.Load()) < p.cfg.Workers {
			j := p.backlog[0]
			p.backlog[0] = job{}
			p.backlog = p.backlog[1:]
			w.busy.Add(1)
			p.jobs <- j // never blocks: busy < Workers == cap(jobs)
		}
		if len(p.backlog) == 0 {
			p.backlog = nil // let a large backlog's array go
			w.backlogged.Store(false)
			return
		}
		w.backlogged.Store(true)
		if int(w.busy.Load()) >= p.cfg.Workers {
			return // a finishing worker sees the mark and wakes the actor
		}
	}
}

func (p *poolActor) failBacklog(ctx actor.Context) {
	for _, j := range p.backlog {
		if j.replyTo != nil {
			ctx.Send(j.replyTo, &messages.DatapathResult{Err: fmt.Errorf("%s: %w", j.work.Op, ErrPoolClosed)})
		}
	}
	p.backlog = nil
}

func (p *poolActor) worker(ctx context.Context, system *actor.ActorSystem, self *actor.PID, jobs <-chan job, w *workerSet, gen int) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-jobs:
			res := p.run(ctx, j)
			wake := w.finished(res.Err != nil) // counted before anyone hears the answer
			if j.replyTo != nil {
				system.Root.Send(j.replyTo, res)
			}
			if wake {
				system.Root.Send(self, &workerDone{gen: gen})
			}
		}
	}
}

func (p *poolActor) run(ctx context.Context, j job) (res *messages.DatapathResult) {
	start := time.Now()
	timeout := j.work.Timeout
	if timeout <= 0 {
		timeout = p.cfg.DefaultTimeout
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			p.log.Error("datapath work panicked", "op", j.work.Op, "endpoint", j.work.Endpoint, "panic", r)
			res = &messages.DatapathResult{Err: fmt.Errorf("%s: panic: %v", j.work.Op, r)}
		}
		res.Queued, res.Ran = start.Sub(j.queued), time.Since(start)
	}()
	v, err := j.work.Run(wctx)
	return &messages.DatapathResult{Value: v, Err: err}
}
