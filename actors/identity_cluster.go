package actors

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// clusterMode is the identity actor's state with a cluster identity
// backend. The actor's allocator then only counts local references
// (bindings are restored with the backend's numbers); known holds what
// the store holds. A label set's first local reference sends Acquire to
// the backend workers and its waiters are answered when the answer comes
// back as a message; its last local release sends Release the same way.
type clusterMode struct {
	w      *backendWorkers
	cfg    ClusterIdentityConfig
	status *atomic.Pointer[ClusterIdentityStatus]
	// known holds the identities the store holds (watch, or an Acquire's
	// answer), knownByKey the same by label-set key.
	known      map[identity.NumericIdentity]labels.Labels
	knownByKey map[string]identity.NumericIdentity
	// pending holds the label sets waiting for the store, by key.
	pending map[string]*pendingAcquire
	// releases holds the backend Releases waiting for their time (see
	// releaseLater) or, failed, for their next attempt, by identity.
	releases map[identity.NumericIdentity]*releaseRetry
	// renumbered maps a number this node used for a label set to the
	// store's number its references moved to (see renumber), so that a
	// holder's late release of the old number releases the new one;
	// dropped when the new number's last reference goes.
	renumbered map[identity.NumericIdentity]identity.NumericIdentity
	lastErr    string
}

// releaseRetry is a backend Release of the node's use of an identity
// waiting: for ReleaseDelay, or, failed, to be tried again.
type releaseRetry struct {
	labels   labels.Labels
	attempts int
	timer    *time.Timer
}

// pendingAcquire is a label set whose first local reference waits for
// the backend: every endpoint actor asking for it meanwhile waits on the
// same call.
type pendingAcquire struct {
	labels   labels.Labels
	waiters  []acquireWaiter
	inFlight bool
	retry    *time.Timer
	attempts int
	// resumed: the store was reported reachable while an attempt was in
	// flight; if that attempt fails, the next one follows at once.
	resumed bool
	// confirm: the label set was bound here without the store (see
	// bindProvisional); retried until the store records the node's use.
	confirm bool
	// wait bounds the waiters' wait (ClusterIdentityConfig.WaitMax).
	wait *time.Timer
}

// acquireWaiter is one IdentityAcquire waiting for the backend.
type acquireWaiter struct {
	holder, replyTo *actor.PID
	// preferred is the restored endpoint's number (0: none).
	preferred identity.NumericIdentity
}

func newClusterMode(w *backendWorkers, cfg ClusterIdentityConfig, status *atomic.Pointer[ClusterIdentityStatus]) *clusterMode {
	return &clusterMode{w: w, cfg: cfg, status: status}
}

// reset empties the state before a rebuild from the index; the calls in
// flight of an earlier incarnation answer into nothing pending.
func (c *clusterMode) reset() {
	for _, p := range c.pending {
		if p.retry != nil {
			p.retry.Stop()
		}
		if p.wait != nil {
			p.wait.Stop()
		}
	}
	c.stopReleaseTimers()
	c.known = make(map[identity.NumericIdentity]labels.Labels)
	c.knownByKey = make(map[string]identity.NumericIdentity)
	c.pending = make(map[string]*pendingAcquire)
	c.releases = make(map[identity.NumericIdentity]*releaseRetry)
	c.renumbered = nil
}

// stopReleaseTimers stops the release retries' timers. A restarted
// incarnation does not retry its predecessor's failed releases: they only
// keep the identity marked in use (the store's GC never removes an
// identity a node marks), and the etcd backend retries its own.
func (c *clusterMode) stopReleaseTimers() {
	for _, r := range c.releases {
		if r.timer != nil {
			r.timer.Stop()
			r.timer = nil
		}
	}
}

