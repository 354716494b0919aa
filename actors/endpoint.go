package actors

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// endpointActor is one endpoint's actor. Its mailbox serialises
// everything that happens to the endpoint: identity resolution,
// regeneration (coalesced: one running, one pending), proxy-completion
// waits, label changes and deletion. It owns the endpoint's working record
// and publishes immutable snapshots to the endpoint manager, which writes
// them to the index. Blocking work runs in the datapath pool; results come
// back as messages to the actor itself (requester, request.go), and a
// restarted incarnation never sees its predecessor's answers.
type endpointActor struct {
	deps    *endpointDeps
	manager *actor.PID
	stats   *MailboxStats
	// ep is the endpoint's current record. Once published it is shared
	// with the index and must not change: write through mut().
	ep   *endpoint.Endpoint
	mode *startMode // how this incarnation starts; dropped once started (heap per endpoint)

	// The flags sit together (field order keeps the struct in a small
	// size class: heap per endpoint is a target).
	shared bool
	dead   bool // set on Restarting: late continuations are ignored
	// createSync: answer createWaiter after the first regeneration.
	createSync bool
	// restoreReport: the manager waits for this endpoint's leases (IP,
	// identity) before the agent serves mutating calls.
	restoreReport bool
	// leaseWait: an IPAM claim or an identity acquisition is in flight.
	leaseWait bool
	// ioWait: how many datapath operations (pool) and state writes or
	// removals (store) are in flight: a full regeneration runs its state
	// write and its realise at once. leaseWait may overlap them (a relabel
	// during a realise).
	ioWait int
	// stateStays: deleting, the state removal failed (the endpoint may
	// come back at the next start, so the delete is not acknowledged).
	stateStays bool
	life       lifecycle
	retries    uint16 // consecutive failed regenerations, for backoff

	// createWaiter is the PUT: answered after the first regeneration
	// (sync) or once the state is on disk and in the index (not sync).
	createWaiter *actor.PID
	labelWaiters []*actor.PID // answered once the identity is resolved and the labels are durable
	lw           *labelWrite  // label changes not yet durable (nil: none)

	regen regenState

	delReplies []messages.Reply // sent when the endpoint is disconnected

	// req holds the requests in flight: to other actors, the pool and the
	// state store (request.go).
	req requester

	// slot is where this actor publishes its snapshot (GET /v1/actors);
	// op is the asynchronous operation it waits for, since opSince.
	slot    *actorSlot
	op      string
	opSince int64 // unix nanoseconds
}

// regenState is the coalescing regeneration bookkeeping.
type regenState struct {
	rev            uint64
	waiters        []*actor.PID // answered when the running regeneration ends
	pendingWaiters []*actor.PID
	proxyWait      map[string]struct{} // proxies yet to acknowledge rev
	earlyAcks      map[string]struct{} // acks of rev that beat the realize result
	rejected       string              // a proxy rejection of rev that beat the realize result
	proxyTimer     *time.Timer
	retryTimer     *time.Timer

	// Introspection: counters of this incarnation and the timing of the
	// running and the last successful regeneration, by phase (RegenPhases).
	runs, coalesced, failed uint32

	// running: a regeneration is in flight. want: what the endpoint owes
	// besides it (requests coalesce into one pending regeneration).
	running bool
	want    regenWant

	started, phaseStart int64     // unix nanoseconds
	phases, lastPhases  [4]uint32 // microseconds
	lastAt              int64     // unix nanoseconds; 0: none yet
}

// regenWant is the regeneration an endpoint owes, none or the level of
// the next one; requests raise it, starting a regeneration consumes it.
type regenWant uint8

const (
	wantNone regenWant = iota
	// wantPolicy: realise the identity's new policy (nothing on disk changed).
	wantPolicy
	// wantFull: write the state, then realise.
	wantFull
)

// Internal messages of the endpoint actor.
type (
	proxyTimeout struct{ rev uint64 }
	retryRegen   struct{}
	// reattach carries the waiters of an incarnation that restarted.
	reattach struct {
		create       *actor.PID
		regen, label []*actor.PID
		del          []messages.Reply
	}
)

// lifecycle is where an endpoint is in its life. Deletion runs its steps
// in this order (endpoint_delete.go), each once nothing else is in flight.
type lifecycle uint8

