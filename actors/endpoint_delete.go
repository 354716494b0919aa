package actors

import (
	"context"
	"errors"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// Deletion of an endpoint: the steps of lifecycle, in order.

// delete starts deleting the endpoint; replyTo (may be nil) is answered
// when it is disconnected.
func (a *endpointActor) delete(ctx actor.Context, opts endpoint.DeleteOptions, replyTo *actor.PID) {
	if replyTo != nil {
		a.delReplies = append(a.delReplies, messages.Reply{To: replyTo})
	}
	if a.deleting() {
		return
	}
	a.life = lifeDeleting
	a.mut().Deleting = opts
	a.setState(endpoint.StateDisconnecting, "delete requested")
	a.stopRetry()
	errDel := fmt.Errorf("endpoint %d: %w", a.ep.ID, ErrEndpointDeleting)
	rs := replies(a.regen.pendingWaiters, a.result(errDel))
	rs = append(rs, replies(a.labelWaiters, a.result(errDel))...)
	rs = append(rs, replies(a.labelDurableWaiters(), a.result(errDel))...)
	if a.createWaiter != nil {
		rs = append(rs, messages.Reply{To: a.createWaiter, Message: a.result(errDel)})
		a.createWaiter = nil
	}
	a.regen.pendingWaiters, a.labelWaiters, a.regen.want = nil, nil, wantNone
	a.publish(ctx, rs...)
	a.advance(ctx)
}

func (a *endpointActor) stopRetry() {
	if a.regen.retryTimer != nil {
		a.regen.retryTimer.Stop()
		a.regen.retryTimer = nil
	}
}

// deleteSteps are deletion's steps, indexed by the step the endpoint is
// at; each ends by moving life to the next one. The datapath goes first,
// then the state, both while the row is still in the index: once the row
// is gone a DELETE answers 404, which a CNI DEL takes as done, so nothing
// may bring the endpoint back after that (a crash before the state
// removal restores it, and the retried DEL finds it); and nothing is left
// in the kernel for an endpoint that will not be restored. At
// lifeLeavingIndex the endpoint waits for the index's commit, then
// ends its leases and stops (releaseLeases).
var deleteSteps = [...]func(*endpointActor, actor.Context){
	lifeDeleting:        func(a *endpointActor, ctx actor.Context) { a.removeDatapath(ctx, 0) },
	lifeDatapathRemoved: (*endpointActor).removeState,
	lifeStateRemoved:    (*endpointActor).leaveIndex,
	lifeLeavingIndex:    nil,
}

// advance runs the deletion's next steps while nothing is in flight (a
// datapath operation, a state write, an identity or address lease, a
// regeneration); the continuation of a step in flight moves life on, and
// the message that carries it calls advance again.
func (a *endpointActor) advance(ctx actor.Context) {
	for a.life != lifeLive && a.ioWait == 0 && !a.leaseWait && !a.regen.running {
		at := a.life
		step := deleteSteps[at]
		if step == nil {
			return
		}
		step(a, ctx)
		if a.life == at {
			return // in flight
		}
	}
}

// removeState removes the endpoint's state from disk.
func (a *endpointActor) removeState(ctx actor.Context) {
	if a.deps.store == nil {
		a.life = lifeStateRemoved
		return
	}
	id, store := a.ep.ID, a.deps.store
	a.stateOp(ctx, "remove", func(done func(error)) { store.Remove(id, done) }, func(ctx actor.Context, err error) {
		if err != nil {
			a.logger().Error("removing endpoint state failed", "err", err)
		}
		a.life, a.stateStays = lifeStateRemoved, err != nil
	})
}

// leaveIndex takes the endpoint out of the ipcache, the policy actor's
// books and the index. It leaves the index before the leases end, so the
// endpoint's container ID and addresses are free in the manager's books
// before IPAM releases anything.
func (a *endpointActor) leaveIndex(ctx actor.Context) {
	a.life = lifeLeavingIndex
	if ips := a.ips(); len(ips) > 0 {
		ctx.Send(a.deps.ipcache, &messages.IPCacheEndpoint{Endpoint: a.ep.ID, IPs: ips, Deleted: true})
	}
	ctx.Send(a.deps.policy, &messages.EndpointPolicyGone{Endpoint: a.ep.ID})
	a.mut().State = endpoint.StateDisconnecting
	a.shared = true
	removed := a.req.replyTo(ctx, 0, func(any, error) { a.releaseLeases(ctx) })
	ctx.Send(a.manager, &messages.EndpointChanged{From: ctx.Self(), Endpoint: a.ep, Deleted: true,
		Replies: []messages.Reply{{To: removed, Message: struct{}{}}}})
}

// releaseLeases ends the IP lease (releasing the addresses unless
// NoIPRelease, which keeps them reserved for their owner) and the identity
// reference this actor holds, then the endpoint is disconnected. The
// identity actor drops only a reference this actor took, which is what
// Cilium's NoIdentityRelease protects (a restored endpoint cleaned up
// before it re-acquired its identity must not drop another's reference),
// so the flag needs no path of its own and never leaks a reference.
func (a *endpointActor) releaseLeases(ctx actor.Context) {
	done := func() {
		var err error
		if a.stateStays {
			err = fmt.Errorf("delete endpoint %d: %w", a.ep.ID, ErrStateStays)
		}
		a.disconnected(ctx, err)
	}
	next := func() {
		if a.ep.Identity != 0 && !a.ep.Identity.IsReserved() {
			msg := &messages.IdentityRelease{ID: a.ep.Identity, Holder: ctx.Self()}
			a.request(ctx, a.deps.identity, msg, a.deps.cfg.RequestTimeout, func(any, error) { done() })
			return
		}
		done()
	}
	if ips := a.ips(); len(ips) > 0 && !a.ep.Chained { // a chained endpoint claimed none
		msg := &messages.IPAMUnclaim{Endpoint: a.ep.ID, IPs: ips, Release: !a.ep.Deleting.NoIPRelease}
		a.request(ctx, a.deps.ipam, msg, a.deps.cfg.RequestTimeout, func(any, error) { next() })
		return
	}
	next()
}

// removeDatapath tears down the kernel side (idempotent), retrying a few
// times; what still fails is left to the orphan garbage collector.
func (a *endpointActor) removeDatapath(ctx actor.Context, attempt int) {
	a.shared = true
	snap, dp := a.ep, a.deps.dp
	a.datapathOp(ctx, "remove", func(c context.Context) (any, error) {
		return nil, dp.Remove(c, snap)
	}, func(ctx actor.Context, _ any, err error) {
		if err != nil && attempt < 2 {
			a.logger().Warn("datapath remove failed; retrying", "attempt", attempt+1, "err", err)
			a.removeDatapath(ctx, attempt+1)
			return
		}
		if err != nil {
			a.logger().Error("datapath remove failed; leaving it to garbage collection", "err", err)
		}
		a.life = lifeDatapathRemoved
	})
}

// disconnected answers the delete's waiters and stops the actor. With
// err (the state removal failed, so the endpoint may come back at the
// next start) every waiter gets the error: a delete is acknowledged only
// once it is durable.
func (a *endpointActor) disconnected(ctx actor.Context, err error) {
	a.setState(endpoint.StateDisconnected, "delete completed")
	res := a.result(err)
	for _, r := range a.delReplies {
		msg := r.Message
		switch failed, ok := msg.(*messages.EndpointResult); {
		case ok && failed.Err != nil && err != nil:
			// A failed creation's rollback failed too: the caller hears
			// both, the creation's cause first (a state write the disk
			// refused also refuses the removal).
			msg = &messages.EndpointResult{Err: errors.Join(failed.Err, err)}
		case msg == nil || err != nil:
			msg = res
		}
		ctx.Send(r.To, msg)
	}
	a.delReplies = nil
	a.stopTimers()
	ctx.Stop(ctx.Self())
}