// learn records that the store holds id with ls and tells the policy
// actor when the identity is new to this node. It returns false (and
// records nothing) when ls or id is bound differently here.
func (a *identityActor) learn(ctx actor.Context, id identity.NumericIdentity, ls labels.Labels) bool {
	c := a.cluster
	key := ls.Key()
	if cur, ok := c.known[id]; ok {
		return cur.Key() == key
	}
	if other, ok := c.knownByKey[key]; ok && other != id {
		a.log.Error("cluster identity store holds one label set under two identities; keeping the first", "labels", key, "kept", other, "ignored", id)
		return false
	}
	local, inUse := a.alloc.Lookup(id)
	if inUse && local.Labels.Key() != key {
		a.log.Error("cluster identity store binds an identity in use here to other labels", "identity", id, "local", local.Labels.Key(), "store", key)
		return false
	}
	bound, renumber := a.alloc.LookupByLabels(ls)
	renumber = renumber && bound.ID != id
	if renumber && !a.renumber(ctx, bound, id) {
		return false
	}
	c.known[id] = ls
	c.knownByKey[key] = id
	if !inUse && a.policy != nil {
		ctx.Send(a.policy, &messages.IdentityChanged{ID: id, Labels: ls})
	}
	a.writeRow(ctx, id)
	if renumber {
		a.renumbered(ctx, bound, id)
	}
	return true
}

// renumber moves the local references of a label set bound here as
// bound.ID to id, the number the cluster store gives it. This happens
// when the store collected the node's number (its GC, while the node
// could not mark it in use: a partition) and another node numbered the
// labels anew, or when a number bound here without the store (see
// bindProvisional) is not the one the store then answers. Keeping the
// local number would leave this node's pods with an identity the other
// nodes do not give them, and cross-node policy for them broken. Every
// holder's reference moves at once (the allocator binds a label set to
// one number), its lease row with it; renumbered then tells the holders,
// which regenerate. It returns false (nothing moved) only if the
// allocator refuses id.
func (a *identityActor) renumber(ctx actor.Context, bound identity.Identity, id identity.NumericIdentity) bool {
	for range bound.RefCount {
		if _, err := a.alloc.Release(bound.ID); err != nil {
			break
		}
	}
	if err := a.alloc.Restore(identity.Identity{ID: id, Labels: bound.Labels, RefCount: bound.RefCount}); err != nil {
		// Cannot happen (id is free here and the labels were just
		// unbound); put the old binding back and keep it.
		if rerr := a.alloc.Restore(bound); rerr != nil {
			a.log.Error("restoring a local identity after a failed renumbering", "identity", bound.ID, "err", rerr)
		}
		a.log.Error("cluster identity store numbers a label set in use here differently; renumbering failed, the endpoints keep the number they have",
			"labels", bound.Labels.Key(), "here", bound.ID, "store", id, "err", err)
		a.events.Publish(events.Event{Type: events.IdentityWaiting, Identity: uint32(id), Labels: bound.Labels.Strings(),
			Message: fmt.Sprintf("the store numbers these labels %d, endpoints here use %d: %v", id, bound.ID, err)})
		return false
	}
	for holder, ids := range a.holders {
		i := slices.Index(ids, bound.ID)
		if i < 0 {
			continue
		}
		ids[i] = id
		a.batch.delKeyed(ctx, index.TableIdentityLeases, index.LeaseKey(bound.ID, holder), &index.IdentityLease{ID: bound.ID, Holder: holder})
		a.batch.putKeyed(ctx, index.TableIdentityLeases, index.LeaseKey(id, holder), &index.IdentityLease{ID: id, Holder: holder})
	}
	if a.cluster.renumbered == nil {
		a.cluster.renumbered = make(map[identity.NumericIdentity]identity.NumericIdentity)
	}
	a.cluster.renumbered[bound.ID] = id
	return true
}