const (
	// lifeLive: serving regenerations, label changes and proxy waits.
	lifeLive lifecycle = iota
	// lifeDeleting: deletion requested; in-flight work ends first, then
	// the datapath is removed.
	lifeDeleting
	// lifeDatapathRemoved: the datapath removal finished (or was left to
	// the garbage collector); the state removal is next.
	lifeDatapathRemoved
	// lifeStateRemoved: the state removal finished (or failed:
	// stateStays); the index row goes next.
	lifeStateRemoved
	// lifeLeavingIndex: the row is leaving the index; then the leases
	// end and the actor stops.
	lifeLeavingIndex
)

// deleting reports whether a delete was requested.
func (a *endpointActor) deleting() bool { return a.life != lifeLive }

// startMode says how an endpoint actor's incarnation starts.
type startMode struct {
	kind   startKind
	waiter *actor.PID // create: the front door's asker, to answer the create
	sync   bool       // create: answer after the first regeneration
	// rebuild: where the failed incarnation was in its life.
	life       lifecycle
	stateStays bool // the failed incarnation's state removal failed
}

type startKind int

const (
	// startRebuild: a restarted incarnation; read the record from the index.
	startRebuild startKind = iota
	// startCreate: a new endpoint from PUT /v1/endpoint.
	startCreate
	// startRestore: an endpoint read from the state directory at agent start.
	startRestore
)

func newEndpointActor(deps *endpointDeps, spec *endpoint.Endpoint, mode startMode, manager *actor.PID, stats *MailboxStats) *endpointActor {
	a := &endpointActor{deps: deps, manager: manager, stats: stats, ep: spec, shared: true}
	if mode.kind == startCreate {
		a.createWaiter, a.createSync = mode.waiter, mode.sync
	}
	// The waiter lives on in createWaiter only until it is answered: a
	// PID caches the process it was sent to, so a kept copy would hold
	// the asker's process and its answer (an old record) for good. The mode
	// itself is dropped once the actor started.
	mode.waiter = nil
	a.mode = &mode
	return a
}

// Receive implements actor.Actor. Lifecycle messages are handled the
// same in every state; the rest by the endpoint's state: live (serving
// regenerations, label changes and proxy waits) or deleting, where
// deletion's steps (endpoint_delete.go) run one after the other, each
// once nothing else is in flight. The state is a field, not a
// protoactor Behavior: a Behavior's bound receive functions would cost
// heap on every endpoint.
func (a *endpointActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		a.req.register(ctx)
		a.started(ctx)
	case *actor.Restarting:
		a.restarting(ctx)
	case *actor.Stopping:
		// Stopped with the system (agent Stop or Crash): an armed retry
		// timer (up to RetryMax) would keep the actor system, and with it
		// the whole stopped agent, reachable until it fires.
		a.stopTimers()
	case *actor.Stopped:
		a.req.unregister(ctx)
	case *reattach:
		a.reattach(ctx, msg)
	case *crashForTest:
		panic("endpoint actor: crash requested by a test")
	default:
		if a.life == lifeLive {
			a.receiveLive(ctx)
		} else {
			a.receiveDeleting(ctx)
		}
	}
	a.report()
}

// receiveLive handles a live endpoint's messages. A continuation that
// finds the endpoint deleting when it runs stops there: the deletion
// state takes over (advance) once the message is handled.
func (a *endpointActor) receiveLive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *requestAnswer:
		a.answered(msg)
	case *messages.Regenerate:
		a.requestRegen(ctx, ctx.Sender())
	case *messages.RegeneratePolicy:
		if msg.Join {
			a.awaitRegen(ctx, ctx.Sender())
			break
		}
		var waiter *actor.PID
		if msg.Wait {
			waiter = ctx.Sender()
		}
		a.requestPolicyRegen(ctx, waiter)
	case *retryRegen:
		a.regen.retryTimer = nil
		switch {
		case a.regen.running || a.leaseWait:
		case a.ep.State == endpoint.StateWaitingForIdentity:
			a.acquireIdentity(ctx) // the identity failed, not the datapath
		default:
			a.requestRegen(ctx, nil)
		}
	case *messages.ProxyAck:
		a.proxyAck(ctx, msg)
	case *proxyTimeout:
		a.proxyTimedOut(ctx, msg)
	case *messages.PatchLabels:
		a.patchLabels(ctx, msg)
	case *messages.IdentityRenumbered:
		a.identityRenumbered(ctx, msg)
	case *messages.DeleteEndpoint:
		a.delete(ctx, msg.Options, ctx.Sender())
	}
	// A continuation may have started the deletion (a failed create).
	a.advance(ctx)
}

