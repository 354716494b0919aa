package actors

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// identityActor maps label sets to numeric identities through an
// identity.Allocator (local today; a cluster-wide backend implements the
// same interface). A holder (endpoint actor) holds at most one reference
// per identity, so Acquire is idempotent and a restarted endpoint actor can
// safely acquire again. A stopped holder's references are dropped when the
// endpoint manager reports it (holderStopped). It is the single writer of the identities and
// identity-leases tables.
type identityActor struct {
	owner
	newAlloc func() (identity.Allocator, error)
	alloc    identity.Allocator
	log      *slog.Logger
	holders  map[string][]identity.NumericIdentity // holder PID ID -> identities (usually one)
	// policy is told about every identity bound or released (its
	// selector cache follows them); nil in tests without one.
	policy *actor.PID
	events *events.Hub // identity allocated / released; may be nil
	// cluster is the state with a cluster identity backend; nil with the
	// node-local allocator.
	cluster *clusterMode
}

func newIdentityActor(newAlloc func() (identity.Allocator, error), w *indexWriter, policy *actor.PID, log *slog.Logger) *identityActor {
	l := log.With("actor", "identity")
	a := &identityActor{newAlloc: newAlloc, log: l, policy: policy, owner: owner{batch: newBatcher(w, l), asksNobody: true}}
	a.onStart, a.onStop = a.rebuild, a.stopTimers
	return a
}

// Receive implements actor.Actor.
func (a *identityActor) Receive(ctx actor.Context) {
	defer a.batch.flushOnPanic()
	if a.lifecycle(ctx) {
		return
	}
	switch msg := ctx.Message().(type) {
	case *messages.IdentityAcquire:
		if a.cluster != nil {
			a.clusterAcquire(ctx, msg)
			return
		}
		id, isNew, err := a.acquire(ctx, msg)
		a.batch.reply(ctx, ctx.Sender(), &messages.IdentityAcquired{Identity: id, IsNew: isNew, Err: err})
	case *messages.IdentityRelease:
		released, err := a.release(ctx, msg.ID, msg.Holder.Id)
		a.batch.reply(ctx, ctx.Sender(), &messages.IdentityReleased{Released: released, Err: err})
	case *crashForTest:
		panic("crash requested by a test")
	case *clusterAcquired:
		if a.cluster != nil {
			a.clusterAcquired(ctx, msg)
		}
	case *clusterRetry:
		if a.cluster != nil {
			a.clusterRetried(ctx, msg.key)
		}
	case *clusterWaitOver:
		if a.cluster != nil {
			a.clusterWaitOver(ctx, msg.key)
		}
	case *clusterWatched:
		if a.cluster != nil {
			a.clusterWatched(ctx, msg.ev)
		}
	case *clusterReleased:
		if a.cluster != nil {
			a.clusterReleased(ctx, msg)
		}
	case *clusterReleaseRetry:
		if a.cluster != nil {
			a.clusterReleaseRetried(ctx, msg.id)
		}
	case *holderStopped:
		a.holderStopped(ctx, msg.who)
	}
}

// stopTimers stops the cluster mode's retry timers: an armed timer's
// closure holds the actor system, which a stopped or restarted actor
// must not keep reachable (a restart rebuilds the pending set from the
// index and retries at once).
func (a *identityActor) stopTimers() {
	if a.cluster == nil {
		return
	}
	for _, p := range a.cluster.pending {
		if p.retry != nil {
			p.retry.Stop()
			p.retry = nil
		}
		if p.wait != nil {
			p.wait.Stop()
			p.wait = nil
		}
	}
	a.cluster.stopReleaseTimers()
}

// holderStopped releases every identity reference a stopped endpoint
// actor still held.
func (a *identityActor) holderStopped(ctx actor.Context, who *actor.PID) {
	if a.cluster != nil {
		for _, p := range a.cluster.pending {
			p.waiters = slices.DeleteFunc(p.waiters, func(w acquireWaiter) bool { return w.holder != nil && w.holder.Id == who.Id })
		}
	}
	for _, id := range slices.Clone(a.holders[who.Id]) {
		if _, err := a.release(ctx, id, who.Id); err != nil {
			a.log.Error("releasing identity of a stopped endpoint actor", "identity", id, "holder", who.Id, "err", err)
		}
	}
	delete(a.holders, who.Id)
}

// rebuild creates the allocator and, after a restart, restores every
// identity and lease recorded in the index.
func (a *identityActor) rebuild(ctx actor.Context) {
	alloc, err := a.newAlloc()
	if err != nil {
		panic(fmt.Sprintf("identity: allocator: %v", err))
	}
	a.alloc = alloc
	a.holders = make(map[string][]identity.NumericIdentity)
	rows := a.batch.ix.Identities()
	if a.cluster != nil {
		a.rebuildCluster(rows)
	}
	for _, row := range rows {
		if row.RefCount == 0 { // known from the cluster store only
			continue
		}
		if err := a.alloc.Restore(identity.Identity{ID: row.ID, Labels: row.Labels, RefCount: row.RefCount}); err != nil {
			a.log.Error("restoring identity failed", "identity", row.ID, "err", err)
		}
	}
	for _, l := range a.batch.ix.IdentityLeases() {
		a.hold(ctx, l.Holder, l.ID)
	}
	for _, holder := range deadHolders(ctx, maps.Keys(a.holders)) {
		a.holderStopped(ctx, holder)
	}
	if a.cluster != nil {
		a.confirmUnconfirmed(ctx, rows)
	}
	if len(rows) > 0 {
		a.log.Info("rebuilt identities from the index", "identities", len(rows))
	}
}

