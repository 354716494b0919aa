package actors

import (
	"context"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/service"
)

// The services actor's datapath side: dirty frontends are written in one
// pool job at a time; the requests whose changes a finished job held are
// answered; failed frontends are retried with backoff.

// sync writes the dirty frontends in one pool job, unless one is in
// flight (it runs again when that one finishes).
func (a *servicesActor) sync(ctx actor.Context) {
	if a.syncing || a.adopting || a.dp == nil {
		return
	}
	if a.prune {
		a.syncAll(ctx)
		return
	}
	if len(a.dirty) == 0 {
		return
	}
	ops := make([]serviceOp, 0, len(a.dirty))
	for f := range a.dirty {
		ops = append(ops, a.op(f))
	}
	a.dirty = map[service.Frontend]struct{}{}
	a.syncing = true
	seq, dp := a.seq, a.dp
	work := &messages.DatapathWork{Op: "services", Run: func(c context.Context) (any, error) {
		return writeServices(c, dp, ops), nil
	}}
	a.req.inPool(ctx, a.deps, work, func(v any, err error) {
		done, _ := v.([]serviceOp)
		if err != nil {
			done = ops
			for i := range done {
				done[i].err = err
			}
		}
		a.synced(ctx, done, seq)
	})
}

// op is the write that makes the datapath match f's row (or its absence).
func (a *servicesActor) op(f service.Frontend) serviceOp {
	h := a.held[f]
	r := a.rows[f]
	if r == nil {
		return serviceOp{svc: datapath.LBService{ID: h.id, Frontend: f}, delete: true, prev: h.count}
	}
	return serviceOp{svc: lbService(r), prev: h.count}
}

func lbService(r *index.ServiceRow) datapath.LBService {
	return datapath.LBService{ID: r.ID, Frontend: r.Service.Frontend, Backends: r.Service.Backends, Affinity: r.Service.Affinity,
		External: r.Service.Kind != service.KindClusterIP}
}

func writeServices(ctx context.Context, dp datapath.ServiceDatapath, ops []serviceOp) []serviceOp {
	for i := range ops {
		op := &ops[i]
		if op.delete {
			if op.svc.ID != 0 {
				op.err = dp.DeleteService(ctx, op.svc.Frontend, op.svc.ID, op.prev)
			}
			continue
		}
		// A row whose ID changed (deleted and re-added while a write was
		// in flight keeps its ID, so only a failed delete leaves one).
		op.err = dp.UpsertService(ctx, op.svc, op.prev)
	}
	return ops
}

// synced records what the datapath holds, updates the rows' states,
// answers the requests the batch covered and retries failures.
func (a *servicesActor) synced(ctx actor.Context, done []serviceOp, seq uint64) {
	a.syncing = false
	failed := map[service.Frontend]error{}
	for _, op := range done {
		f := op.svc.Frontend
		if op.err != nil {
			failed[f] = op.err
			if _, ok := a.dirty[f]; !ok {
				a.dirty[f] = struct{}{}
			}
			if !op.delete {
				a.held[f] = heldService{id: op.svc.ID, count: max(op.prev, len(op.svc.Backends))}
				a.ids[op.svc.ID] = f
			}
			a.setState(ctx, f, op.svc.ID, index.ServiceFailed, op.err)
			continue
		}
		if op.delete {
			delete(a.held, f)
			if r := a.rows[f]; r == nil || r.ID != op.svc.ID {
				delete(a.ids, op.svc.ID)
			}
			continue
		}
		a.held[f] = heldService{id: op.svc.ID, count: len(op.svc.Backends)}
		a.setState(ctx, f, op.svc.ID, index.ServiceRealized, nil)
	}
	a.answer(ctx, seq, failed)
	if len(failed) > 0 {
		a.retryLater(ctx, firstServiceErr(failed))
	} else {
		a.backoff = 0
	}
	a.sync(ctx)
}

func firstServiceErr(m map[service.Frontend]error) error {
	for _, err := range m {
		return err
	}
	return nil
}

// setState rewrites f's row with state, if the row is still the one
// that was written (same ID) and its state differs.
func (a *servicesActor) setState(ctx actor.Context, f service.Frontend, id uint32, state string, err error) {
	r := a.rows[f]
	if r == nil || r.ID != id {
		return
	}
	if _, again := a.dirty[f]; again && state == index.ServiceRealized {
		return // changed meanwhile: the next write decides
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if r.State == state && r.Error == msg {
		return
	}
	n := *r
	n.State, n.Error = state, msg
	a.rows[f] = &n
	a.batch.putKeyed(ctx, index.TableServices, f, &n)
}

// answer replies to the requests numbered up to seq (after the commit).
func (a *servicesActor) answer(ctx actor.Context, seq uint64, failed map[service.Frontend]error) {
	keep := a.waiters[:0]
	for _, w := range a.waiters {
		if w.seq > seq {
			keep = append(keep, w)
			continue
		}
		for _, f := range w.frontends {
			if err := failed[f]; err != nil && w.res.Err == nil {
				w.res.Err = err
			}
		}
		a.batch.reply(ctx, w.to, w.res)
	}
	clear(a.waiters[len(keep):])
	a.waiters = keep
}

// syncAll makes the datapath's maps hold exactly the rows (ServicePrune).
func (a *servicesActor) syncAll(ctx actor.Context) {
	desired := make([]datapath.LBService, 0, len(a.rows))
	for _, r := range a.rows {
		desired = append(desired, lbService(r))
	}
	a.prune, a.syncing = false, true
	dirty := a.dirty
	a.dirty = map[service.Frontend]struct{}{}
	seq, dp := a.seq, a.dp
	work := &messages.DatapathWork{Op: "services-prune", Run: func(c context.Context) (any, error) {
		return nil, dp.SyncServices(c, desired)
	}}
	a.req.inPool(ctx, a.deps, work, func(_ any, err error) {
		a.syncing = false
		if err != nil {
			a.prune = true
			for f := range dirty {
				a.dirty[f] = struct{}{}
			}
			a.retryLater(ctx, err)
			return
		}
		a.held = make(map[service.Frontend]heldService, len(desired))
		a.ids = make(map[uint32]service.Frontend, len(desired))
		for _, s := range desired {
			a.held[s.Frontend] = heldService{id: s.ID, count: len(s.Backends)}
			a.ids[s.ID] = s.Frontend
			a.setState(ctx, s.Frontend, s.ID, index.ServiceRealized, nil)
		}
		a.adopted, a.adoptedIDs = nil, nil
		a.log.Info("service maps pruned", "services", len(desired))
		a.backoff = 0
		a.answer(ctx, seq, nil)
		a.sync(ctx)
	})
}

// retryLater schedules the next sync with exponential backoff.
func (a *servicesActor) retryLater(ctx actor.Context, err error) {
	a.backoff = min(max(2*a.backoff, ipcacheRetryMin), ipcacheRetryMax)
	a.log.Warn("service map write failed; retrying", "err", err, "in", a.backoff)
	if a.retry == nil {
		self, system := ctx.Self(), ctx.ActorSystem()
		a.retry = time.AfterFunc(a.backoff, func() { system.Root.Send(self, &servicesRetry{}) })
	}
}