// renumbered finishes a renumbering once id is recorded as known: the
// old number's row and policy go, the node's use moves in the store (an
// Acquire records it under id unless one is under way; the old number
// is released), and the holders are told (after the index commit, in
// order with their earlier answers), each regenerating through its own
// actor.
func (a *identityActor) renumbered(ctx actor.Context, bound identity.Identity, id identity.NumericIdentity) {
	c := a.cluster
	key := bound.Labels.Key()
	a.writeRow(ctx, bound.ID)
	if _, known := c.known[bound.ID]; !known && a.policy != nil {
		ctx.Send(a.policy, &messages.IdentityChanged{ID: bound.ID, Deleted: true})
	}
	a.backendRelease(bound.ID, bound.Labels)
	if c.pending[key] == nil {
		p := &pendingAcquire{labels: bound.Labels, confirm: true}
		c.pending[key] = p
		a.startAcquire(ctx, key, p)
	}
	n := 0
	for holder, ids := range a.holders {
		if slices.Contains(ids, id) {
			a.batch.reply(ctx, actor.NewPID(ctx.ActorSystem().Address(), holder), &messages.IdentityRenumbered{Old: bound.ID, New: id})
			n++
		}
	}
	a.log.Warn("cluster identity store numbers a label set in use here differently; its endpoints move to the store's number",
		"labels", key, "here", bound.ID, "store", id, "endpoints", n)
	a.events.Publish(events.Event{Type: events.IdentityRenumbered, Identity: uint32(id), Labels: bound.Labels.Strings(),
		Message: fmt.Sprintf("the store numbers these labels %d; %d endpoint(s) here move from %d to it", id, n, bound.ID)})
}

// forget drops id from the known set (the store removed it).
func (a *identityActor) forget(ctx actor.Context, id identity.NumericIdentity) {
	c := a.cluster
	ls, ok := c.known[id]
	if !ok {
		return
	}
	delete(c.known, id)
	delete(c.knownByKey, ls.Key())
	if _, inUse := a.alloc.Lookup(id); inUse {
		// Collected while this node could not mark it in use (a
		// partition): ask the store again, preferring this number. It is
		// created again with it, or, if another node numbered the labels
		// anew meanwhile, the answer (like the watch's event, in either
		// order) moves the endpoints to the store's number (renumber).
		a.log.Warn("cluster identity store removed an identity in use on this node; asking the store again", "identity", id)
		if key := ls.Key(); a.cluster.pending[key] == nil {
			p := &pendingAcquire{labels: ls, confirm: true}
			a.cluster.pending[key] = p
			a.startAcquire(ctx, key, p)
		}
	} else if a.policy != nil {
		ctx.Send(a.policy, &messages.IdentityChanged{ID: id, Deleted: true})
	}
	a.writeRow(ctx, id)
}

// clusterAcquire answers an IdentityAcquire from the local references
// when the label set is in use here, else waits (with every other
// acquirer of the label set) for the backend.
func (a *identityActor) clusterAcquire(ctx actor.Context, msg *messages.IdentityAcquire) {
	if id, ok := identity.LookupReserved(msg.Labels); ok {
		ls, _ := identity.ReservedLabels(id)
		a.batch.reply(ctx, ctx.Sender(), &messages.IdentityAcquired{Identity: identity.Identity{ID: id, Labels: ls}})
		return
	}
	if len(msg.Labels) == 0 {
		a.batch.reply(ctx, ctx.Sender(), &messages.IdentityAcquired{Err: fmt.Errorf("acquire identity: empty label set: %w", identity.ErrInvalidLabels)})
		return
	}
	if err := msg.Labels.Validate(); err != nil {
		a.batch.reply(ctx, ctx.Sender(), &messages.IdentityAcquired{Err: fmt.Errorf("acquire identity: %w: %w", identity.ErrInvalidLabels, err)})
		return
	}
	if cur, ok := a.alloc.LookupByLabels(msg.Labels); ok { // in use here: the node's use is recorded
		a.bindHolders(ctx, cur.ID, cur.Labels, []acquireWaiter{{holder: msg.Holder, replyTo: ctx.Sender()}}, false)
		return
	}
	key := msg.Labels.Key()
	p := a.cluster.pending[key]
	if p == nil {
		p = &pendingAcquire{labels: msg.Labels}
		a.cluster.pending[key] = p
	}
	p.waiters = append(p.waiters, acquireWaiter{holder: msg.Holder, replyTo: ctx.Sender(), preferred: msg.Preferred})
	// No request waits for the store longer than WaitMax (below its
	// caller's deadline): an attempt hanging until CallTimeout (the store
	// unreachable, or another call hanging on the label set's worker), or
	// the next attempt far off in its backoff, would otherwise turn into
	// a bare "future: timeout" at the CNI ADD. The waiters still parked
	// then are answered as after a failed attempt; the attempt goes on.
	if p.wait == nil {
		self, root := ctx.Self(), ctx.ActorSystem().Root
		p.wait = time.AfterFunc(a.cluster.cfg.WaitMax, func() { root.Send(self, &clusterWaitOver{key: key}) })
	}
	if !p.inFlight && p.retry == nil {
		a.startAcquire(ctx, key, p)
	}
	a.publishClusterStatus()
}

