package actors

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
)

// reconcileRetryMin and reconcileRetryMax bound the backoff between a
// reconciler's failed jobs and its retry.
const (
	reconcileRetryMin = 100 * time.Millisecond
	reconcileRetryMax = 30 * time.Second
)

// reconciler is the one loop that writes an owner actor's desired state
// to the datapath (cilium/statedb's reconciler, turned into an actor's
// part): the ipcache's prefixes, the nodes' routes and the services'
// frontends all go through it, not through a dirty set of their own.
//
// It lives inside its owner and never blocks: the owner marks the keys
// whose desired state changed (mark) or asks for a full sync (resync),
// then calls sync at the end of the message. sync hands every marked key
// to the worker pool as one job (ops.update; ops.prune for a full sync),
// and while that job runs the keys marked meanwhile wait for the next
// one: a burst of changes coalesces into one job and at most one job per
// owner is in flight, so writes of one key never overtake each other.
// The job's answer comes back through the owner's requester as a message;
// its keys that failed are marked again and retried with backoff (the
// retry timer's message, reconcileRetry, is handled by owner.lifecycle),
// or sooner by the next sync a change starts. The owner's Stopping and
// Restarting stop the timer; a restarted owner is a new actor with a new
// reconciler, rebuilt from the index.
//
// Each key not known to be in the datapath has a status: pending (marked,
// or in the job in flight) or failed (the last write's error and the
// consecutive failed writes). A key written as desired has no status
// (done): the statuses cost heap only for the keys still to write.
type reconciler[K comparable] struct {
	ops reconcileOps[K]
	log *slog.Logger

	status    map[K]keyStatus // keys not done
	resyncDue bool            // a full sync is due
	// paused holds every job back (the services actor while it reads the
	// maps back); sync starts the due one once it is cleared.
	paused   bool
	inFlight bool
	jobs     uint64 // jobs started; waiters count in them
	failures int    // consecutive failed jobs: the backoff's attempt
	failing  int    // keys whose status holds an error
	lastErr  string // the last failed job's first error, while failures > 0
	retry    *time.Timer
	waiters  []reconcileWaiter[K]

	// submit hands work to the pool and continues in the actor with its
	// answer (the owner's requester.inPool); after arms the retry timer,
	// which sends the actor reconcileRetry. Tests replace both.
	submit func(ctx actor.Context, work *messages.DatapathWork, cont func(any, error))
	after  func(ctx actor.Context, d time.Duration) *time.Timer
}

// reconcileOps is what an owner supplies to its reconciler. Both make a
// job in the actor, capturing the desired state its run writes: run
// executes in the pool and must not read the actor's state.
type reconcileOps[K comparable] struct {
	// update makes the job that writes each key's desired state, or
	// deletes the key when it has none; its run returns one error per
	// key, in order (nil: written). Nil: no writes per key.
	update func(ctx actor.Context, keys []K) reconcileJob
	// prune makes the job that makes the datapath hold exactly the
	// desired state (a full sync, which covers every key). Nil: the
	// datapath cannot; resync does nothing.
	prune func(ctx actor.Context) reconcileJob
}

// reconcileJob is one pool job of a reconciler.
type reconcileJob struct {
	op string // the DatapathWork's Op, also in the log
	// run writes in the pool. An update's returns one error per key; a
	// full sync's returns none and its outcome as err.
	run func(context.Context) ([]error, error)
	// done, when set, runs in the actor once the job ended, before the
	// reconciler records the outcome (so pending tells which keys
	// changed while the job ran): errs is an update's error per key (the
	// job's own error for every key when it failed whole), err the job's
	// own error.
	done func(errs []error, err error)
}

// keyStatus is a key's status while it is not done.
type keyStatus struct {
	err      error  // the last write's failure; nil: pending
	attempts uint32 // consecutive failed writes
	dirty    bool   // due in the next job (marked, or failed); else in flight
}

// reconcileState is a key's status as introspection and tests see it.
type reconcileState struct {
	Kind     reconcileKind
	Err      error  // the last failure (failed)
	Attempts uint32 // consecutive failed writes (failed)
}

// reconcileKind is where a key stands.
type reconcileKind uint8

