package actors

import (
	"context"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/service"
)

// The services actor's datapath side: the reconciler's jobs. What the
// datapath holds (held, ids) and the rows' states follow each job's
// outcome; the reconciler answers the requests and retries failures.

// update is the reconciler's job writing the frontends fronts.
func (a *servicesActor) update(ctx actor.Context, fronts []service.Frontend) reconcileJob {
	ops := make([]serviceOp, len(fronts))
	for i, f := range fronts {
		ops[i] = a.op(f)
	}
	dp := a.dp
	return reconcileJob{op: "services",
		run:  func(c context.Context) ([]error, error) { return writeServices(c, dp, ops), nil },
		done: func(errs []error, _ error) { a.written(ctx, ops, errs) }}
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
		External: r.Service.Kind != service.KindClusterIP, TwoScopes: r.Service.TwoScopes}
}

func writeServices(ctx context.Context, dp datapath.ServiceDatapath, ops []serviceOp) []error {
	errs := make([]error, len(ops))
	for i := range ops {
		op := &ops[i]
		if op.delete {
			if op.svc.ID != 0 {
				errs[i] = dp.DeleteService(ctx, op.svc.Frontend, op.svc.ID, op.prev)
			}
			continue
		}
		// A row whose ID changed (deleted and re-added while a write was
		// in flight keeps its ID, so only a failed delete leaves one).
		errs[i] = dp.UpsertService(ctx, op.svc, op.prev)
	}
	return errs
}

// written records what the datapath holds after ops and updates the
// rows' states.
func (a *servicesActor) written(ctx actor.Context, ops []serviceOp, errs []error) {
	for i, op := range ops {
		f := op.svc.Frontend
		if err := errs[i]; err != nil {
			if !op.delete {
				a.held[f] = heldService{id: op.svc.ID, count: max(op.prev, len(op.svc.Backends))}
				a.ids[op.svc.ID] = f
			}
			a.setState(ctx, f, op.svc.ID, index.ServiceFailed, err)
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
}

// setState rewrites f's row with state, if the row is still the one
// that was written (same ID) and its state differs.
func (a *servicesActor) setState(ctx actor.Context, f service.Frontend, id uint32, state string, err error) {
	r := a.rows[f]
	if r == nil || r.ID != id {
		return
	}
	if state == index.ServiceRealized && a.rec.pending(f) {
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

// syncAll is the reconciler's full sync: the datapath's maps hold exactly
// the rows afterwards (ServicePrune).
func (a *servicesActor) syncAll(ctx actor.Context) reconcileJob {
	desired := make([]datapath.LBService, 0, len(a.rows))
	for _, r := range a.rows {
		desired = append(desired, lbService(r))
	}
	dp := a.dp
	return reconcileJob{op: "services-prune",
		run: func(c context.Context) ([]error, error) { return nil, dp.SyncServices(c, desired) },
		done: func(_ []error, err error) {
			if err == nil {
				a.pruned(ctx, desired)
			}
		}}
}

// pruned records that the datapath holds exactly desired.
func (a *servicesActor) pruned(ctx actor.Context, desired []datapath.LBService) {
	a.held = make(map[service.Frontend]heldService, len(desired))
	a.ids = make(map[uint32]service.Frontend, len(desired))
	for _, s := range desired {
		a.held[s.Frontend] = heldService{id: s.ID, count: len(s.Backends)}
		a.ids[s.ID] = s.Frontend
		a.setState(ctx, s.Frontend, s.ID, index.ServiceRealized, nil)
	}
	a.adopted, a.adoptedIDs = nil, nil
	a.log.Info("service maps pruned", "services", len(desired))
}
