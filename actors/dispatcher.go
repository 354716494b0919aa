package actors

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// workerDispatcher runs mailboxes on goroutines that outlive one run.
// protoactor's default dispatcher starts a goroutine each time an idle
// actor gets a message: with tens of thousands of short runs a second the
// runtime spends its time creating goroutines and growing their stacks
// (the index writes run deep; BENCHMARKS.md has the cost). Here a run is
// handed to a goroutine that waits for work, if one does, else to a new
// one; a goroutine idle for workerIdle exits, so a stopped agent leaves
// none behind. Nothing queues: a busy pool never delays a mailbox.
type workerDispatcher struct {
	throughput int
	handoff    chan func() // unbuffered: a send succeeds only to a waiting goroutine
	idle       time.Duration
}

// workerIdle is how long a dispatcher goroutine waits for work.
const workerIdle = time.Second

// mailboxThroughput is how many messages a mailbox processes before it
// yields (protoactor's default).
const mailboxThroughput = 300

var _ actor.Dispatcher = (*workerDispatcher)(nil)

// dispatcher is shared by every actor of every system in the process.
var dispatcher = newWorkerDispatcher(mailboxThroughput, workerIdle)

func newWorkerDispatcher(throughput int, idle time.Duration) *workerDispatcher {
	return &workerDispatcher{throughput: throughput, handoff: make(chan func()), idle: idle}
}

// Schedule implements actor.Dispatcher.
func (d *workerDispatcher) Schedule(fn func()) {
	select {
	case d.handoff <- fn:
	default:
		go d.work(fn)
	}
}

// Throughput implements actor.Dispatcher.
func (d *workerDispatcher) Throughput() int { return d.throughput }

func (d *workerDispatcher) work(fn func()) {
	idle := time.NewTimer(d.idle)
	defer idle.Stop()
	for {
		fn()
		fn = nil // a finished run keeps nothing reachable
		idle.Reset(d.idle)
		select {
		case fn = <-d.handoff:
		case <-idle.C:
			return
		}
	}
}

// mailboxOptions are the props options of every actor: an unbounded
// mailbox counted by stats, run by the shared dispatcher.
func mailboxOptions(stats *MailboxStats) []actor.PropsOption {
	return []actor.PropsOption{actor.WithMailbox(unboundedWithStats(stats)), actor.WithDispatcher(dispatcher)}
}