// clusterWaitOver answers the waiters of a label set still waiting for
// the store after WaitMax: bound to its provisional number if it has one
// (as after a failed attempt), else ErrIdentityStoreUnavailable with the
// store's last error.
func (a *identityActor) clusterWaitOver(ctx actor.Context, key string) {
	p := a.cluster.pending[key]
	if p == nil {
		return
	}
	p.wait = nil
	if len(p.waiters) == 0 {
		return
	}
	why := a.cluster.lastErr
	if st := a.cluster.w.backend.Status(); !st.Healthy && st.LastError != "" {
		why = st.LastError
	}
	a.answerWaiting(ctx, key, p, fmt.Errorf("acquire identity for %s: no answer from the store within %s (%d attempts failed, retrying): %w: %s",
		key, a.cluster.cfg.WaitMax, p.attempts, ErrIdentityStoreUnavailable, why))
	a.publishClusterStatus()
}

// answerWaiting answers a pending label set's waiters while the store
// cannot: bound to its provisional number if it has one, else err.
func (a *identityActor) answerWaiting(ctx actor.Context, key string, p *pendingAcquire, err error) {
	if id := a.provisional(key, p); id != identity.IdentityUnknown {
		a.bindProvisional(ctx, id, p)
		return
	}
	for _, w := range p.waiters {
		a.batch.reply(ctx, w.replyTo, &messages.IdentityAcquired{Err: err})
	}
	p.waiters = nil
}

// startAcquire hands the backend Acquire of a pending label set to its
// worker.
func (a *identityActor) startAcquire(ctx actor.Context, key string, p *pendingAcquire) {
	p.inFlight = true
	if err := a.cluster.w.acquire(p.labels, a.preferredNumber(p)); err != nil {
		p.inFlight = false
		a.acquireFailed(ctx, key, p, err)
	}
}

// preferredNumber is the number the store should give the pending label
// set if it numbers it anew: the one endpoints here already hold for it
// (bound without the store, see bindProvisional: the store may have
// collected it meanwhile, and the endpoints keep it), else a restored
// endpoint's own number. 0: none.
func (a *identityActor) preferredNumber(p *pendingAcquire) identity.NumericIdentity {
	if cur, ok := a.alloc.LookupByLabels(p.labels); ok {
		return cur.ID
	}
	for _, w := range p.waiters {
		if w.preferred >= identity.MinLocalIdentity && !w.preferred.IsReserved() {
			if _, used := a.alloc.Lookup(w.preferred); !used {
				return w.preferred
			}
		}
	}
	return identity.IdentityUnknown
}