func (a *identityActor) acquire(ctx actor.Context, msg *messages.IdentityAcquire) (identity.Identity, bool, error) {
	if id, ok := identity.LookupReserved(msg.Labels); ok {
		ls, _ := identity.ReservedLabels(id)
		return identity.Identity{ID: id, Labels: ls}, false, nil
	}
	if cur, ok := a.alloc.LookupByLabels(msg.Labels); ok {
		if slices.Contains(a.holders[msg.Holder.Id], cur.ID) {
			return cur, false, nil
		}
	}
	id, isNew, err := a.allocate(msg)
	if err != nil {
		return identity.Identity{}, false, fmt.Errorf("acquire identity for %s: %w", msg.Labels.Key(), err)
	}
	if isNew {
		if a.policy != nil {
			// Sent before the acquirer's reply (which waits for the index
			// commit), so the policy actor knows the identity first.
			ctx.Send(a.policy, &messages.IdentityChanged{ID: id.ID, Labels: id.Labels})
		}
		a.events.Publish(events.Event{Type: events.IdentityAllocated, Identity: uint32(id.ID), Labels: id.Labels.Strings()})
	}
	a.hold(ctx, msg.Holder.Id, id.ID)
	a.batch.putKeyed(ctx, index.TableIdentityLeases, index.LeaseKey(id.ID, msg.Holder.Id), &index.IdentityLease{ID: id.ID, Holder: msg.Holder.Id})
	a.writeRow(ctx, id.ID)
	return id, isNew, nil
}

// allocate takes a reference, binding new labels to the preferred
// identity when it is free.
func (a *identityActor) allocate(msg *messages.IdentityAcquire) (identity.Identity, bool, error) {
	p := msg.Preferred
	if p >= identity.MinLocalIdentity {
		if _, bound := a.alloc.LookupByLabels(msg.Labels); !bound {
			if _, taken := a.alloc.Lookup(p); !taken {
				if err := a.alloc.Restore(identity.Identity{ID: p, Labels: msg.Labels, RefCount: 1}); err == nil {
					id, _ := a.alloc.Lookup(p)
					return id, true, nil
				}
			}
		}
	}
	return a.alloc.Allocate(msg.Labels)
}

// release drops holder's reference on id. It drops only a reference holder
// holds (a lease): a holder that never acquired id, or already released
// it, changes nothing, so no caller can drop a reference another holder
// took, and every reference a holder took is dropped exactly once.
func (a *identityActor) release(ctx actor.Context, id identity.NumericIdentity, holder string) (bool, error) {
	if id.IsReserved() || id == identity.IdentityUnknown {
		return false, nil
	}
	if !slices.Contains(a.holders[holder], id) {
		// A holder releasing the number its reference was moved from
		// (renumber) releases the one it was moved to.
		to, ok := a.renumberedTo(id)
		if !ok || !slices.Contains(a.holders[holder], to) {
			return false, nil
		}
		id = to
	}
	rest := slices.DeleteFunc(a.holders[holder], func(x identity.NumericIdentity) bool { return x == id })
	if len(rest) == 0 {
		delete(a.holders, holder)
	} else {
		a.holders[holder] = rest
	}
	a.batch.delKeyed(ctx, index.TableIdentityLeases, index.LeaseKey(id, holder), &index.IdentityLease{ID: id, Holder: holder})
	var ls labels.Labels
	if cur, ok := a.alloc.Lookup(id); ok {
		ls = cur.Labels
	}
	released, err := a.alloc.Release(id)
	if err != nil {
		return false, fmt.Errorf("release identity %d: %w", id, err)
	}
	if released {
		a.events.Publish(events.Event{Type: events.IdentityReleased, Identity: uint32(id), Labels: ls.Strings()})
	}
	a.writeRow(ctx, id)
	if released && a.cluster != nil {
		for from, to := range a.cluster.renumbered {
			if to == id {
				delete(a.cluster.renumbered, from)
			}
		}
		// The last local reference: the node no longer uses it (after
		// ReleaseDelay). The identity stays known while the store holds it.
		a.releaseLater(ctx, id, ls)
		if _, known := a.cluster.known[id]; known {
			return released, nil
		}
	}
	if released && a.policy != nil {
		ctx.Send(a.policy, &messages.IdentityChanged{ID: id, Deleted: true})
	}
	return released, nil
}

// renumberedTo returns the number id's references were moved to by a
// renumbering (cluster mode), if any.
func (a *identityActor) renumberedTo(id identity.NumericIdentity) (identity.NumericIdentity, bool) {
	if a.cluster == nil {
		return 0, false
	}
	to, ok := a.cluster.renumbered[id]
	return to, ok
}

// writeRow mirrors the allocator's view of id (and, with a cluster
// backend, whether the store holds it) into the identities table.
func (a *identityActor) writeRow(ctx actor.Context, id identity.NumericIdentity) {
	cur, ok := a.alloc.Lookup(id)
	var inCluster bool
	if a.cluster != nil {
		var ls labels.Labels
		if ls, inCluster = a.cluster.known[id]; inCluster && !ok {
			cur = identity.Identity{ID: id, Labels: ls}
		}
	}
	if !ok && !inCluster {
		a.batch.delKeyed(ctx, index.TableIdentities, id, &index.Identity{ID: id})
		return
	}
	a.batch.putKeyed(ctx, index.TableIdentities, id, &index.Identity{ID: cur.ID, Labels: cur.Labels, Key: cur.Labels.Key(), RefCount: cur.RefCount, Cluster: inCluster})
}

// hold records holder as holding a reference to id (see ipamActor.hold
// for how stopped holders are noticed).
func (a *identityActor) hold(_ actor.Context, holder string, id identity.NumericIdentity) {
	set := a.holders[holder]
	if !slices.Contains(set, id) {
		a.holders[holder] = append(set, id)
	}
}
