package actors

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// backendWorkers runs the blocking calls of a cluster identity backend
// for the identity actor: a few goroutines, each with a bounded queue.
// Every call for one label set goes to the same goroutine, so the
// backend sees a label set's Acquire and Release in the order the actor
// decided them, across actor restarts too. Each call's result comes back
// to the identity actor as a message. It also runs the backend's Watch,
// whose events it forwards as messages.
type backendWorkers struct {
	backend identity.ClusterBackend
	cfg     ClusterIdentityConfig
	log     *slog.Logger
	send    func(msg any) // into the identity actor's mailbox; never blocks
	ctx     context.Context
	cancel  context.CancelFunc
	queues  []chan func(context.Context)
	wg      sync.WaitGroup
}

// errWorkerQueueFull fails a backend call whose worker queue is full.
var errWorkerQueueFull = errors.New("identity backend worker queue full")

func newBackendWorkers(b identity.ClusterBackend, cfg ClusterIdentityConfig, send func(any), log *slog.Logger) *backendWorkers {
	ctx, cancel := context.WithCancel(context.Background())
	w := &backendWorkers{backend: b, cfg: cfg, log: log.With("component", "identity-backend"), send: send, ctx: ctx, cancel: cancel}
	for range cfg.Workers {
		q := make(chan func(context.Context), cfg.Queue)
		w.queues = append(w.queues, q)
		w.wg.Go(func() { w.run(q) })
	}
	return w
}

// startWatch starts the backend's Watch, once the identity actor exists.
func (w *backendWorkers) startWatch() { w.wg.Go(w.watch) }

func (w *backendWorkers) run(q chan func(context.Context)) {
	for {
		select {
		case <-w.ctx.Done():
			return
		case job := <-q:
			job(w.ctx)
		}
	}
}

// submit queues job on the worker of key without blocking.
func (w *backendWorkers) submit(key string, job func(context.Context)) error {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	select {
	case w.queues[int(h.Sum32()%uint32(len(w.queues)))] <- job:
		return nil
	default:
		return errWorkerQueueFull
	}
}

// acquire calls Acquire for ls on its worker (AcquirePreferred when
// preferred is set and the backend can honour it); the answer is a
// *clusterAcquired.
func (w *backendWorkers) acquire(ls labels.Labels, preferred identity.NumericIdentity) error {
	key := ls.Key()
	return w.submit(key, func(ctx context.Context) {
		cctx, cancel := context.WithTimeout(ctx, w.cfg.CallTimeout)
		var id identity.NumericIdentity
		var isNew bool
		var err error
		if pb, ok := w.backend.(identity.PreferringBackend); ok && preferred != identity.IdentityUnknown {
			id, isNew, err = pb.AcquirePreferred(cctx, ls, preferred)
		} else {
			id, isNew, err = w.backend.Acquire(cctx, ls)
		}
		cancel()
		w.send(&clusterAcquired{key: key, labels: ls, id: id, isNew: isNew, err: err})
	})
}

// release calls Release for id (whose labels are ls) once, on the worker
// of ls; the answer is a *clusterReleased. A failure is retried by the
// identity actor (clusterReleased), not here: a worker that retried would
// hold every later Acquire of the label set behind its backoff.
func (w *backendWorkers) release(id identity.NumericIdentity, ls labels.Labels) error {
	return w.submit(ls.Key(), func(ctx context.Context) {
		cctx, cancel := context.WithTimeout(ctx, w.cfg.CallTimeout)
		err := w.backend.Release(cctx, id)
		cancel()
		w.send(&clusterReleased{id: id, labels: ls, err: err})
	})
}

// watch runs the backend's Watch until the workers stop, restarting it
// with backoff when it fails.
func (w *backendWorkers) watch() {
	for attempt := 0; ; attempt++ {
		err := w.backend.Watch(w.ctx, func(ev identity.ClusterEvent) { w.send(&clusterWatched{ev: ev}) })
		if w.ctx.Err() != nil {
			return
		}
		if err == nil { // the backend was closed (the agent is stopping)
			w.log.Info("cluster identity watch ended: the store's client closed")
			return
		}
		w.log.Error("cluster identity watch ended; restarting", "err", err)
		if !w.sleep(w.ctx, backoff(w.cfg.RetryMin, w.cfg.RetryMax, attempt)) {
			return
		}
	}
}

// sleep waits d or until ctx is done; false when ctx is done.
func (w *backendWorkers) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// stop ends the watch and the workers, cancelling calls in flight.
func (w *backendWorkers) stop() {
	w.cancel()
	w.wg.Wait()
}

// clusterAcquired is the answer of a backend Acquire.
type clusterAcquired struct {
	key    string
	labels labels.Labels
	id     identity.NumericIdentity
	isNew  bool
	err    error
}

// clusterReleased is the answer of a backend Release.
type clusterReleased struct {
	id     identity.NumericIdentity
	labels labels.Labels
	err    error
}

// clusterReleaseRetry retries a failed backend Release.
type clusterReleaseRetry struct{ id identity.NumericIdentity }

// clusterWatched is one event of the backend's Watch.
type clusterWatched struct{ ev identity.ClusterEvent }

// clusterRetry retries the acquisition of a label set after a failure.
type clusterRetry struct{ key string }

// clusterWaitOver ends the wait of a label set's waiters (WaitMax).
type clusterWaitOver struct{ key string }

// identityPID is the identity actor's PID, known by name so that the
// backend workers, created before the actor, can address it.
func identityPID(sys *actor.ActorSystem) *actor.PID {
	return actor.NewPID(sys.Address(), "agent/identity")
}

// ClusterIdentityStatus is the identity actor's view of the cluster
// identity store, for /v1/status.
type ClusterIdentityStatus struct {
	// Store is the backend's own health.
	Store identity.ClusterStatus `json:"store"`
	// Known counts identities the store holds, as the watch reported them.
	Known int `json:"known"`
	// InUse counts the identities endpoints on this node hold.
	InUse int `json:"inUse"`
	// Waiting counts label sets waiting for the store (in flight or
	// retrying after a failure); WaitingLabels names up to 10 of them.
	Waiting       int      `json:"waiting"`
	WaitingLabels []string `json:"waitingLabels,omitempty"`
	// LastError is the most recent failed call, empty when none failed.
	LastError string `json:"lastError,omitempty"`
}

// ClusterIdentities returns the cluster identity state; false when the
// system runs with the node-local allocator.
func (s *System) ClusterIdentities() (ClusterIdentityStatus, bool) {
	if s.Config.IdentityBackend == nil {
		return ClusterIdentityStatus{}, false
	}
	var st ClusterIdentityStatus
	if p := s.deps.clusterStatus.Load(); p != nil {
		st = *p
	}
	st.Store = s.Config.IdentityBackend.Status()
	for _, row := range s.Index.Identities() {
		if row.RefCount > 0 {
			st.InUse++
		}
	}
	return st, true
}

func (st ClusterIdentityStatus) String() string {
	return fmt.Sprintf("%s healthy=%t synced=%t known=%d in-use=%d waiting=%d", st.Store.Backend, st.Store.Healthy, st.Store.Synced, st.Known, st.InUse, st.Waiting)
}