// receiveDeleting handles a deleting endpoint's messages: the work in
// flight ends (a running regeneration is aborted, leases in flight come
// back), new work is refused with ErrEndpointDeleting, and after every
// message the next step of deletion starts if nothing is in flight.
func (a *endpointActor) receiveDeleting(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *requestAnswer:
		a.answered(msg)
	case *messages.Regenerate:
		ctx.Respond(a.result(fmt.Errorf("regenerate endpoint %d: %w", a.ep.ID, ErrEndpointDeleting)))
	case *messages.RegeneratePolicy:
		if msg.Wait || msg.Join {
			ctx.Respond(a.result(fmt.Errorf("regenerate endpoint %d: %w", a.ep.ID, ErrEndpointDeleting)))
		}
	case *messages.PatchLabels:
		ctx.Respond(a.result(fmt.Errorf("patch labels of endpoint %d: %w", a.ep.ID, ErrEndpointDeleting)))
	case *messages.ProxyAck:
		a.proxyAck(ctx, msg) // a regeneration waiting for its proxies ends first
	case *proxyTimeout:
		a.proxyTimedOut(ctx, msg)
	case *messages.DeleteEndpoint:
		a.delete(ctx, msg.Options, ctx.Sender())
	case *retryRegen:
		a.regen.retryTimer = nil
	}
	a.advance(ctx)
}

// answered continues the request msg answers, if this incarnation still
// waits for it.
func (a *endpointActor) answered(msg *requestAnswer) {
	if cont := a.req.take(msg); cont != nil {
		a.setOp("")
		cont(msg.msg, msg.err)
	}
}

// setOp records the asynchronous operation the actor now waits for ("" when
// none), for its snapshot.
func (a *endpointActor) setOp(op string) {
	a.op = op
	if op != "" {
		a.opSince = time.Now().UnixNano()
	}
}

// report publishes the actor's snapshot if it changed. It runs after
// every message and continuation, on the actor's goroutine.
func (a *endpointActor) report() {
	if a.slot == nil || a.dead {
		return
	}
	rg := &a.regen
	// The report shares the record: from now on it must not change in
	// place (mut copies it), like a record shared with the index.
	a.shared = true
	r := report{ep: a.ep, runs: rg.runs, coalesced: rg.coalesced, failed: rg.failed, lastAt: rg.lastAt, lastPhases: rg.lastPhases}
	if a.op != "" {
		r.operation, r.operationSince = a.op, a.opSince
	}
	a.slot.publish(r)
}

func (a *endpointActor) started(ctx actor.Context) {
	mode := a.mode
	a.mode = nil
	switch mode.kind {
	case startRebuild:
		leaving := mode.life == lifeLeavingIndex
		if cur, ok := a.deps.ix.Endpoint(a.ep.ID); ok && !leaving {
			a.ep, a.shared = cur, true
		}
		a.logger().Info("endpoint actor rebuilt from the index", "state", a.ep.State, "deleting", mode.life != lifeLive)
		if leaving {
			// The row is already out of the index: resume after it.
			a.life, a.stateStays = lifeLeavingIndex, mode.stateStays
			a.releaseLeases(ctx)
			return
		}
		if a.ep.State == endpoint.StateDisconnecting || mode.life != lifeLive {
			// Deletion starts over: every step is idempotent.
			a.life = lifeDeleting
			a.advance(ctx)
			return
		}
	case startRestore:
		a.restoreReport = true
		a.logger().Info("restoring endpoint", "identity", a.ep.Identity, "ipv4", a.ep.IPv4, "ipv6", a.ep.IPv6)
	}
	a.claimIPs(ctx)
}

