package actors

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// requestRegen records a regeneration request. Requests coalesce: while
// one regeneration runs (or the identity is unresolved) at most one more
// is pending, and every request merged into it bumps the desired revision
// and waits for it.
func (a *endpointActor) requestRegen(ctx actor.Context, waiter *actor.PID) {
	a.regen.pendingFull = true
	a.requestRegenLevel(ctx, waiter)
}

// requestPolicyRegen requests a policy-only regeneration: the policy of
// the endpoint's identity changed, nothing on disk did.
func (a *endpointActor) requestPolicyRegen(ctx actor.Context) {
	if a.ep.Regenerations == 0 && !a.regen.running {
		a.regen.pendingFull = true // never built: the first build is full
	}
	a.requestRegenLevel(ctx, nil)
}

func (a *endpointActor) requestRegenLevel(ctx actor.Context, waiter *actor.PID) {
	if a.deleting {
		if waiter != nil {
			ctx.Send(waiter, a.result(fmt.Errorf("regenerate endpoint %d: %w", a.ep.ID, ErrEndpointDeleting)))
		}
		return
	}
	a.mut().DesiredRevision++
	a.deps.counters.regenRequested.Add(1)
	if waiter != nil {
		a.regen.pendingWaiters = append(a.regen.pendingWaiters, waiter)
	}
	if a.regen.running || a.idBusy || a.dpBusy || a.ep.State == endpoint.StateWaitingForIdentity {
		if a.regen.pending {
			a.regen.coalesced++ // merged into the pending regeneration
		}
		a.regen.pending = true
		return
	}
	a.startRegen(ctx)
}

// startRegen runs one regeneration of the desired revision: policy for the
// identity (from the policy actor) -> state write (full regenerations
// only: a policy-only one changes nothing on disk) -> datapath realise in
// the worker pool -> proxy acknowledgements -> ready.
func (a *endpointActor) startRegen(ctx actor.Context) {
	if a.regen.retryTimer != nil {
		a.regen.retryTimer.Stop()
		a.regen.retryTimer = nil
	}
	if a.ep.State == endpoint.StateReady {
		a.setState(endpoint.StateWaitingToRegenerate, "regeneration requested")
	}
	if !a.setState(endpoint.StateRegenerating, "regeneration started") {
		a.regen.pending = true // retried when the state allows it
		return
	}
	full := a.regen.pendingFull || a.ep.Regenerations == 0
	a.regen.running, a.regen.pending, a.regen.pendingFull = true, false, false
	a.regen.rev = a.ep.DesiredRevision
	a.regen.waiters, a.regen.pendingWaiters = a.regen.pendingWaiters, nil
	a.deps.counters.regenRun.Add(1)
	now := time.Now().UnixNano()
	a.regen.runs++
	a.regen.started, a.regen.phaseStart, a.regen.phases = now, now, [4]uint32{}
	if a.ep.Regenerations > 0 {
		// The first build is not published as regenerating: its waiter
		// (sync PUT) sees the outcome, and it saves an index write per
		// endpoint creation.
		a.publish(ctx)
	}
	msg := &messages.ComputePolicy{Endpoint: a.ep.ID, Identity: a.ep.Identity}
	a.request(ctx, a.deps.policy, msg, a.deps.cfg.RequestTimeout, func(res any, err error) {
		r, ok := res.(*messages.PolicyComputed)
		switch {
		case a.deleting:
			a.endRegen(ctx, fmt.Errorf("regenerate endpoint %d: %w", a.ep.ID, ErrEndpointDeleting))
			a.maybeTeardown(ctx)
		case err != nil || !ok:
			a.regenFailed(ctx, fmt.Errorf("compute policy: %w", errors.Join(err, errUnexpected(res))))
		default:
			if a.ep.Policy != r.Policy {
				a.mut().Policy = r.Policy
			}
			a.writeAndRealize(ctx, full)
		}
	})
}

func errUnexpected(res any) error {
	if _, ok := res.(*messages.PolicyComputed); ok || res == nil {
		return nil
	}
	return fmt.Errorf("unexpected answer %T", res)
}

// writeAndRealize writes the state (full only) and realises the datapath.
func (a *endpointActor) writeAndRealize(ctx actor.Context, full bool) {
	a.shared = true
	snap, rev, dp := a.ep, a.regen.rev, a.deps.dp
	realize := func(ctx actor.Context, err error) {
		switch {
		case a.deleting:
			a.endRegen(ctx, fmt.Errorf("regenerate endpoint %d: %w", a.ep.ID, ErrEndpointDeleting))
			a.maybeTeardown(ctx)
		case err != nil:
			a.regenFailed(ctx, err)
		default:
			a.phaseDone(0)
			a.datapathOp(ctx, "realize", func(c context.Context) (any, error) {
				return dp.Realize(c, snap, rev)
			}, a.realized)
		}
	}
	if !full {
		realize(ctx, nil)
		return
	}
	// State on disk first, so that a crash after the datapath changed
	// still finds the endpoint at restore.
	a.stateOp(ctx, "write", a.writeState(snap), realize)
}

