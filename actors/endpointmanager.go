package actors

import (
	"fmt"
	"iter"
	"log/slog"
	"math/bits"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/index"
)

// endpointActorName is the child name of an endpoint's actor; its PID ID is
// "<manager>/ep-<id>".
func endpointActorName(id endpoint.ID) string { return "ep-" + strconv.Itoa(int(id)) }

// managerActor is the endpoint manager: it hands out endpoint IDs
// (1..65535), spawns and supervises one actor per endpoint, routes requests
// to them and is the single writer of the index's endpoints table, which it
// updates in batches from the EndpointChanged snapshots its children send.
type managerActor struct {
	deps *endpointDeps
	log  *slog.Logger

	ids        [(endpoint.MaxID + 1) / 64]uint64 // bit i set: ID i in use (0 reserved)
	cursor     endpoint.ID
	children   map[endpoint.ID]*actor.PID
	eps        map[endpoint.ID]*endpoint.Endpoint // latest snapshot per live ID
	containers map[attachment]endpoint.ID         // CNI attachments: one endpoint each
	ips        map[netip.Addr]endpoint.ID
	batch      batcher
	strategy   actor.SupervisorStrategy // for the endpoint actors

	// An agent-start restore in progress: who waits, for which endpoints.
	restoreWaiter  *actor.PID
	restorePending map[endpoint.ID]bool
	restoreResult  *messages.RestoreResult

	// stopping: the manager (with the agent) is stopping, so its children
	// stop too; their leases are kept for the next start, not released.
	stopping bool
}

// restoreReport is sent by a restored endpoint actor once it holds its
// leases again (err nil) or failed.
type restoreReport struct {
	id  endpoint.ID
	err error
}

func newManagerActor(deps *endpointDeps) *managerActor {
	l := deps.log.With("actor", "endpoints")
	return &managerActor{deps: deps, log: l, batch: newBatcher(deps.writer, l)}
}

// Receive implements actor.Actor.
func (m *managerActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		m.rebuild(ctx)
	case *actor.Restarting: // never: the root resumes the manager
		m.batch.flush()
	case *flushIndex:
		m.batch.flush()
	case *messages.CreateEndpoint:
		m.create(ctx, msg)
	case *messages.RestoreEndpoints:
		m.restore(ctx, msg)
	case *restoreReport:
		m.restored(ctx, msg.id, msg.err)
	case *messages.DeleteEndpoint:
		m.forward(ctx, msg.ID)
	case *messages.PatchLabels:
		m.forward(ctx, msg.ID)
	case *messages.Regenerate:
		m.forward(ctx, msg.ID)
	case *messages.ProxyAck:
		if pid, ok := m.children[msg.ID]; ok {
			ctx.Send(pid, msg)
		}
	case *messages.RegeneratePolicy:
		if msg.Wait || msg.Join {
			m.forward(ctx, msg.ID)
		} else if pid, ok := m.children[msg.ID]; ok {
			ctx.Send(pid, msg)
		}
	case *messages.EndpointChanged:
		m.changed(ctx, msg)
	case *actor.Stopping:
		m.stopping = true
	case *actor.Terminated:
		m.childStopped(ctx, msg.Who)
	case *getActors:
		ctx.Respond(m.actors())
	}
}

// rebuild resets the manager's maps from the index and spawns an actor for
// every endpoint found there (after a restart, which stopped the children).
func (m *managerActor) rebuild(ctx actor.Context) {
	m.children = make(map[endpoint.ID]*actor.PID)
	m.eps = make(map[endpoint.ID]*endpoint.Endpoint)
	m.containers = make(map[attachment]endpoint.ID)
	m.ips = make(map[netip.Addr]endpoint.ID)
	m.ids = [len(m.ids)]uint64{}
	m.ids[0] = 1 // ID 0 is never used
	for _, ep := range m.deps.ix.Endpoints(index.EndpointFilter{}) {
		m.track(ep)
		m.spawn(ctx, ep, startMode{kind: startRebuild})
	}
}