// leasesClaimed continues once the addresses are claimed: a non-sync PUT
// answers now that the endpoint holds its addresses and is on disk (a
// sync PUT answers after the first regeneration, which writes it); then
// the identity is resolved.
func (a *endpointActor) leasesClaimed(ctx actor.Context) {
	if a.createWaiter == nil || a.createSync {
		a.acquireIdentity(ctx)
		return
	}
	a.stateOp(ctx, "write", a.writeState(a.ep), func(ctx actor.Context, err error) {
		if err != nil {
			a.failCreate(ctx, fmt.Errorf("write state: %w", err))
			return
		}
		if w := a.createWaiter; w != nil {
			a.createWaiter = nil
			a.publish(ctx, messages.Reply{To: w, Message: a.result(nil)})
		}
		if a.deleting() {
			return
		}
		a.acquireIdentity(ctx)
	})
}

// restarting runs on the failed incarnation: it stops its timers and hands
// its waiters to the next incarnation through its own mailbox.
func (a *endpointActor) restarting(ctx actor.Context) {
	a.dead = true
	a.stopTimers()
	ctx.Send(ctx.Self(), &reattach{
		create: a.createWaiter,
		regen:  append(append([]*actor.PID(nil), a.regen.waiters...), a.regen.pendingWaiters...),
		label:  append(a.labelWaiters, a.labelDurableWaiters()...),
		del:    a.delReplies,
	})
}

func (a *endpointActor) reattach(ctx actor.Context, msg *reattach) {
	if msg.create != nil {
		// A non-sync PUT's initial write may not have happened: answer it
		// like a sync PUT, after the rebuilt incarnation's regeneration.
		a.createWaiter, a.createSync = msg.create, true
	}
	a.regen.pendingWaiters = append(a.regen.pendingWaiters, msg.regen...)
	a.labelWaiters = append(a.labelWaiters, msg.label...)
	a.delReplies = append(a.delReplies, msg.del...)
	if len(msg.regen) > 0 && !a.regen.running {
		a.regen.want = max(a.regen.want, wantPolicy)
	}
}

func (a *endpointActor) stopTimers() {
	a.req.drop()
	if a.regen.proxyTimer != nil {
		a.regen.proxyTimer.Stop()
		a.regen.proxyTimer = nil
	}
	if a.regen.retryTimer != nil {
		a.regen.retryTimer.Stop()
		a.regen.retryTimer = nil
	}
}

// mut returns the record for writing, copying it first if it is shared
// with the index (copy-on-write keeps one copy per endpoint at rest).
func (a *endpointActor) mut() *endpoint.Endpoint {
	if a.shared {
		a.ep, a.shared = a.ep.Clone(), false
	}
	return a.ep
}

// logger returns the endpoint's logger; built on demand because a
// per-endpoint slog.Logger costs heap for every live endpoint.
func (a *endpointActor) logger() *slog.Logger {
	return a.deps.log.With("endpoint", a.ep.ID)
}

// setState applies a transition if Cilium's table allows it; an illegal
// one is refused and logged.
func (a *endpointActor) setState(to endpoint.State, reason string) bool {
	from := a.ep.State
	if from == to {
		return true
	}
	if err := endpoint.Transition(from, to); err != nil {
		a.logger().Warn("refused endpoint state change", "from", from, "to", to, "reason", reason)
		return false
	}
	w := a.mut()
	w.State, w.StateChanged = to, time.Now()
	if a.deps.log.Enabled(context.Background(), slog.LevelDebug) {
		a.logger().Debug("endpoint state changed", "from", from, "to", to, "reason", reason)
	}
	return true
}

// publish sends the current snapshot to the endpoint manager; replies are
// delivered after the index commit that contains it.
func (a *endpointActor) publish(ctx actor.Context, replies ...messages.Reply) {
	a.shared = true
	ctx.Send(a.manager, &messages.EndpointChanged{From: ctx.Self(), Endpoint: a.ep, Replies: replies})
}

func (a *endpointActor) result(err error) *messages.EndpointResult {
	if err != nil {
		return &messages.EndpointResult{Err: err}
	}
	a.shared = true
	return &messages.EndpointResult{Endpoint: a.ep}
}

func replies(to []*actor.PID, msg any) []messages.Reply {
	out := make([]messages.Reply, 0, len(to))
	for _, pid := range to {
		if pid != nil {
			out = append(out, messages.Reply{To: pid, Message: msg})
		}
	}
	return out
}

func (a *endpointActor) ips() []netip.Addr {
	var ips []netip.Addr
	for _, ip := range []netip.Addr{a.ep.IPv4, a.ep.IPv6} {
		if ip.IsValid() {
			ips = append(ips, ip)
		}
	}
	return ips
}