// writeState returns the submit function writing ep's state.
func (a *endpointActor) writeState(ep *endpoint.Endpoint) func(done func(error)) {
	a.labelWriteStarted()
	return func(done func(error)) { a.deps.store.Write(ep, done) }
}

// stateWait is the state store operation an endpoint actor waits for.
type stateWait struct {
	seq  uint64
	op   string // "write" or "remove"
	cont func(actor.Context, error)
}

// stateDone is the store's answer to a stateWait, sent to the actor
// itself. seq tells a late answer to an earlier incarnation (a restart
// drops the operation it waited for) from the one awaited.
type stateDone struct {
	seq uint64
	err error
}

// stateSeq numbers state operations across incarnations.
var stateSeq atomic.Uint64

// stateOp runs a state store operation (asynchronous, group-committed
// by the store's writer) and continues with cont once it is durable or
// failed. The store's answer comes back as a message to the actor, not
// through a future: there are three per lifecycle, and a future costs a
// timer and a process-registry entry. The store answers every request
// (Close and Abort included), so there is no timeout; a disk that hangs
// shows as an operation that lasts in GET /v1/actors.
func (a *endpointActor) stateOp(ctx actor.Context, op string, submit func(done func(error)), cont func(actor.Context, error)) {
	if a.deps.store == nil {
		cont(ctx, nil)
		return
	}
	a.dpBusy = true
	seq := stateSeq.Add(1)
	a.stateWait = &stateWait{seq: seq, op: op, cont: cont}
	self, root := ctx.Self(), ctx.ActorSystem().Root
	submit(func(err error) { root.Send(self, &stateDone{seq: seq, err: err}) })
	if op == "write" {
		a.setOp(PhaseWriteState)
	} else {
		a.setOp(opRemoveState)
	}
}

// opRemoveState is the operation name of a state removal in actor
// snapshots (a write is PhaseWriteState).
const opRemoveState = "remove-state"

// stateDone continues the awaited state operation.
func (a *endpointActor) stateDone(ctx actor.Context, msg *stateDone) {
	w := a.stateWait
	if w == nil || w.seq != msg.seq {
		return // an earlier incarnation's operation
	}
	a.stateWait = nil
	a.dpBusy = false
	a.setOp("")
	err := msg.err
	if err != nil {
		err = fmt.Errorf("%s state: %w: %w", w.op, ErrStateWrite, err)
	}
	if w.op == "write" {
		a.labelWriteDone(ctx, err)
	}
	w.cont(ctx, err)
}

// datapathOp runs fn in the datapath pool and continues with cont.
func (a *endpointActor) datapathOp(ctx actor.Context, op string, fn func(context.Context) (any, error), cont func(actor.Context, *messages.DatapathResult)) {
	a.dpBusy = true
	work := &messages.DatapathWork{Op: op, Endpoint: a.ep.ID, Timeout: a.deps.cfg.DatapathTimeout, Run: fn}
	a.request(ctx, a.deps.pool, work, a.deps.cfg.DatapathTimeout+a.deps.cfg.RequestTimeout, func(res any, err error) {
		a.dpBusy = false
		r, ok := res.(*messages.DatapathResult)
		if err != nil || !ok {
			r = &messages.DatapathResult{Err: fmt.Errorf("%s: %w", op, err)}
		}
		cont(ctx, r)
	})
}

func (a *endpointActor) realized(ctx actor.Context, r *messages.DatapathResult) {
	if a.deleting {
		a.endRegen(ctx, fmt.Errorf("regenerate endpoint %d: %w", a.ep.ID, ErrEndpointDeleting))
		a.maybeTeardown(ctx)
		return
	}
	if r.Err != nil {
		a.regenFailed(ctx, fmt.Errorf("%w: %w", ErrDatapath, r.Err))
		return
	}
	a.phaseDone(1)
	res, _ := r.Value.(datapath.Realized)
	if len(res.ProxyWaits) == 0 {
		a.completeRegen(ctx, false)
		return
	}
	a.regen.proxyWait = make(map[string]struct{}, len(res.ProxyWaits))
	for _, p := range res.ProxyWaits {
		if _, acked := a.regen.earlyAcks[p]; !acked {
			a.regen.proxyWait[p] = struct{}{}
		}
	}
	a.regen.earlyAcks = nil
	if len(a.regen.proxyWait) == 0 {
		a.completeRegen(ctx, false)
		return
	}
	a.setOp(PhaseProxyWait)
	self, system, rev := ctx.Self(), ctx.ActorSystem(), a.regen.rev
	a.regen.proxyTimer = time.AfterFunc(a.deps.cfg.ProxyWaitTimeout, func() {
		system.Root.Send(self, &proxyTimeout{rev: rev})
	})
}

