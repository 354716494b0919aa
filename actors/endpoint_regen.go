package actors

import (
	"context"
	"errors"
	"fmt"
	"math"
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
	a.requestRegenLevel(ctx, waiter, wantFull)
}

// requestPolicyRegen requests a policy-only regeneration: the policy of
// the endpoint's identity changed, nothing on disk did. waiter (if not
// nil) is answered once a regeneration that started after the request
// ended.
func (a *endpointActor) requestPolicyRegen(ctx actor.Context, waiter *actor.PID) {
	level := wantPolicy
	if a.ep.Regenerations == 0 && !a.regen.running {
		level = wantFull // never built: the first build is full
	}
	a.requestRegenLevel(ctx, waiter, level)
}

// awaitRegen answers waiter once the regeneration owed (or, with none
// owed, the one running) ends, without requesting one; at once when
// neither is. Either started after every regeneration request the actor
// received before: one that arrived while another ran is owed.
func (a *endpointActor) awaitRegen(ctx actor.Context, waiter *actor.PID) {
	switch {
	case waiter == nil:
	case a.regen.want != wantNone:
		a.regen.pendingWaiters = append(a.regen.pendingWaiters, waiter)
	case a.regen.running:
		a.regen.waiters = append(a.regen.waiters, waiter)
	default:
		ctx.Send(waiter, a.result(nil))
	}
}

