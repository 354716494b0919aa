package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
)

// ipcacheRetryMin and ipcacheRetryMax bound the backoff between retries
// of failed datapath ipcache writes.
const (
	ipcacheRetryMin = 100 * time.Millisecond
	ipcacheRetryMax = 30 * time.Second
)

// ipcacheActor owns the node's ipcache: prefix -> identity, fed by the
// endpoint actors (their addresses), the policy actor (policy CIDR
// prefixes) and the configuration (the ranges' gateways are the host).
// It is the single writer of the ipcache table and writes the datapath
// through the worker pool, one batch at a time, so writes to one prefix
// never overtake each other. A restart rebuilds from the table and
// re-writes every entry (writes are idempotent).
type ipcacheActor struct {
	owner
	deps     *endpointDeps
	gateways []netip.Addr
	// ranges are the pod ranges: host address changes inside them are
	// not the host's to claim (gateways, endpoints).
	ranges []netip.Prefix
	log    *slog.Logger

	// entries are the desired rows (immutable, shared with the index).
	// What the datapath holds is not tracked (heap per endpoint): every
	// change of a prefix's identity is written, writes are idempotent.
	entries map[netip.Prefix]*index.IPCacheEntry
	dirty   map[netip.Prefix]struct{}
	syncing bool
	prune   bool // a full sync (datapath.IPCacheSyncer) is due
	retry   *time.Timer
	backoff time.Duration // the next retry delay; 0 after a success

	// replacing holds, per origin, the replacement run in progress
	// (ReplaceRemoteEndpoints): the addresses it set so far.
	replacing map[string]*remoteReplace

	// batches counts the datapath writes started; barriers wait for the
	// success of batch need (IPCacheBarrier).
	batches  uint64
	barriers []ipcacheBarrier
}

// ipcacheBarrier is an IPCacheBarrier waiting for the batch that writes
// every change received before it.
type ipcacheBarrier struct {
	to   *actor.PID
	seq  uint64
	need uint64
}

// ipcacheRetrySync is the retry timer's message.
type ipcacheRetrySync struct{}

// ipcacheOp is one datapath write of a sync batch.
type ipcacheOp struct {
	prefix netip.Prefix
	id     identity.NumericIdentity // 0: delete
	tunnel netip.Addr               // the remote node (tunnel mode)
	err    error
}

func newIPCacheActor(deps *endpointDeps, gateways []netip.Addr, ranges []netip.Prefix) *ipcacheActor {
	l := deps.log.With("actor", "ipcache")
	a := &ipcacheActor{deps: deps, gateways: gateways, ranges: ranges, log: l, owner: owner{batch: newBatcher(deps.writer, l)}}
	a.onStart, a.onStop = a.rebuild, a.stopTimers
	return a
}

// hostAddr claims (or drops) a host address as the host identity. The
// claim is the reserved source's, like the gateways' and the addresses
// found at start.
func (a *ipcacheActor) hostAddr(ctx actor.Context, msg *messages.IPCacheHostAddr) {
	ip := msg.Addr.Unmap()
	if !ip.IsValid() || slices.ContainsFunc(a.ranges, func(r netip.Prefix) bool { return r.Contains(ip) }) {
		return
	}
	p := netip.PrefixFrom(ip, ip.BitLen())
	if msg.Deleted {
		a.drop(ctx, p, func(c index.IPCacheClaim) bool { return c.Source == index.SourceReserved })
	} else {
		a.claim(ctx, p, index.IPCacheClaim{Source: index.SourceReserved, Identity: identity.ReservedHost})
	}
	a.sync(ctx)
}

// stopTimers stops the retry timer (owner.onStop).
func (a *ipcacheActor) stopTimers() {
	if a.retry != nil {
		a.retry.Stop()
		a.retry = nil
	}
}