func (a *endpointActor) proxyAck(ctx actor.Context, msg *messages.ProxyAck) {
	if a.regen.running && msg.Revision == a.regen.rev && a.regen.proxyWait == nil {
		// Acknowledged before the realize result came back: remember it.
		if a.regen.earlyAcks == nil {
			a.regen.earlyAcks = make(map[string]struct{}, 2)
		}
		a.regen.earlyAcks[msg.ProxyID] = struct{}{}
		return
	}
	if !a.regen.running || msg.Revision != a.regen.rev || a.regen.proxyWait == nil {
		a.logger().Debug("ignoring stale proxy acknowledgement", "revision", msg.Revision, "proxy", msg.ProxyID)
		return
	}
	delete(a.regen.proxyWait, msg.ProxyID)
	if len(a.regen.proxyWait) == 0 {
		a.completeRegen(ctx, false)
	}
}

func (a *endpointActor) proxyTimedOut(ctx actor.Context, msg *proxyTimeout) {
	if !a.regen.running || msg.rev != a.regen.rev || a.regen.proxyWait == nil {
		return
	}
	a.logger().Warn("proxy acknowledgements timed out; endpoint becomes ready without them",
		"revision", msg.rev, "missing", len(a.regen.proxyWait))
	a.deps.counters.proxyTimeouts.Add(1)
	a.completeRegen(ctx, true)
}

// completeRegen records the realised revision and answers the waiters,
// then starts the pending regeneration, if any.
func (a *endpointActor) completeRegen(ctx actor.Context, timedOut bool) {
	if a.op == PhaseProxyWait {
		a.phaseDone(2)
	}
	a.regenTimed()
	a.mut().RealizedRevision = a.regen.rev
	a.mut().Regenerations++
	a.mut().LastError = ""
	if timedOut {
		a.mut().LastError = "proxy acknowledgements timed out"
	}
	a.retries = 0
	a.endRegen(ctx, nil)
	if a.maybeTeardown(ctx) {
		return
	}
	if a.regen.pending && a.ep.State != endpoint.StateWaitingForIdentity && !a.idBusy {
		a.startRegen(ctx)
	}
}

// endRegen closes the running regeneration: err nil means success.
func (a *endpointActor) endRegen(ctx actor.Context, err error) {
	a.regen.running = false
	if a.op == PhaseProxyWait {
		a.setOp("")
	}
	a.regen.proxyWait, a.regen.earlyAcks = nil, nil
	if a.regen.proxyTimer != nil {
		a.regen.proxyTimer.Stop()
		a.regen.proxyTimer = nil
	}
	if err == nil && a.ep.State == endpoint.StateRegenerating {
		a.setState(endpoint.StateReady, "regeneration completed")
	}
	res := a.result(err)
	rs := replies(a.regen.waiters, res)
	a.regen.waiters = nil
	if a.createWaiter != nil && err == nil {
		rs = append(rs, messages.Reply{To: a.createWaiter, Message: res})
		a.createWaiter = nil
	}
	if !a.deleting {
		a.publish(ctx, rs...)
		return
	}
	for _, r := range rs {
		ctx.Send(r.To, r.Message)
	}
}

func (a *endpointActor) regenFailed(ctx actor.Context, err error) {
	err = fmt.Errorf("regenerate endpoint %d: %w", a.ep.ID, err)
	a.logger().Warn("regeneration failed", "revision", a.regen.rev, "err", err)
	a.deps.counters.regenFailed.Add(1)
	a.regen.failed++
	a.mut().LastError = err.Error()
	a.setState(endpoint.StateWaitingToRegenerate, "regeneration failed")
	a.endRegen(ctx, err)
	if a.createWaiter != nil {
		a.failCreate(ctx, err)
		return
	}
	if a.regen.pending {
		a.startRegen(ctx)
		return
	}
	a.scheduleRetry(ctx)
}

// scheduleRetry retries a failed regeneration with exponential backoff.
func (a *endpointActor) scheduleRetry(ctx actor.Context) {
	if a.regen.retryTimer != nil {
		return
	}
	d := a.deps.cfg.RetryMin << min(a.retries, 10)
	if d > a.deps.cfg.RetryMax || d <= 0 {
		d = a.deps.cfg.RetryMax
	}
	if a.retries < math.MaxUint16 {
		a.retries++
	}
	self, system := ctx.Self(), ctx.ActorSystem()
	a.regen.retryTimer = time.AfterFunc(d, func() { system.Root.Send(self, &retryRegen{}) })
}