// clusterAcquired continues a pending label set with the backend's answer.
func (a *identityActor) clusterAcquired(ctx actor.Context, msg *clusterAcquired) {
	c := a.cluster
	p := c.pending[msg.key]
	if p != nil {
		p.inFlight = false
	}
	err := msg.err
	if err == nil && (msg.id < identity.MinLocalIdentity || msg.id.IsReserved()) {
		err = fmt.Errorf("backend answered identity %d, outside the cluster range: %w", msg.id, identity.ErrInvalidIdentity)
	}
	if err != nil {
		if p != nil {
			a.acquireFailed(ctx, msg.key, p, err)
		}
		return
	}
	c.lastErr = ""
	a.supersede(ctx, msg.id, msg.labels)
	learned := a.learn(ctx, msg.id, msg.labels)
	if p == nil || len(p.waiters) == 0 {
		// Nobody here wants it any more (the holders went, or the actor
		// restarted): drop the node's use unless it is in use anyway.
		delete(c.pending, msg.key)
		if _, inUse := a.alloc.Lookup(msg.id); !inUse {
			a.backendRelease(msg.id, msg.labels)
		}
		a.publishClusterStatus()
		return
	}
	delete(c.pending, msg.key)
	if p.retry != nil {
		p.retry.Stop()
	}
	if !learned {
		err := fmt.Errorf("acquire identity for %s: backend answered %d, bound differently on this node: %w", msg.key, msg.id, identity.ErrConflict)
		for _, w := range p.waiters {
			a.batch.reply(ctx, w.replyTo, &messages.IdentityAcquired{Err: err})
		}
		a.publishClusterStatus()
		return
	}
	a.bindHolders(ctx, msg.id, msg.labels, p.waiters, msg.isNew)
	a.publishClusterStatus()
}

// supersede drops what the watch last reported that an Acquire's answer
// (id for ls) contradicts: id for other labels, or another number for ls
// (unless endpoints here hold id for other labels), with a backend that
// numbers a label set once (identity.SingleNumberBackend). The answer was read
// in the transaction that recorded this node's reference, which keeps it
// from being collected (until the node releases it or its lease lapses),
// so it is at least as new as anything the watch delivered: the watch is
// behind (one broken by an etcd restart re-lists late, while the node's
// Acquires already see the store), and a contradicting number was
// collected and the labels numbered anew. A stale number endpoints here
// hold for ls is then moved to id by learn (renumber), as the watch's
// late events would do. Keeping the watch's view refused the answer
// instead: the ADD failed and the reference the Acquire recorded
// outlived every endpoint, or a confirmation was dropped and endpoints
// stayed on a number the store no longer has, with nothing asking again
// (a re-list reports the removal of a number only if the watch had seen
// it).
func (a *identityActor) supersede(ctx actor.Context, id identity.NumericIdentity, ls labels.Labels) {
	c := a.cluster
	if sb, ok := c.w.backend.(identity.SingleNumberBackend); !ok || !sb.SingleNumber() {
		return
	}
	key := ls.Key()
	if cur, used := a.alloc.Lookup(id); used && cur.Labels.Key() != key {
		return // the other labels' endpoints move when the watch reports the change
	}
	if cur, ok := c.known[id]; ok && cur.Key() != key {
		a.unlearn(ctx, id)
	}
	if old, ok := c.knownByKey[key]; ok && old != id {
		a.unlearn(ctx, old)
	}
}

// unlearn drops id from the known set without asking the store again
// (supersede: the store's answer replaces it); unlike forget, a number in
// use here keeps its binding until learn moves it.
func (a *identityActor) unlearn(ctx actor.Context, id identity.NumericIdentity) {
	c := a.cluster
	ls := c.known[id]
	delete(c.known, id)
	delete(c.knownByKey, ls.Key())
	if _, inUse := a.alloc.Lookup(id); !inUse && a.policy != nil {
		ctx.Send(a.policy, &messages.IdentityChanged{ID: id, Deleted: true})
	}
	a.writeRow(ctx, id)
}