// Receive implements actor.Actor.
func (a *ipcacheActor) Receive(ctx actor.Context) {
	defer a.batch.flushOnPanic()
	if a.lifecycle(ctx) {
		return
	}
	switch msg := ctx.Message().(type) {
	case *messages.IPCacheEndpoint:
		a.endpoint(ctx, msg)
	case *messages.IPCacheCIDRs:
		for _, p := range msg.Deletes {
			a.drop(ctx, p, func(c index.IPCacheClaim) bool { return c.Source == index.SourceCIDRPolicy })
		}
		for p, id := range msg.Upserts {
			a.claim(ctx, p, index.IPCacheClaim{Source: index.SourceCIDRPolicy, Identity: id})
		}
		a.sync(ctx)
	case *messages.IPCacheHostAddr:
		a.hostAddr(ctx, msg)
	case *messages.IPCacheRemote:
		a.remote(ctx, msg)
	case *messages.IPCachePrune:
		if _, ok := a.deps.dp.(datapath.IPCacheSyncer); ok {
			a.prune = true
			a.sync(ctx)
		}
	case *ipcacheRetrySync:
		a.retry = nil
		a.sync(ctx)
	case *messages.IPCacheBarrier:
		a.barrier(ctx, msg)
	case *crashForTest:
		panic("ipcache: crash requested by a test")
	}
}

// rebuild reads the table (empty at agent start), adds the gateways as
// the host and writes everything to the datapath.
func (a *ipcacheActor) rebuild(ctx actor.Context) {
	a.entries = map[netip.Prefix]*index.IPCacheEntry{}
	a.dirty = map[netip.Prefix]struct{}{}
	a.replacing = map[string]*remoteReplace{}
	for _, e := range a.deps.ix.IPCache() {
		a.entries[e.Prefix] = e
		a.dirty[e.Prefix] = struct{}{}
	}
	for _, gw := range a.gateways {
		a.claim(ctx, netip.PrefixFrom(gw, gw.BitLen()), index.IPCacheClaim{Source: index.SourceReserved, Identity: identity.ReservedHost})
	}
	a.sync(ctx)
}

// endpoint sets (or with Deleted drops) an endpoint's claims on its
// addresses; an endpoint's addresses never change.
func (a *ipcacheActor) endpoint(ctx actor.Context, msg *messages.IPCacheEndpoint) {
	for _, ip := range msg.IPs {
		p := netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen())
		if msg.Deleted || msg.Identity == identity.IdentityUnknown {
			a.drop(ctx, p, func(c index.IPCacheClaim) bool { return c.Source == index.SourceEndpoint && c.Endpoint == msg.Endpoint })
			continue
		}
		a.claim(ctx, p, index.IPCacheClaim{Source: index.SourceEndpoint, Identity: msg.Identity, Endpoint: msg.Endpoint})
	}
	a.sync(ctx)
}

// claim sets c's claim on p (replacing the same source's, for
// endpoints the same endpoint's, for remote endpoints the same origin's)
// and recomputes the entry.
func (a *ipcacheActor) claim(ctx actor.Context, p netip.Prefix, c index.IPCacheClaim) {
	var claims []index.IPCacheClaim
	if e := a.entries[p]; e != nil {
		claims = slices.DeleteFunc(slices.Clone(e.Claims), func(o index.IPCacheClaim) bool {
			return o.Source == c.Source && o.Endpoint == c.Endpoint && o.Origin == c.Origin
		})
	}
	a.set(ctx, p, append(claims, c))
}

// drop removes the claims on p that match.
func (a *ipcacheActor) drop(ctx actor.Context, p netip.Prefix, match func(index.IPCacheClaim) bool) {
	e := a.entries[p]
	if e == nil {
		return
	}
	a.set(ctx, p, slices.DeleteFunc(slices.Clone(e.Claims), match))
}