// claimIPs binds the endpoint's addresses to this actor in IPAM (which
// releases them if the actor stops without unclaiming: the manager tells
// it, holderStopped), then resolves the identity. Claims are idempotent.
// A chained endpoint claims nothing: its addresses come from another
// plugin's IPAM.
func (a *endpointActor) claimIPs(ctx actor.Context) {
	ips := a.ips()
	if len(ips) == 0 || a.ep.Chained { // a chained endpoint's addresses are another plugin's
		a.leasesClaimed(ctx)
		return
	}
	a.leaseWait = true
	owner := a.ep.PodKey()
	if owner == "" {
		owner = fmt.Sprintf("endpoint:%d", a.ep.ID)
	}
	msg := &messages.IPAMClaim{Endpoint: a.ep.ID, IPs: ips, Owner: owner, Holder: ctx.Self()}
	a.request(ctx, a.deps.ipam, msg, a.deps.cfg.RequestTimeout, func(res any, err error) {
		a.leaseWait = false
		if err == nil {
			err = res.(*messages.IPAMResult).Err
		}
		if err != nil {
			a.failCreate(ctx, fmt.Errorf("claim addresses: %w", err))
			return
		}
		if a.deleting() {
			return
		}
		a.leasesClaimed(ctx)
	})
}

// acquireIdentity resolves the identity of the current labels.
func (a *endpointActor) acquireIdentity(ctx actor.Context) {
	a.leaseWait = true
	ls := a.ep.Labels
	msg := &messages.IdentityAcquire{Labels: ls, Holder: ctx.Self()}
	if a.restoreReport {
		msg.Preferred = a.ep.Identity // keep the identity number across restarts
	}
	a.request(ctx, a.deps.identity, msg, a.deps.cfg.RequestTimeout, func(res any, err error) {
		a.leaseWait = false
		var got identity.Identity
		if err == nil {
			r := res.(*messages.IdentityAcquired)
			got, err = r.Identity, r.Err
		}
		if err != nil {
			a.identityFailed(ctx, err)
			return
		}
		if a.deleting() {
			return
		}
		if !ls.Equal(a.ep.Labels) { // labels changed while we waited
			a.releaseIdentity(ctx, got.ID)
			a.acquireIdentity(ctx)
			return
		}
		a.shareLabels(got.Labels)
		a.identityResolved(ctx, got.ID)
	})
}

// shareLabels makes the record use the identity's copy of its labels
// when they are equal, so endpoints with one label set share one slice
// (heap per endpoint). Label sets are immutable: replaced, never changed.
func (a *endpointActor) shareLabels(ls labels.Labels) {
	cur := a.ep.Labels
	if len(ls) == 0 || len(cur) != len(ls) || &cur[0] == &ls[0] || !ls.Equal(cur) {
		return
	}
	a.mut().Labels = ls
}

func (a *endpointActor) identityFailed(ctx actor.Context, err error) {
	err = fmt.Errorf("resolve identity: %w", err)
	a.mut().LastError = err.Error()
	a.logger().Error("identity resolution failed", "err", err)
	if a.createWaiter != nil {
		a.failCreate(ctx, err)
		return
	}
	waiters := a.labelWaiters
	a.labelWaiters = nil
	a.publish(ctx, replies(waiters, a.result(err))...)
	a.scheduleRetry(ctx)
}

func (a *endpointActor) releaseIdentity(ctx actor.Context, id identity.NumericIdentity) {
	if id == identity.IdentityUnknown || id.IsReserved() {
		return
	}
	a.request(ctx, a.deps.identity, &messages.IdentityRelease{ID: id, Holder: ctx.Self()}, a.deps.cfg.RequestTimeout, func(res any, err error) {
		if r, ok := res.(*messages.IdentityReleased); ok && err == nil {
			err = r.Err
		}
		if err != nil {
			a.logger().Warn("releasing previous identity failed", "identity", id, "err", err)
		}
	})
}