// bindHolders gives each waiter one local reference on id (a holder holds
// at most one) and answers it.
func (a *identityActor) bindHolders(ctx actor.Context, id identity.NumericIdentity, ls labels.Labels, ws []acquireWaiter, isNew bool) {
	refs := 0
	if cur, ok := a.alloc.Lookup(id); ok {
		refs, ls = cur.RefCount, cur.Labels
	}
	for _, w := range ws {
		if w.holder != nil && !slices.Contains(a.holders[w.holder.Id], id) {
			refs++
			a.hold(ctx, w.holder.Id, id)
			a.batch.putKeyed(ctx, index.TableIdentityLeases, index.LeaseKey(id, w.holder.Id), &index.IdentityLease{ID: id, Holder: w.holder.Id})
		}
	}
	var err error
	if refs > 0 {
		err = a.alloc.Restore(identity.Identity{ID: id, Labels: ls, RefCount: refs})
	}
	if err != nil {
		err = fmt.Errorf("acquire identity for %s: %w", ls.Key(), err)
	} else if isNew {
		a.events.Publish(events.Event{Type: events.IdentityAllocated, Identity: uint32(id), Labels: ls.Strings()})
	}
	a.writeRow(ctx, id)
	got, _ := a.alloc.Lookup(id)
	for i, w := range ws {
		a.batch.reply(ctx, w.replyTo, &messages.IdentityAcquired{Identity: got, IsNew: isNew && i == 0, Err: err})
	}
}

// acquireFailed answers the waiters of a pending label set with the
// failure (their endpoints show it and retry) and retries with backoff,
// at most Attempts times.
func (a *identityActor) acquireFailed(ctx actor.Context, key string, p *pendingAcquire, err error) {
	c := a.cluster
	c.lastErr = err.Error()
	if p.attempts == 0 {
		a.log.Warn("cluster identity store unavailable; the label set waits for it", "labels", key, "err", err)
		a.events.Publish(events.Event{Type: events.IdentityWaiting, Labels: p.labels.Strings(), Message: err.Error()})
	}
	p.attempts++
	a.answerWaiting(ctx, key, p, fmt.Errorf("acquire identity for %s (attempt %d, retrying): %w: %w", key, p.attempts, ErrIdentityStoreUnavailable, err))
	if p.attempts >= c.cfg.Attempts && !p.confirm {
		delete(c.pending, key)
	} else {
		self, root := ctx.Self(), ctx.ActorSystem().Root
		wait := backoff(c.cfg.RetryMin, c.cfg.RetryMax, p.attempts-1)
		if p.resumed { // began before the store came back
			wait, p.resumed = 0, false
		}
		p.retry = time.AfterFunc(wait, func() { root.Send(self, &clusterRetry{key: key}) })
	}
	a.publishClusterStatus()
}

// provisional returns the number a label set the store cannot be asked
// about may use meanwhile: the one the watch reported for it, else a
// restored endpoint's own number (an agent restarted while the API server
// is unreachable keeps its endpoints' numbers, as with the local
// allocator) when nothing here binds that number otherwise. 0: none; the
// label set waits.
func (a *identityActor) provisional(key string, p *pendingAcquire) identity.NumericIdentity {
	if id, ok := a.cluster.knownByKey[key]; ok {
		if cur, used := a.alloc.Lookup(id); !used || cur.Labels.Key() == key {
			return id
		}
	}
	for _, w := range p.waiters {
		id := w.preferred
		if id < identity.MinLocalIdentity || id.IsReserved() {
			continue
		}
		if _, used := a.alloc.Lookup(id); used {
			continue
		}
		if ls, ok := a.cluster.known[id]; ok && ls.Key() != key {
			continue
		}
		return id
	}
	return identity.IdentityUnknown
}