// requestRegenLevel owes a regeneration of at least level and starts it
// unless one runs or the endpoint cannot regenerate yet. Only a live
// endpoint takes requests (receiveDeleting refuses them).
func (a *endpointActor) requestRegenLevel(ctx actor.Context, waiter *actor.PID, level regenWant) {
	a.mut().DesiredRevision++
	a.deps.counters.regenRequested.Add(1)
	if waiter != nil {
		a.regen.pendingWaiters = append(a.regen.pendingWaiters, waiter)
	}
	owed := a.regen.want != wantNone
	a.regen.want = max(a.regen.want, level)
	if a.regen.running || a.leaseWait || a.ioWait > 0 || a.ep.State == endpoint.StateWaitingForIdentity {
		if owed {
			a.regen.coalesced++ // merged into the pending regeneration
		}
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
		a.regen.want = max(a.regen.want, wantPolicy) // retried when the state allows it
		return
	}
	full := a.regen.want == wantFull || a.ep.Regenerations == 0
	a.regen.running, a.regen.want = true, wantNone
	a.regen.rev = a.ep.DesiredRevision
	a.regen.waiters, a.regen.pendingWaiters = a.regen.pendingWaiters, nil
	a.deps.counters.regenRun.Add(1)
	now := time.Now().UnixNano()
	a.regen.runs++
	a.regen.started, a.regen.phaseStart, a.regen.phases = now, now, [4]uint32{}
	if a.deps.observer != nil && a.createWaiter != nil && a.regen.runs == 1 {
		a.deps.observer.RegenPhase(PhaseAccept, time.Duration(max(now-a.ep.Created.UnixNano(), 0)))
	}
	if a.ep.Regenerations > 0 {
		// The first build is not published as regenerating: its waiter
		// (sync PUT) sees the outcome, and it saves an index write per
		// endpoint creation.
		a.publish(ctx)
	}
	msg := &messages.ComputePolicy{Endpoint: a.ep.ID, Identity: a.ep.Identity, NamedPorts: a.ep.NamedPorts}
	a.request(ctx, a.deps.policy, msg, a.deps.cfg.RequestTimeout, func(res any, err error) {
		r, ok := res.(*messages.PolicyComputed)
		switch {
		case a.abortRegenIfDeleting(ctx):
		case err != nil || !ok:
			a.regenFailed(ctx, fmt.Errorf("compute policy: %w", errors.Join(err, errUnexpected(res))))
		default:
			if a.ep.Policy != r.Policy {
				a.mut().Policy = r.Policy
			}
			if a.deps.observer != nil {
				// Part of PhaseWriteState, reported on its own too.
				a.deps.observer.RegenPhase(PhaseComputePolicy, time.Duration(time.Now().UnixNano()-a.regen.started))
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

// writeAndRealize writes the state (full only) and realises the datapath,
// the two at once: the regeneration ends, and its waiters are answered,
// once both are done, so what a sync PUT's answer promises is unchanged
// (the state is durable, the datapath realised). A crash between the
// two leaves either a state the restore regenerates from, or, for a new
// endpoint, datapath leftovers of an endpoint no state names: the
// datapath GC's orphan passes remove those (host veth, pin directory,
// endpoints map entry and slot). Cilium's order is the same: it commits
// an endpoint's state directory after the BPF load.
func (a *endpointActor) writeAndRealize(ctx actor.Context, full bool) {
	a.shared = true
	snap, rev, dp := a.ep, a.regen.rev, a.deps.dp
	realize := func(ctx actor.Context, cont func(actor.Context, any, error)) {
		a.datapathOp(ctx, "realize", func(c context.Context) (any, error) {
			return dp.Realize(c, snap, rev)
		}, cont)
	}
	if !full {
		a.phaseDone(phaseWriteState)
		realize(ctx, a.realized)
		return
	}
	a.prepare(ctx, snap)
	// The realise is handed to the pool first: the state's encoding and
	// submission then run while a worker already works.
	j := &regenJoin{start: a.regen.phaseStart}
	realize(ctx, func(ctx actor.Context, v any, err error) {
		j.realizeDone, j.realized, j.realizeErr = true, v, err
		j.realizeTook = time.Now().UnixNano() - j.start
		a.joinRegen(ctx, j)
	})
	a.stateOp(ctx, "write", a.writeState(snap), func(ctx actor.Context, err error) {
		j.stateDone, j.stateErr = true, err
		a.phaseSpan(phaseWriteState, time.Now().UnixNano()-j.start)
		a.joinRegen(ctx, j)
	})
	a.setOp(PhaseRealize)
	j.since = a.opSince
}

// regenJoin is what a full regeneration's two concurrent steps, the state
// write and the realise, returned.
type regenJoin struct {
	start, realizeTook     int64 // unix nanoseconds; nanoseconds
	since                  int64 // when both began, as the actor's opSince
	stateDone, realizeDone bool
	stateErr, realizeErr   error
	realized               any
}

// joinRegen continues the regeneration once both of j's steps are done.
// A failed state write fails it even when the realise succeeded (a sync
// PUT must not answer before the state is durable); the next
// regeneration or the teardown brings the datapath in line.
func (a *endpointActor) joinRegen(ctx actor.Context, j *regenJoin) {
	switch {
	case !j.realizeDone:
		a.op, a.opSince = PhaseRealize, j.since // what is still in flight
	case !j.stateDone:
		a.op, a.opSince = PhaseWriteState, j.since
	case j.stateErr != nil && !a.abortRegenIfDeleting(ctx):
		a.regenFailed(ctx, j.stateErr)
	case j.stateErr == nil && !a.realizeFailed(ctx, j.realizeErr):
		a.phaseSpan(phaseRealize, j.realizeTook)
		a.regen.phaseStart = time.Now().UnixNano()
		a.awaitProxies(ctx, j.realized)
	}
}

// prepare lets a datapath that can (datapath.Preparer) start the first
// build's work that changes nothing traffic sees (the Linux datapath
// opens the endpoint's policy maps) in the worker pool, alongside the
// realise's first steps (host routes and sysctls); nobody waits for it,
// the realise waits for it where it needs what it did.
func (a *endpointActor) prepare(ctx actor.Context, ep *endpoint.Endpoint) {
	p, ok := a.deps.dp.(datapath.Preparer)
	if !ok || ep.Regenerations > 0 || ep.IfIndex == 0 {
		return
	}
	ctx.Send(a.deps.pool, &messages.DatapathWork{Op: "prepare", Endpoint: ep.ID, Timeout: a.deps.cfg.DatapathTimeout,
		Run: func(c context.Context) (any, error) {
			p.Prepare(c, ep)
			return nil, nil
		}})
}

// writeState returns the submit function writing ep's state.
func (a *endpointActor) writeState(ep *endpoint.Endpoint) func(done func(error)) {
	a.labelWriteStarted()
	return func(done func(error)) { a.deps.store.Write(ep, done) }
}

// request sends msg to another actor and continues with cont (request.go).
func (a *endpointActor) request(ctx actor.Context, pid *actor.PID, msg any, timeout time.Duration, cont func(res any, err error)) {
	a.req.request(ctx, pid, msg, timeout, cont)
	a.setOp(endpointOpName(msg))
}

// stateOp runs a state store operation (asynchronous, group-committed
// by the store's writer) and continues with cont once it is durable or
// failed. The store answers every request (Close and Abort included), so
// the wait has no timeout; a disk that hangs shows as an operation that
// lasts in GET /v1/actors.
func (a *endpointActor) stateOp(ctx actor.Context, op string, submit func(done func(error)), cont func(actor.Context, error)) {
	if a.deps.store == nil {
		cont(ctx, nil)
		return
	}
	a.ioWait++
	a.req.await(ctx, 0, func(reply func(any, error)) {
		submit(func(err error) { reply(nil, err) })
	}, func(_ any, err error) {
		a.ioWait--
		if err != nil {
			err = fmt.Errorf("%s state: %w: %w", op, ErrStateWrite, err)
		}
		if op == "write" {
			a.labelWriteDone(ctx, err)
		}
		cont(ctx, err)
	})
	if op == "write" {
		a.setOp(PhaseWriteState)
	} else {
		a.setOp(opRemoveState)
	}
}

// opRemoveState is the operation name of a state removal in actor
// snapshots (a write is PhaseWriteState).
const opRemoveState = "remove-state"

// datapathOp runs fn in the datapath pool and continues with its error.
func (a *endpointActor) datapathOp(ctx actor.Context, op string, fn func(context.Context) (any, error), cont func(actor.Context, any, error)) {
	a.ioWait++
	work := &messages.DatapathWork{Op: op, Endpoint: a.ep.ID, Timeout: a.deps.cfg.DatapathTimeout, Run: fn}
	a.req.inPool(ctx, a.deps, work, func(v any, err error) {
		a.ioWait--
		cont(ctx, v, err)
	})
	a.setOp(op)
}

// abortRegenIfDeleting ends the running regeneration with
// ErrEndpointDeleting and lets the teardown proceed, if a delete arrived
// while one of its steps was in flight. It reports whether it did.
func (a *endpointActor) abortRegenIfDeleting(ctx actor.Context) bool {
	if !a.deleting() {
		return false
	}
	a.endRegen(ctx, fmt.Errorf("regenerate endpoint %d: %w", a.ep.ID, ErrEndpointDeleting))
	return true
}

// realized continues a regeneration whose realise (alone) came back.
func (a *endpointActor) realized(ctx actor.Context, v any, err error) {
	if a.realizeFailed(ctx, err) {
		return
	}
	a.phaseDone(phaseRealize)
	a.awaitProxies(ctx, v)
}

// realizeFailed ends the regeneration if a delete arrived or the realise
// failed, and reports whether it did.
func (a *endpointActor) realizeFailed(ctx actor.Context, err error) bool {
	if a.abortRegenIfDeleting(ctx) {
		return true
	}
	if err != nil {
		a.regenFailed(ctx, fmt.Errorf("%w: %w", ErrDatapath, err))
		return true
	}
	return false
}

// awaitProxies completes the realised regeneration, or waits for the
// proxies the datapath reported to acknowledge its revision first.
func (a *endpointActor) awaitProxies(ctx actor.Context, v any) {
	if r := a.regen.rejected; r != "" {
		a.regen.rejected = ""
		a.regenFailed(ctx, fmt.Errorf("%w: %s", ErrProxyRejected, r))
		return
	}
	res, _ := v.(datapath.Realized)
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
	if msg.Rejected != "" {
		a.proxyRejected(ctx, msg)
		return
	}
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

// proxyRejected fails the running regeneration whose configuration the
// proxy rejected (before or after the realize result came back).
func (a *endpointActor) proxyRejected(ctx actor.Context, msg *messages.ProxyAck) {
	if !a.regen.running || msg.Revision != a.regen.rev {
		a.logger().Debug("ignoring stale proxy rejection", "revision", msg.Revision, "proxy", msg.ProxyID)
		return
	}
	a.deps.counters.proxyRejects.Add(1)
	if a.regen.proxyWait == nil {
		// The realize step is still running: fail when it comes back.
		a.regen.rejected = fmt.Sprintf("proxy %s rejected the configuration: %s", msg.ProxyID, msg.Rejected)
		return
	}
	if a.op == PhaseProxyWait {
		a.phaseDone(phaseProxyWait)
	}
	a.regenFailed(ctx, fmt.Errorf("%w: proxy %s rejected the configuration: %s", ErrProxyRejected, msg.ProxyID, msg.Rejected))
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
		a.phaseDone(phaseProxyWait)
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
	if a.deleting() {
		return
	}
	if a.regen.want != wantNone && a.ep.State != endpoint.StateWaitingForIdentity && !a.leaseWait {
		a.startRegen(ctx)
	}
}

// endRegen closes the running regeneration: err nil means success.
func (a *endpointActor) endRegen(ctx actor.Context, err error) {
	a.regen.running = false
	if a.op == PhaseProxyWait {
		a.setOp("")
	}
	a.regen.proxyWait, a.regen.earlyAcks, a.regen.rejected = nil, nil, ""
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
	if !a.deleting() {
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
	if a.regen.want != wantNone {
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
	d := backoff(a.deps.cfg.RetryMin, a.deps.cfg.RetryMax, int(a.retries))
	if a.retries < math.MaxUint16 {
		a.retries++
	}
	self, system := ctx.Self(), ctx.ActorSystem()
	a.regen.retryTimer = time.AfterFunc(d, func() { system.Root.Send(self, &retryRegen{}) })
}

// regenPhase indexes RegenPhases (and the phase durations kept per
// regeneration).
type regenPhase uint8

const (
	phaseWriteState regenPhase = iota
	phaseRealize
	phaseProxyWait
	phaseTotal
)

// phaseDone ends phase i of the running regeneration and starts the next.
func (a *endpointActor) phaseDone(i regenPhase) {
	now := time.Now().UnixNano()
	a.phaseSpan(i, now-a.regen.phaseStart)
	a.regen.phaseStart = now
}

// phaseSpan records that phase i of the running regeneration took ns
// nanoseconds (phases that overlap: the state write and the realise of
// a full regeneration).
func (a *endpointActor) phaseSpan(i regenPhase, ns int64) {
	d := time.Duration(max(ns, 0))
	a.regen.phases[i] = uint32(min(d.Microseconds(), math.MaxUint32))
	if a.deps.observer != nil {
		a.deps.observer.RegenPhase(RegenPhases[i], d)
	}
}

// regenTimed records the total of a successful regeneration and keeps its
// phases as the last regeneration's.
func (a *endpointActor) regenTimed() {
	now := time.Now().UnixNano()
	total := time.Duration(now - a.regen.started)
	a.regen.phases[phaseTotal] = uint32(min(total.Microseconds(), math.MaxUint32))
	a.regen.lastPhases, a.regen.lastAt = a.regen.phases, now
	if a.deps.observer != nil {
		a.deps.observer.RegenPhase(PhaseTotal, total)
	}
}