func (m *managerActor) create(ctx actor.Context, msg *messages.CreateEndpoint) {
	spec := msg.Spec.Clone()
	if err := m.checkUnique(spec); err != nil {
		ctx.Respond(&messages.EndpointResult{Err: err})
		return
	}
	if spec.ID == 0 {
		id, ok := m.nextID()
		if !ok {
			ctx.Respond(&messages.EndpointResult{Err: fmt.Errorf("create endpoint: %w", ErrIDsExhausted)})
			return
		}
		spec.ID = id
	}
	now := time.Now()
	spec.State, spec.Created, spec.StateChanged = endpoint.StateWaitingForIdentity, now, now
	m.track(spec)
	m.batch.putKeyed(ctx, index.TableEndpoints, spec.ID, spec)
	m.deps.events.Publish(endpointEvent(events.EndpointCreated, spec, "", "created"))
	m.spawn(ctx, spec, startMode{kind: startCreate, waiter: ctx.Sender(), sync: msg.Sync})
}

// restore re-creates endpoints from the state directory in state
// restoring, and answers once each holds its leases again or failed.
func (m *managerActor) restore(ctx actor.Context, msg *messages.RestoreEndpoints) {
	res := &messages.RestoreResult{Failed: map[endpoint.ID]error{}}
	m.restoreWaiter, m.restorePending, m.restoreResult = ctx.Sender(), map[endpoint.ID]bool{}, res
	for _, ep := range msg.Endpoints {
		spec := ep.Clone()
		if spec.ID == 0 || m.used(spec.ID) {
			res.Failed[spec.ID] = fmt.Errorf("restore endpoint %d: id in use: %w", spec.ID, ErrEndpointExists)
			continue
		}
		if err := m.checkUnique(spec); err != nil {
			res.Failed[spec.ID] = fmt.Errorf("restore: %w", err)
			continue
		}
		now := time.Now()
		spec.State, spec.StateChanged = endpoint.StateRestoring, now
		if spec.Created.IsZero() {
			spec.Created = now
		}
		m.track(spec)
		m.batch.putKeyed(ctx, index.TableEndpoints, spec.ID, spec)
		m.restorePending[spec.ID] = true
		m.deps.events.Publish(endpointEvent(events.EndpointCreated, spec, "", "restored"))
		m.spawn(ctx, spec, startMode{kind: startRestore})
	}
	m.maybeRestored(ctx)
}

func (m *managerActor) restored(ctx actor.Context, id endpoint.ID, err error) {
	if !m.restorePending[id] {
		return
	}
	delete(m.restorePending, id)
	if err != nil {
		m.restoreResult.Failed[id] = err
	} else {
		m.restoreResult.Restored = append(m.restoreResult.Restored, id)
	}
	m.maybeRestored(ctx)
}

func (m *managerActor) maybeRestored(ctx actor.Context) {
	if m.restoreWaiter == nil || len(m.restorePending) > 0 {
		return
	}
	m.batch.reply(ctx, m.restoreWaiter, m.restoreResult)
	m.restoreWaiter, m.restorePending, m.restoreResult = nil, nil, nil
}

func (m *managerActor) checkUnique(spec *endpoint.Endpoint) error {
	if spec.ID != 0 && m.used(spec.ID) {
		return fmt.Errorf("create endpoint %d: id in use: %w", spec.ID, ErrEndpointExists)
	}
	if spec.ContainerID != "" {
		if other, ok := m.containers[attachmentOf(spec)]; ok {
			return fmt.Errorf("create endpoint: container %s interface %q already has endpoint %d: %w", spec.ContainerID, spec.ContainerInterfaceName, other, ErrEndpointExists)
		}
	}
	for _, ip := range []netip.Addr{spec.IPv4, spec.IPv6} {
		if other, ok := m.ips[ip]; ok && ip.IsValid() {
			return fmt.Errorf("create endpoint: address %s already used by endpoint %d: %w", ip, other, ErrEndpointExists)
		}
	}
	return nil
}