// bindProvisional binds the waiting label set to id without the store
// and answers the waiters; the pending entry stays and is retried until
// the store records this node's use (then the number is confirmed, or a
// differing one is logged and reported).
func (a *identityActor) bindProvisional(ctx actor.Context, id identity.NumericIdentity, p *pendingAcquire) {
	if _, known := a.cluster.known[id]; !known && a.policy != nil {
		ctx.Send(a.policy, &messages.IdentityChanged{ID: id, Labels: p.labels})
	}
	a.log.Warn("cluster identity store unavailable; label set bound to its known number until the store confirms it", "labels", p.labels.Key(), "identity", id)
	a.bindHolders(ctx, id, p.labels, p.waiters, false)
	p.waiters = nil
	p.confirm = true
}

// clusterRetried starts the next attempt of a pending label set.
func (a *identityActor) clusterRetried(ctx actor.Context, key string) {
	p := a.cluster.pending[key]
	if p == nil || p.inFlight {
		return
	}
	p.retry = nil
	a.startAcquire(ctx, key, p)
}

// retryPending starts the next attempt of every pending label set that
// waits for its backoff (the store is reachable again).
func (a *identityActor) retryPending(ctx actor.Context) {
	n := 0
	for key, p := range a.cluster.pending {
		if p.inFlight {
			p.resumed = true
			continue
		}
		if p.retry == nil {
			continue
		}
		p.retry.Stop()
		p.retry = nil
		a.startAcquire(ctx, key, p)
		n++
	}
	if n > 0 {
		a.log.Info("cluster identity store reachable again; waiting label sets retried", "label-sets", n)
	}
}

// releaseLater releases the node's use of id in the store after
// ReleaseDelay, through the retry path (clusterReleaseRetried): void if
// the node uses id again by then, after the label set's Acquire if one
// is under way. A release already waiting (a failed one's retry) is
// left to its timer.
func (a *identityActor) releaseLater(ctx actor.Context, id identity.NumericIdentity, ls labels.Labels) {
	c := a.cluster
	if c.cfg.ReleaseDelay < 0 {
		a.backendRelease(id, ls)
		return
	}
	if r := c.releases[id]; r != nil && r.timer != nil {
		return
	}
	self, root := ctx.Self(), ctx.ActorSystem().Root
	c.releases[id] = &releaseRetry{labels: ls, timer: time.AfterFunc(c.cfg.ReleaseDelay, func() { root.Send(self, &clusterReleaseRetry{id: id}) })}
}

// backendRelease hands the backend Release of id to its worker.
func (a *identityActor) backendRelease(id identity.NumericIdentity, ls labels.Labels) {
	if r := a.cluster.releases[id]; r != nil && r.timer != nil {
		r.timer.Stop() // released again before the retry: this call is the retry
		r.timer = nil
	}
	if err := a.cluster.w.release(id, ls); err != nil {
		// Only keeps the identity alive in the store; GC never removes
		// an identity a node marks as used.
		a.log.Error("releasing a cluster identity: not queued", "identity", id, "err", err)
		delete(a.cluster.releases, id)
	}
}

// clusterReleased handles a backend Release's answer: a failure is tried
// again after a backoff, up to Attempts times.
func (a *identityActor) clusterReleased(ctx actor.Context, msg *clusterReleased) {
	c := a.cluster
	if msg.err == nil {
		delete(c.releases, msg.id)
		return
	}
	r := c.releases[msg.id]
	if r == nil {
		r = &releaseRetry{labels: msg.labels}
		c.releases[msg.id] = r
	}
	r.attempts++
	c.lastErr = msg.err.Error()
	if r.attempts >= c.cfg.Attempts {
		a.log.Error("releasing the node's use of a cluster identity failed; it stays marked in use", "identity", msg.id, "attempts", r.attempts, "err", msg.err)
		delete(c.releases, msg.id)
		return
	}
	wait := backoff(c.cfg.RetryMin, c.cfg.RetryMax, r.attempts-1)
	a.log.Warn("releasing the node's use of a cluster identity failed; retrying", "identity", msg.id, "in", wait, "err", msg.err)
	if r.timer != nil {
		r.timer.Stop()
	}
	self, root, id := ctx.Self(), ctx.ActorSystem().Root, msg.id
	r.timer = time.AfterFunc(wait, func() { root.Send(self, &clusterReleaseRetry{id: id}) })
}