const (
	reconcileDone    reconcileKind = iota // the datapath holds the desired state
	reconcilePending                      // to write, or being written
	reconcileFailed                       // the last write failed; retried
)

// reconcileWaiter is a barrier or a wait, answered after job need.
type reconcileWaiter[K comparable] struct {
	need uint64
	keys []K  // a wait's keys, whose errors it reports
	all  bool // a barrier: only a job that succeeded whole answers it
	done func(error)
}

// reconcileRetry is a reconciler's retry timer message.
type reconcileRetry struct{}

// reconcileHooks is what owner.lifecycle calls on its actor's reconciler.
type reconcileHooks interface {
	retried(ctx actor.Context)
	stop()
	report() ReconcilerSnapshot
}

var _ reconcileHooks = (*reconciler[int])(nil)

// init sets r up in its owner o: its jobs go to the pool through o's
// requester and o's lifecycle handles its timer.
func (r *reconciler[K]) init(o *owner, deps *endpointDeps, log *slog.Logger, ops reconcileOps[K]) {
	r.ops, r.log = ops, log
	r.status = map[K]keyStatus{}
	r.submit = func(ctx actor.Context, work *messages.DatapathWork, cont func(any, error)) {
		o.req.inPool(ctx, deps, work, cont)
	}
	r.after = func(ctx actor.Context, d time.Duration) *time.Timer {
		self, root := ctx.Self(), ctx.ActorSystem().Root
		return time.AfterFunc(d, func() { root.Send(self, &reconcileRetry{}) })
	}
	o.rec = r
}

// mark makes k due: its desired state changed (or is to be written
// again). No-op without ops.update.
func (r *reconciler[K]) mark(k K) {
	if r.ops.update == nil {
		return
	}
	s := r.status[k]
	s.dirty = true
	r.status[k] = s
}

// resync makes a full sync due (Prune). No-op without ops.prune.
func (r *reconciler[K]) resync() {
	if r.ops.prune != nil {
		r.resyncDue = true
	}
}

// due reports whether a job is due.
func (r *reconciler[K]) due() bool {
	if r.resyncDue {
		return true
	}
	for _, s := range r.status {
		if s.dirty {
			return true
		}
	}
	return false
}

// pending reports whether k is due (changed since the job in flight
// started, or failed).
func (r *reconciler[K]) pending(k K) bool { return r.status[k].dirty }

// state returns k's status.
func (r *reconciler[K]) state(k K) reconcileState {
	s, ok := r.status[k]
	switch {
	case !ok:
		return reconcileState{}
	case s.err != nil:
		return reconcileState{Kind: reconcileFailed, Err: s.err, Attempts: s.attempts}
	}
	return reconcileState{Kind: reconcilePending}
}

// report is what introspection shows of r.
func (r *reconciler[K]) report() ReconcilerSnapshot {
	return ReconcilerSnapshot{Pending: len(r.status), Failed: r.failing, Failures: r.failures, LastError: r.lastErr}
}

// sync starts the due job, unless one is in flight (it runs again when
// that one ends) or the reconciler is paused.
func (r *reconciler[K]) sync(ctx actor.Context) {
	if r.inFlight || r.paused {
		return
	}
	keys := make([]K, 0, len(r.status))
	for k, s := range r.status {
		if s.dirty {
			s.dirty = false
			r.status[k] = s
			keys = append(keys, k)
		}
	}
	switch {
	case r.resyncDue:
		r.resyncDue = false
		r.start(ctx, r.ops.prune(ctx), keys, true)
	case len(keys) > 0:
		r.start(ctx, r.ops.update(ctx, keys), keys, false)
	}
}

// start hands job, which writes keys (every key when full), to the pool.
func (r *reconciler[K]) start(ctx actor.Context, job reconcileJob, keys []K, full bool) {
	r.inFlight = true
	r.jobs++
	n := r.jobs
	work := &messages.DatapathWork{Op: job.op, Run: func(c context.Context) (any, error) {
		errs, err := job.run(c)
		return errs, err
	}}
	r.submit(ctx, work, func(v any, err error) {
		errs, _ := v.([]error)
		if full {
			errs = nil
		} else if err == nil && len(errs) != len(keys) {
			err = fmt.Errorf("%s: %d results for %d writes", job.op, len(errs), len(keys))
		}
		if !full && err != nil {
			errs = make([]error, len(keys))
			for i := range errs {
				errs[i] = err
			}
		}
		r.ended(ctx, n, job, keys, full, errs, err)
	})
}

