package actors

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
)

// PoolConfig configures the datapath worker pool actor.
type PoolConfig struct {
	// Workers is the number of goroutines running blocking work. Blocking
	// syscalls in many goroutines serialise at GOMAXPROCS and delay
	// everything else, so keep it small (default 2x GOMAXPROCS, at least 4).
	Workers int
	// DefaultTimeout bounds work that sets no Timeout (default 30 s).
	DefaultTimeout time.Duration
}

// job is a DatapathWork with who asked and when.
type job struct {
	work    *messages.DatapathWork
	replyTo *actor.PID
	queued  time.Time
}

// workerDone tells the pool actor a worker of incarnation gen finished a job.
type workerDone struct {
	gen    int
	failed bool
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
	busy    int
	backlog []job
	done    uint64
	failed  uint64
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
		if msg.gen != p.gen {
			return
		}
		p.busy--
		p.done++
		if msg.failed {
			p.failed++
		}
		p.dispatch()
	case *getPoolStats:
		ctx.Respond(&PoolStats{Workers: p.cfg.Workers, Busy: p.busy, Backlog: len(p.backlog), Done: p.done, Failed: p.failed})
	}
}

func (p *poolActor) start(ctx actor.Context) {
	p.jobs = make(chan job, p.cfg.Workers)
	wctx, cancel := context.WithCancel(context.Background())
	p.stop = cancel
	p.gen++
	self, system := ctx.Self(), ctx.ActorSystem()
	for i := 0; i < p.cfg.Workers; i++ {
		go p.worker(wctx, system, self, p.jobs, p.gen)
	}
	p.busy = 0
}

func (p *poolActor) dispatch() {
	for p.busy < p.cfg.Workers && len(p.backlog) > 0 {
		j := p.backlog[0]
		p.backlog[0] = job{}
		p.backlog = p.backlog[1:]
		p.busy++
		p.jobs <- j // never blocks: busy < Workers == cap(jobs)
	}
	if len(p.backlog) == 0 {
		p.backlog = nil // let a large backlog's array go
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

func (p *poolActor) worker(ctx context.Context, system *actor.ActorSystem, self *actor.PID, jobs <-chan job, gen int) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-jobs:
			res := p.run(ctx, j)
			if j.replyTo != nil {
				system.Root.Send(j.replyTo, res)
			}
			system.Root.Send(self, &workerDone{gen: gen, failed: res.Err != nil})
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