func (m *managerActor) spawn(ctx actor.Context, ep *endpoint.Endpoint, mode startMode) {
	stats := &MailboxStats{}
	slot := newSlot(KindEndpoint, stats)
	incarnation := 0
	self, first, id := ctx.Self(), ep, ep.ID
	var prev *endpointActor // the latest incarnation (only touched on its goroutine)
	props := actor.PropsFromProducer(func() actor.Actor {
		incarnation++
		if incarnation == 1 {
			spec, md := first, mode
			first, mode = nil, startMode{} // later incarnations rebuild from the index
			prev = newEndpointActor(m.deps, spec, md, self, stats)
			prev.slot = slot
			return prev
		}
		// A restart: the new incarnation rebuilds from the index, falling
		// back to the failed one's record (the row may be gone during a
		// teardown, or not yet committed right after a create).
		rec, md := &endpoint.Endpoint{ID: id}, startMode{kind: startRebuild}
		if prev != nil {
			rec, md.life, md.stateStays = prev.ep, prev.life, prev.stateStays
		}
		prev = newEndpointActor(m.deps, rec, md, self, stats)
		prev.slot = slot
		return prev
	}, mailboxOptions(stats)...)
	pid, err := ctx.SpawnNamed(props, endpointActorName(ep.ID))
	if err != nil {
		// The name is taken only if the previous actor for this ID has not
		// finished stopping, which ID bookkeeping prevents; report loudly.
		m.log.Error("spawning endpoint actor failed", "endpoint", ep.ID, "err", err)
		m.untrack(ep)
		m.batch.delKeyed(ctx, index.TableEndpoints, ep.ID, ep)
		m.batch.reply(ctx, mode.waiter, &messages.EndpointResult{Err: fmt.Errorf("spawn endpoint %d: %w", ep.ID, err)})
		return
	}
	m.children[ep.ID] = pid
	slot.pid = pid
	m.deps.registry.put(pid.Id, slot)
}

// forward sends a request naming an endpoint to its actor, keeping the
// sender so the endpoint actor answers the caller directly.
func (m *managerActor) forward(ctx actor.Context, id endpoint.ID) {
	pid, ok := m.children[id]
	if !ok {
		ctx.Respond(&messages.EndpointResult{Err: fmt.Errorf("endpoint %d: %w", id, ErrEndpointNotFound)})
		return
	}
	ctx.Forward(pid)
}

func (m *managerActor) changed(ctx actor.Context, msg *messages.EndpointChanged) {
	id := msg.Endpoint.ID
	if pid, ok := m.children[id]; ok && msg.From != nil && pid.Id == msg.From.Id {
		if msg.Deleted {
			m.untrack(msg.Endpoint)
			m.batch.delKeyed(ctx, index.TableEndpoints, id, msg.Endpoint)
			m.eps[id] = msg.Endpoint // childStopped publishes the deleted event
		} else {
			if old := m.eps[id]; old != nil && old.State != msg.Endpoint.State {
				m.deps.events.Publish(endpointEvent(events.EndpointStateChanged, msg.Endpoint, old.State, msg.Endpoint.LastError))
			}
			m.eps[id] = msg.Endpoint
			m.batch.putKeyed(ctx, index.TableEndpoints, id, msg.Endpoint)
		}
	}
	for _, r := range msg.Replies {
		m.batch.reply(ctx, r.To, r.Message)
	}
}