// delete starts deleting the endpoint; replyTo (may be nil) is answered
// when it is disconnected.
func (a *endpointActor) delete(ctx actor.Context, opts endpoint.DeleteOptions, replyTo *actor.PID) {
	if replyTo != nil {
		a.delReplies = append(a.delReplies, messages.Reply{To: replyTo})
	}
	if a.deleting {
		return
	}
	a.deleting = true
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
	a.regen.pendingWaiters, a.labelWaiters, a.regen.pending = nil, nil, false
	a.publish(ctx, rs...)
	a.maybeTeardown(ctx)
}

func (a *endpointActor) stopRetry() {
	if a.regen.retryTimer != nil {
		a.regen.retryTimer.Stop()
		a.regen.retryTimer = nil
	}
}

// maybeTeardown starts the teardown once deleting and nothing is in
// flight (a running datapath operation, identity or proxy wait). It
// reports whether the endpoint is deleting.
func (a *endpointActor) maybeTeardown(ctx actor.Context) bool {
	if !a.deleting {
		return false
	}
	if a.tearingDown || a.dpBusy || a.idBusy || a.regen.running {
		return true
	}
	// The datapath goes first, then the state, both while the row is
	// still in the index: once the row is gone a DELETE answers 404, which
	// a CNI DEL takes as done, so nothing may bring the endpoint back after
	// that (a crash before the state removal restores it, and the retried
	// DEL finds it); and nothing is left in the kernel for an endpoint
	// that will not be restored.
	if !a.dpGone {
		a.removeDatapath(ctx, 0)
		return true
	}
	if !a.stateGone && a.deps.store != nil {
		id, store := a.ep.ID, a.deps.store
		a.stateOp(ctx, "remove", func(done func(error)) { store.Remove(id, done) }, func(ctx actor.Context, err error) {
			if err != nil {
				a.logger().Error("removing endpoint state failed", "err", err)
			}
			a.stateGone, a.stateStays = true, err != nil
			a.maybeTeardown(ctx)
		})
		return true
	}
	a.tearingDown = true
	if ips := a.ips(); len(ips) > 0 {
		ctx.Send(a.deps.ipcache, &messages.IPCacheEndpoint{Endpoint: a.ep.ID, IPs: ips, Deleted: true})
	}
	ctx.Send(a.deps.policy, &messages.EndpointPolicyGone{Endpoint: a.ep.ID})
	// Leave the index before the leases end, so the endpoint's container
	// ID and addresses are free in the manager's books before IPAM
	// releases anything.
	a.mut().State = endpoint.StateDisconnecting
	a.shared = true
	ctx.Send(a.manager, &messages.EndpointChanged{From: ctx.Self(), Endpoint: a.ep, Deleted: true,
		Replies: []messages.Reply{{To: ctx.Self(), Message: &indexRemoved{}}}})
	return true
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
	if ips := a.ips(); len(ips) > 0 {
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
	}, func(ctx actor.Context, r *messages.DatapathResult) {
		if r.Err != nil && attempt < 2 {
			a.logger().Warn("datapath remove failed; retrying", "attempt", attempt+1, "err", r.Err)
			a.removeDatapath(ctx, attempt+1)
			return
		}
		if r.Err != nil {
			a.logger().Error("datapath remove failed; leaving it to garbage collection", "err", r.Err)
		}
		a.dpGone = true
		a.maybeTeardown(ctx)
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
		if msg == nil || err != nil {
			msg = res
		}
		ctx.Send(r.To, msg)
	}
	a.delReplies = nil
	a.stopTimers()
	ctx.Stop(ctx.Self())
}

// phaseDone ends phase i (an index of RegenPhases) of the running
// regeneration and starts the next.
func (a *endpointActor) phaseDone(i int) {
	now := time.Now().UnixNano()
	d := time.Duration(now - a.regen.phaseStart)
	a.regen.phases[i], a.regen.phaseStart = uint32(min(d.Microseconds(), math.MaxUint32)), now
	if a.deps.observer != nil {
		a.deps.observer.RegenPhase(RegenPhases[i], d)
	}
}

// regenTimed records the total of a successful regeneration and keeps its
// phases as the last regeneration's.
func (a *endpointActor) regenTimed() {
	now := time.Now().UnixNano()
	total := time.Duration(now - a.regen.started)
	a.regen.phases[3] = uint32(min(total.Microseconds(), math.MaxUint32))
	a.regen.lastPhases, a.regen.lastAt = a.regen.phases, now
	if a.deps.observer != nil {
		a.deps.observer.RegenPhase(PhaseTotal, total)
	}
}