// set writes p's entry from its claims, the best by sourceRank; between
// remote claims of two origins the origin first by name wins
// (deterministic across restarts).
func (a *ipcacheActor) set(ctx actor.Context, p netip.Prefix, claims []index.IPCacheClaim) {
	old := a.entries[p]
	if len(claims) == 0 {
		if old != nil {
			delete(a.entries, p)
			a.batch.delKeyed(ctx, index.TableIPCache, p, old)
			a.dirty[p] = struct{}{}
		}
		return
	}
	best := claims[0]
	for _, c := range claims[1:] {
		if r, br := sourceRank(c.Source), sourceRank(best.Source); r < br || (r == br && c.Origin < best.Origin) {
			best = c
		}
	}
	e := &index.IPCacheEntry{Prefix: p, Identity: best.Identity, Source: best.Source, Claims: claims}
	if best.Source == index.SourceRemote {
		e.TunnelEndpoint = best.NodeIP
	}
	a.entries[p] = e
	a.batch.putKeyed(ctx, index.TableIPCache, p, e)
	if old == nil || old.Identity != e.Identity || old.TunnelEndpoint != e.TunnelEndpoint {
		a.dirty[p] = struct{}{}
	}
}

// sourceRank orders the claim sources, lowest first. What this node
// knows first-hand wins: its local endpoints, then its own reserved
// addresses (gateways, host addresses: reserved:host). Other nodes'
// claims come next: they can never displace this node's own entries
// (another node, or whoever writes its endpoint objects, cannot relabel
// the host or a local pod). Policy CIDRs, FQDN-learned addresses
// included, come last: a DNS answer naming the node or a pod never
// gives it a CIDR identity (the address keeps its identity and the
// toFQDN or toCIDR rule simply does not match it), as Cilium's ipcache
// prefers its host and API server sources over fqdn ones.
func sourceRank(s string) int {
	switch s {
	case index.SourceEndpoint:
		return 0
	case index.SourceReserved:
		return 1
	case index.SourceRemote:
		return 2
	case index.SourceCIDRPolicy:
		return 3
	}
	return 4
}

// sync writes the dirty prefixes to the datapath in one pool job, unless
// one is in flight (it runs again when that one finishes).
func (a *ipcacheActor) sync(ctx actor.Context) {
	if a.syncing {
		return
	}
	if a.prune {
		a.syncAll(ctx)
		return
	}
	if len(a.dirty) == 0 {
		return
	}
	ops := make([]ipcacheOp, 0, len(a.dirty))
	for p := range a.dirty {
		var id identity.NumericIdentity
		var tunnel netip.Addr
		if e := a.entries[p]; e != nil {
			id, tunnel = e.Identity, e.TunnelEndpoint
		}
		ops = append(ops, ipcacheOp{prefix: p, id: id, tunnel: tunnel})
	}
	a.dirty = map[netip.Prefix]struct{}{} // a burst's buckets go
	a.syncing = true
	a.batches++
	dp := a.deps.dp
	work := &messages.DatapathWork{Op: "ipcache", Run: func(c context.Context) (any, error) {
		return writeIPCache(c, dp, ops), nil
	}}
	a.req.inPool(ctx, a.deps, work, func(v any, err error) { a.synced(ctx, ops, v, err) })
}

// syncAll makes the datapath's ipcache hold exactly the entries, in one
// pool job (it covers every dirty prefix). A failure retries it.
func (a *ipcacheActor) syncAll(ctx actor.Context) {
	desired := make(map[netip.Prefix]datapath.IPCacheValue, len(a.entries))
	for p, e := range a.entries {
		desired[p] = datapath.IPCacheValue{Identity: e.Identity, TunnelEndpoint: e.TunnelEndpoint}
	}
	a.prune, a.syncing = false, true
	a.batches++
	a.dirty = map[netip.Prefix]struct{}{}
	syncer := a.deps.dp.(datapath.IPCacheSyncer)
	work := &messages.DatapathWork{Op: "ipcache-prune", Run: func(c context.Context) (any, error) {
		return syncer.SyncIPCache(c, desired)
	}}
	a.req.inPool(ctx, a.deps, work, func(v any, err error) {
		a.syncing = false
		if err != nil {
			a.prune = true
			a.barriersFailed()
			a.retryLater(ctx, "ipcache prune failed; retrying", err)
			return
		}
		a.barriersDone(ctx)
		st, _ := v.(datapath.IPCacheSyncStats)
		a.log.Info("ipcache pruned", "entries", len(desired), "deleted", st.Deleted, "written", st.Written)
		a.backoff = 0
		a.sync(ctx)
	})
}