// clusterReleaseRetried makes a waiting Release (delayed by
// releaseLater, or failed before), unless the node uses the identity
// again (an endpoint acquired it meanwhile: the release is void) or an
// Acquire of its label set is under way (it runs first on the label
// set's worker, and a Release after it would undo the node's use: the
// release waits for it to settle).
func (a *identityActor) clusterReleaseRetried(ctx actor.Context, id identity.NumericIdentity) {
	c := a.cluster
	r := c.releases[id]
	if r == nil || r.timer == nil {
		return
	}
	r.timer = nil
	if _, inUse := a.alloc.Lookup(id); inUse {
		delete(c.releases, id)
		return
	}
	if c.pending[r.labels.Key()] != nil {
		self, root := ctx.Self(), ctx.ActorSystem().Root
		wait := backoff(c.cfg.RetryMin, c.cfg.RetryMax, max(r.attempts-1, 0))
		r.timer = time.AfterFunc(wait, func() { root.Send(self, &clusterReleaseRetry{id: id}) })
		return
	}
	a.backendRelease(id, r.labels)
}

// clusterWatched applies one event of the store's watch.
func (a *identityActor) clusterWatched(ctx actor.Context, ev identity.ClusterEvent) {
	switch ev.Kind {
	case identity.ClusterUpsert:
		if ev.ID < identity.MinLocalIdentity || ev.ID.IsReserved() || ev.Labels.Validate() != nil || len(ev.Labels) == 0 {
			a.log.Error("cluster identity store reports an invalid identity; ignored", "identity", ev.ID, "labels", ev.Labels.Key())
			return
		}
		if cur, ok := a.cluster.known[ev.ID]; ok && cur.Key() != ev.Labels.Key() {
			a.forget(ctx, ev.ID)
		}
		a.learn(ctx, ev.ID, ev.Labels)
	case identity.ClusterDelete:
		a.forget(ctx, ev.ID)
	case identity.ClusterSynced:
		a.log.Info("cluster identities synced", "known", len(a.cluster.known))
	case identity.ClusterResumed:
		a.retryPending(ctx)
	}
	a.publishClusterStatus()
}

// publishClusterStatus publishes the state /v1/status shows.
func (a *identityActor) publishClusterStatus() {
	c := a.cluster
	st := &ClusterIdentityStatus{Known: len(c.known), Waiting: len(c.pending), LastError: c.lastErr}
	for key := range c.pending {
		if len(st.WaitingLabels) == 10 {
			break
		}
		st.WaitingLabels = append(st.WaitingLabels, key)
	}
	slices.Sort(st.WaitingLabels)
	c.status.Store(st)
}

// confirmUnconfirmed asks the store again, after a rebuild, for the label
// sets bound here without it (bindProvisional): the earlier incarnation's
// retries died with it.
func (a *identityActor) confirmUnconfirmed(ctx actor.Context, rows []*index.Identity) {
	for _, row := range rows {
		if _, inUse := a.alloc.Lookup(row.ID); !inUse || row.Cluster {
			continue
		}
		p := &pendingAcquire{labels: row.Labels, confirm: true}
		a.cluster.pending[row.Key] = p
		a.startAcquire(ctx, row.Key, p)
	}
	a.publishClusterStatus()
}

// rebuildCluster restores the known identities recorded in the index.
func (a *identityActor) rebuildCluster(rows []*index.Identity) {
	a.cluster.reset()
	for _, row := range rows {
		if row.Cluster {
			a.cluster.known[row.ID] = row.Labels
			a.cluster.knownByKey[row.Key] = row.ID
		}
	}
	a.publishClusterStatus()
}