// childStopped forgets an endpoint actor that stopped: after its delete
// finished, or because it failed more often than its restart budget
// allows (then its row is removed too, and IPAM and identity, told by
// holderStopped, release its leases).
func (m *managerActor) childStopped(ctx actor.Context, who *actor.PID) {
	m.deps.registry.remove(who.Id)
	if m.stopping {
		// The agent stops: endpoints, addresses and identities stay for
		// the next start to restore (a release here would delete the
		// pod's ipcache entry from the pinned map on the way out).
		return
	}
	// IPAM and identity end the leases the actor still holds.
	ctx.Send(m.deps.ipam, &holderStopped{who: who})
	ctx.Send(m.deps.identity, &holderStopped{who: who})
	id, ok := endpointIDFromPID(who)
	if ok {
		m.restored(ctx, id, fmt.Errorf("endpoint %d: actor stopped while restoring", id))
	}
	if pid, live := m.children[id]; !ok || !live || pid.Id != who.Id {
		return
	}
	if ep, ok := m.eps[id]; ok {
		m.untrack(ep)
		m.forgetPolicy(ctx, ep)
		reason := "deleted"
		if ep.State != endpoint.StateDisconnecting {
			reason = "endpoint actor stopped (restart budget exhausted)"
		}
		ev := endpointEvent(events.EndpointDeleted, ep, ep.State, reason)
		ev.State = string(endpoint.StateDisconnected)
		m.deps.events.Publish(ev)
	}
	delete(m.children, id)
	delete(m.eps, id)
	m.batch.delKeyed(ctx, index.TableEndpoints, id, &endpoint.Endpoint{ID: id})
	m.release(id)
}

// forgetPolicy drops a stopped endpoint's ipcache entries and policy
// subscription (a normal delete does it from the endpoint actor).
func (m *managerActor) forgetPolicy(ctx actor.Context, ep *endpoint.Endpoint) {
	var ips []netip.Addr
	for _, ip := range []netip.Addr{ep.IPv4, ep.IPv6} {
		if ip.IsValid() {
			ips = append(ips, ip)
		}
	}
	if len(ips) > 0 {
		ctx.Send(m.deps.ipcache, &messages.IPCacheEndpoint{Endpoint: ep.ID, IPs: ips, Deleted: true})
	}
	ctx.Send(m.deps.policy, &messages.EndpointPolicyGone{Endpoint: ep.ID})
}

// endpointIDFromPID parses the ID out of an endpoint actor's PID.
func endpointIDFromPID(pid *actor.PID) (endpoint.ID, bool) {
	i := strings.LastIndex(pid.Id, "/ep-")
	if i < 0 {
		return 0, false
	}
	n, err := strconv.ParseUint(pid.Id[i+4:], 10, 16)
	return endpoint.ID(n), err == nil && n > 0
}

func (m *managerActor) track(ep *endpoint.Endpoint) {
	m.eps[ep.ID] = ep
	m.ids[ep.ID/64] |= 1 << (ep.ID % 64)
	if ep.ContainerID != "" {
		m.containers[attachmentOf(ep)] = ep.ID
	}
	for _, ip := range []netip.Addr{ep.IPv4, ep.IPv6} {
		if ip.IsValid() {
			m.ips[ip] = ep.ID
		}
	}
}

// attachment is what the CNI spec keys an attachment by: the container
// ID and the interface name in it. A container may have several (Multus,
// or one container ID with two CNI_IFNAMEs), one endpoint each.
type attachment struct{ containerID, ifName string }

func attachmentOf(ep *endpoint.Endpoint) attachment {
	return attachment{ep.ContainerID, ep.ContainerInterfaceName}
}

// untrack forgets the container and addresses of ep (if still ep's).
func (m *managerActor) untrack(ep *endpoint.Endpoint) {
	if a := attachmentOf(ep); m.containers[a] == ep.ID {
		delete(m.containers, a)
	}
	for _, ip := range []netip.Addr{ep.IPv4, ep.IPv6} {
		if ip.IsValid() && m.ips[ip] == ep.ID {
			delete(m.ips, ip)
		}
	}
}

func (m *managerActor) used(id endpoint.ID) bool { return m.ids[id/64]&(1<<(id%64)) != 0 }

func (m *managerActor) release(id endpoint.ID) { m.ids[id/64] &^= 1 << (id % 64) }