// ended records the outcome of job n, answers the waiters it satisfies
// and starts the next job, or arms the retry timer when a write failed.
func (r *reconciler[K]) ended(ctx actor.Context, n uint64, job reconcileJob, keys []K, full bool, errs []error, err error) {
	r.inFlight = false
	if job.done != nil {
		job.done(errs, err)
	}
	failed := 0
	var first error
	for i, k := range keys {
		kerr := err
		if !full {
			kerr = errs[i]
		}
		s := r.status[k]
		if s.err != nil {
			r.failing--
		}
		switch {
		case kerr != nil:
			s.err, s.dirty = kerr, true
			s.attempts++
			r.failing++
			failed++
			first = cmp.Or(first, kerr)
		case !s.dirty:
			delete(r.status, k)
			continue
		default: // changed while written: pending again
			s.err, s.attempts = nil, 0
		}
		r.status[k] = s
	}
	if full && err != nil {
		r.resyncDue = true
		failed, first = max(failed, 1), err
	}
	r.answer(n, keys, errs, full, err, failed > 0)
	if failed == 0 {
		r.failures, r.lastErr = 0, ""
		r.sync(ctx)
		return
	}
	r.failures++
	r.lastErr = first.Error()
	d := backoff(reconcileRetryMin, reconcileRetryMax, r.failures-1)
	r.log.Warn("datapath writes failed; retrying", "op", job.op, "failed", failed, "err", first, "in", d)
	if r.retry == nil {
		r.retry = r.after(ctx, d)
	}
}

// retried handles the retry timer's message.
func (r *reconciler[K]) retried(ctx actor.Context) {
	r.retry = nil
	r.sync(ctx)
}

// stop stops the retry timer (the owner's Stopping and Restarting: an
// armed timer's closure would keep the actor system reachable).
func (r *reconciler[K]) stop() {
	if r.retry != nil {
		r.retry.Stop()
		r.retry = nil
	}
}

// barrier calls done once the datapath holds every change marked before
// it: at once when nothing is due or in flight, else after the first job
// that covers them and succeeds whole (a failed one moves it to the
// retry).
func (r *reconciler[K]) barrier(done func()) {
	r.enqueue(reconcileWaiter[K]{all: true, done: func(error) { done() }})
}

// wait calls done after the job that writes keys (just marked) ended,
// with the first of their errors; a failed full sync, which reports no
// key's outcome, moves it to the retry.
func (r *reconciler[K]) wait(keys []K, done func(error)) {
	r.enqueue(reconcileWaiter[K]{keys: keys, done: done})
}

func (r *reconciler[K]) enqueue(w reconcileWaiter[K]) {
	due := r.due()
	if !due && !r.inFlight {
		w.done(nil)
		return
	}
	w.need = r.jobs
	if due {
		w.need++
	}
	r.waiters = append(r.waiters, w)
}

// answer answers the waiters job n satisfies (see barrier and wait).
func (r *reconciler[K]) answer(n uint64, keys []K, errs []error, full bool, err error, failed bool) {
	var byKey map[K]error
	if failed && !full {
		byKey = make(map[K]error)
		for i, k := range keys {
			if errs[i] != nil {
				byKey[k] = errs[i]
			}
		}
	}
	ws := r.waiters
	r.waiters = nil // a done callback may add waiters
	kept := ws[:0]
	for _, w := range ws {
		switch {
		case w.need > n:
		case w.all && failed, !w.all && full && err != nil:
			w.need = n + 1
		default:
			var werr error
			for _, k := range w.keys {
				if werr = byKey[k]; werr != nil {
					break
				}
			}
			w.done(werr)
			continue
		}
		kept = append(kept, w)
	}
	clear(ws[len(kept):])
	r.waiters = append(kept, r.waiters...)
}

// backoff is the one exponential backoff: min·2^attempt capped at max.
func backoff(minD, maxD time.Duration, attempt int) time.Duration {
	d := minD << min(attempt, 20)
	if d > maxD || d <= 0 {
		return maxD
	}
	return d
}