// identityRenumbered adopts the cluster store's number for the
// endpoint's labels: the identity actor already moved the endpoint's
// reference from msg.Old to msg.New (nothing to release), and the
// endpoint regenerates with it (ipcache, policy, state). An endpoint
// that no longer uses msg.Old, or waits for an identity (its labels
// changed), changes nothing here: its release of msg.Old releases
// msg.New.
func (a *endpointActor) identityRenumbered(ctx actor.Context, msg *messages.IdentityRenumbered) {
	if a.ep.Identity != msg.Old || a.leaseWait {
		return
	}
	a.logger().Warn("identity renumbered by the cluster identity store", "from", msg.Old, "to", msg.New)
	a.mut().Identity = msg.New
	a.identityResolved(ctx, msg.New)
}

// identityResolved sets the identity (Cilium: waiting-for-identity ->
// ready), answers label waiters and queues a regeneration.
func (a *endpointActor) identityResolved(ctx actor.Context, id identity.NumericIdentity) {
	restoredAsIs := a.restoreReport && a.ep.Identity == id
	if old := a.ep.Identity; old != id {
		a.releaseIdentity(ctx, old)
		a.mut().Identity = id
	}
	if ips := a.ips(); len(ips) > 0 {
		ctx.Send(a.deps.ipcache, &messages.IPCacheEndpoint{Endpoint: a.ep.ID, IPs: ips, Identity: id})
	}
	if a.ep.State == endpoint.StateWaitingForIdentity {
		a.setState(endpoint.StateReady, "identity resolved")
	}
	waiters := a.labelWaiters
	a.labelWaiters = nil
	a.awaitLabelWrite(ctx, waiters)
	a.reportRestored(ctx, nil)
	if restoredAsIs && a.resumeRealized(ctx) {
		return
	}
	a.requestRegen(ctx, nil)
}

// reportRestored tells the manager, once, that a restored endpoint holds
// its leases again (err nil) or could not be restored.
func (a *endpointActor) reportRestored(ctx actor.Context, err error) {
	if !a.restoreReport {
		return
	}
	a.restoreReport = false
	ctx.Send(a.manager, &restoreReport{id: a.ep.ID, err: err})
}

func (a *endpointActor) patchLabels(ctx actor.Context, msg *messages.PatchLabels) {
	next := a.ep.Labels.Remove(msg.Delete).Add(msg.Add)
	regen := false
	if msg.SetPorts && !msg.NamedPorts.Equal(a.ep.NamedPorts) {
		a.mut().NamedPorts = msg.NamedPorts
		regen = true
	}
	if msg.SetAudit && msg.Audit != a.ep.PolicyAudit {
		a.mut().PolicyAudit = msg.Audit
		regen = true
	}
	waiter := ctx.Sender()
	if msg.Async {
		// Answered once the index has the change (the manager commits,
		// then replies); nothing waits for the identity or the write.
		sender := waiter
		waiter = nil
		defer func() { a.publish(ctx, replies([]*actor.PID{sender}, a.result(nil))...) }()
	}
	if regen && next.Equal(a.ep.Labels) {
		// Same identity, other ports or audit mode: its policy (and
		// state) change.
		a.requestRegen(ctx, waiter)
		return
	}
	if next.Equal(a.ep.Labels) {
		if waiter != nil && !a.labelsNotDurable(waiter) {
			ctx.Respond(a.result(nil))
		}
		return
	}
	a.mut().Labels = next
	a.labelsChanged()
	if waiter != nil {
		a.labelWaiters = append(a.labelWaiters, waiter)
	}
	if a.leaseWait {
		return // the acquisition in flight notices the change
	}
	a.setState(endpoint.StateWaitingForIdentity, "labels changed")
	if waiter != nil {
		a.publish(ctx) // Async: the answer publishes
	}
	a.acquireIdentity(ctx)
}

// failCreate answers a failed creation and deletes the endpoint without
// releasing its addresses: the caller (the CNI plugin) owns them.
func (a *endpointActor) failCreate(ctx actor.Context, err error) {
	a.logger().Warn("endpoint creation failed", "err", err)
	a.reportRestored(ctx, err)
	a.mut().LastError = err.Error()
	if a.createWaiter != nil {
		// Answered once the endpoint is gone, so the caller can release
		// the addresses right away.
		a.delReplies = append(a.delReplies, messages.Reply{To: a.createWaiter, Message: &messages.EndpointResult{Err: err}})
		a.createWaiter = nil
	}
	a.delete(ctx, endpoint.DeleteOptions{NoIPRelease: true}, nil)
}