// nextID returns the first free ID after the cursor, wrapping around, so
// an ID is not reused right after it was freed.
func (m *managerActor) nextID() (endpoint.ID, bool) {
	start := int(m.cursor) + 1
	for n := 0; n <= len(m.ids); n++ {
		w := (start/64 + n) % len(m.ids)
		word := m.ids[w]
		if n == 0 {
			word |= (1 << (start % 64)) - 1 // skip IDs before the cursor
		}
		if free := ^word; free != 0 {
			id := endpoint.ID(w*64 + bits.TrailingZeros64(free))
			m.ids[id/64] |= 1 << (id % 64)
			m.cursor = id
			return id, true
		}
	}
	// The first word was partly masked; look again from ID 1.
	for w := range m.ids {
		if free := ^m.ids[w]; free != 0 {
			id := endpoint.ID(w*64 + bits.TrailingZeros64(free))
			m.ids[id/64] |= 1 << (id % 64)
			m.cursor = id
			return id, true
		}
	}
	return 0, false
}

// ActorInfo describes one actor for operators.
type ActorInfo struct {
	PID      string
	Endpoint endpoint.ID
	Mailbox  int64
	Handled  int64
}

// getActors asks the endpoint manager for its children. Reply: []ActorInfo.
type getActors struct{}

func (m *managerActor) actors() []ActorInfo {
	out := make([]ActorInfo, 0, len(m.children))
	for id, pid := range m.children {
		info := ActorInfo{PID: pid.Id, Endpoint: id}
		if st := m.deps.stats(pid.Id); st != nil {
			info.Mailbox, info.Handled = st.Depth(), st.Processed()
		}
		out = append(out, info)
	}
	return out
}

var _ actor.SupervisorStrategy = (*managerActor)(nil)

// HandleFailure implements actor.SupervisorStrategy: protoactor asks the
// parent (this manager) how to handle a failing endpoint actor. It is
// restarted in place RestartBudget times per 10 s, then stopped (its
// leases are then released by IPAM and identity on holderStopped).
func (m *managerActor) HandleFailure(sys *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, rs *actor.RestartStatistics, reason, msg any) {
	if slot := m.deps.registry.slot(child.Id); slot != nil {
		slot.failed(reason)
	}
	if m.strategy == nil {
		m.strategy = actor.NewOneForOneStrategy(m.deps.cfg.RestartBudget, 10*time.Second, actor.DefaultDecider)
	}
	m.strategy.HandleFailure(sys, sup, child, rs, reason, msg)
}

// endpointEvent builds an endpoint event for the hub.
func endpointEvent(t events.Type, ep *endpoint.Endpoint, prev endpoint.State, msg string) events.Event {
	return events.Event{Type: t, Endpoint: uint16(ep.ID), Namespace: ep.Namespace, Pod: ep.PodName,
		State: string(ep.State), PrevState: string(prev), Identity: uint32(ep.Identity), Message: msg}
}

// holderStopped tells IPAM and identity that an endpoint actor (a lease
// holder) stopped: the manager, its parent, learns it without watching.
// Lease holders are not death-watched by IPAM and identity themselves:
// a watch costs every endpoint actor a watcher set and context extras
// (heap per endpoint is a target: BenchmarkHeapPerEndpoint).
type holderStopped struct{ who *actor.PID }

// deadHolders returns the holders (PID IDs) that no longer run, for a
// rebuilt IPAM or identity actor: a holder that stopped while it was
// restarting may have been reported before its books were lost.
func deadHolders(ctx actor.Context, holders iter.Seq[string]) []*actor.PID {
	var dead []*actor.PID
	reg := ctx.ActorSystem().ProcessRegistry
	for h := range holders {
		pid := actor.NewPID(ctx.ActorSystem().Address(), h)
		if _, ok := reg.Get(pid); !ok {
			dead = append(dead, pid)
		}
	}
	return dead
}