// retryLater schedules the next sync with exponential backoff.
func (a *ipcacheActor) retryLater(ctx actor.Context, msg string, err error) {
	a.backoff = min(max(2*a.backoff, ipcacheRetryMin), ipcacheRetryMax)
	a.log.Warn(msg, "err", err, "in", a.backoff)
	if a.retry == nil {
		self, system := ctx.Self(), ctx.ActorSystem()
		a.retry = time.AfterFunc(a.backoff, func() { system.Root.Send(self, &ipcacheRetrySync{}) })
	}
}

func writeIPCache(ctx context.Context, dp datapath.Datapath, ops []ipcacheOp) []ipcacheOp {
	for i := range ops {
		if ops[i].id == 0 {
			ops[i].err = dp.DeleteIPCache(ctx, ops[i].prefix)
		} else {
			ops[i].err = dp.UpsertIPCache(ctx, ops[i].prefix, ops[i].id, ops[i].tunnel)
		}
	}
	return ops
}

func (a *ipcacheActor) synced(ctx actor.Context, sent []ipcacheOp, v any, err error) {
	a.syncing = false
	var done []ipcacheOp
	if err == nil {
		done, _ = v.([]ipcacheOp)
	}
	if done == nil {
		if err == nil {
			err = errors.New("no result")
		}
		done = sent
		for i := range done {
			done[i].err = fmt.Errorf("ipcache write did not run: %w", err)
		}
	}
	failed := 0
	for _, op := range done {
		if op.err != nil {
			failed++
			a.dirty[op.prefix] = struct{}{}
		}
	}
	if failed > 0 {
		a.barriersFailed()
		a.backoff = min(max(2*a.backoff, ipcacheRetryMin), ipcacheRetryMax)
		a.log.Warn("ipcache writes failed; retrying", "failed", failed, "err", firstErr(done), "in", a.backoff)
		if a.retry == nil {
			self, system := ctx.Self(), ctx.ActorSystem()
			a.retry = time.AfterFunc(a.backoff, func() { system.Root.Send(self, &ipcacheRetrySync{}) })
		}
		return
	}
	a.backoff = 0
	a.barriersDone(ctx)
	a.sync(ctx)
}

// barrier answers at once when the datapath holds every change, else
// once the batch writing the changes pending now succeeded.
func (a *ipcacheActor) barrier(ctx actor.Context, msg *messages.IPCacheBarrier) {
	pending := len(a.dirty) > 0 || a.prune
	if !a.syncing && !pending {
		ctx.Respond(&messages.IPCacheBarrierDone{Seq: msg.Seq})
		return
	}
	need := a.batches
	if pending {
		need++
	}
	a.barriers = append(a.barriers, ipcacheBarrier{to: ctx.Sender(), seq: msg.Seq, need: need})
}

// barriersDone answers the barriers the finished batch satisfies.
func (a *ipcacheActor) barriersDone(ctx actor.Context) {
	kept := a.barriers[:0]
	for _, b := range a.barriers {
		if b.need <= a.batches {
			ctx.Send(b.to, &messages.IPCacheBarrierDone{Seq: b.seq})
			continue
		}
		kept = append(kept, b)
	}
	clear(a.barriers[len(kept):])
	a.barriers = kept
}

// barriersFailed moves the barriers of a failed batch to its retry.
func (a *ipcacheActor) barriersFailed() {
	for i := range a.barriers {
		a.barriers[i].need = max(a.barriers[i].need, a.batches+1)
	}
}

func firstErr(ops []ipcacheOp) error {
	for _, op := range ops {
		if op.err != nil {
			return op.err
		}
	}
	return nil
}
