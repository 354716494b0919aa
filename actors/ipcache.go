package actors

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
)

// ipcacheActor owns the node's ipcache: prefix -> identity, fed by the
// endpoint actors (their addresses), the policy actor (policy CIDR
// prefixes) and the configuration (the ranges' gateways are the host).
// It is the single writer of the ipcache table and writes the datapath
// through its reconciler (one pool job at a time, so writes to one
// prefix never overtake each other; failed prefixes retried). A restart
// rebuilds from the table and re-writes every entry (writes are
// idempotent).
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
	// rec writes the changed prefixes (their entries, or their absence)
	// and, on IPCachePrune, the whole map (datapath.IPCacheSyncer).
	rec reconciler[netip.Prefix]

	// replacing holds, per origin, the replacement run in progress
	// (ReplaceRemoteEndpoints): the addresses it set so far.
	replacing map[string]*remoteReplace
	// reserved indexes the prefixes with a claim of a reserved set's
	// source (index.SourceNode, index.SourceKubeAPIServer), so that a
	// set's change (reservedSet, on every node event) visits its own
	// prefixes, not the whole ipcache.
	reserved map[string]map[netip.Prefix]struct{}
	// lens counts the entries by family and prefix length; the set of
	// lengths in use goes to the index whenever it changes
	// (index.SetIPCacheLengths: IPCacheLookup skips the others).
	lens [2][129]int
}

// countLen counts p's entry in (d 1) or out (d -1) and tells the index
// when a length comes into or goes out of use.
func (a *ipcacheActor) countLen(p netip.Prefix, d int) {
	fam := 0
	if p.Addr().Is6() {
		fam = 1
	}
	n := &a.lens[fam][p.Bits()]
	*n += d
	if (d > 0 && *n == 1) || (d < 0 && *n == 0) {
		a.publishLens()
	}
}

func (a *ipcacheActor) publishLens() {
	var l index.IPCacheLengths
	for fam := range a.lens {
		for bits, n := range a.lens[fam] {
			if n > 0 {
				l.Set(fam, bits)
			}
		}
	}
	a.deps.ix.SetIPCacheLengths(&l)
}

// reservedSources are the sources IPCacheReservedSet replaces whole.
var reservedSources = []string{index.SourceNode, index.SourceKubeAPIServer}

// track keeps reserved in step with p's claims.
func (a *ipcacheActor) track(p netip.Prefix, claims []index.IPCacheClaim) {
	for _, src := range reservedSources {
		has := slices.ContainsFunc(claims, func(c index.IPCacheClaim) bool { return c.Source == src })
		set := a.reserved[src]
		switch _, in := set[p]; {
		case has && !in:
			if set == nil {
				set = map[netip.Prefix]struct{}{}
				a.reserved[src] = set
			}
			set[p] = struct{}{}
		case !has && in:
			delete(set, p)
		}
	}
}

func newIPCacheActor(deps *endpointDeps, gateways []netip.Addr, ranges []netip.Prefix) *ipcacheActor {
	l := deps.log.With("actor", "ipcache")
	a := &ipcacheActor{deps: deps, gateways: gateways, ranges: ranges, log: l, owner: owner{batch: newBatcher(deps.writer, l)}}
	a.onStart = a.rebuild
	ops := reconcileOps[netip.Prefix]{update: a.update}
	if _, ok := deps.dp.(datapath.IPCacheSyncer); ok {
		ops.prune = a.prune
	}
	a.rec.init(&a.owner, deps, l, ops)
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
	a.rec.sync(ctx)
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
		a.rec.sync(ctx)
	case *messages.IPCacheHostAddr:
		a.hostAddr(ctx, msg)
	case *messages.IPCacheReservedSet:
		a.reservedSet(ctx, msg)
	case *messages.IPCacheRemote:
		a.remote(ctx, msg)
	case *messages.IPCachePrune:
		a.rec.resync()
		a.rec.sync(ctx)
	case *messages.IPCacheBarrier:
		// Answered once the datapath holds every change received before.
		if to, seq := ctx.Sender(), msg.Seq; to != nil {
			a.rec.barrier(func() { ctx.Send(to, &messages.IPCacheBarrierDone{Seq: seq}) })
		}
	case *crashForTest:
		panic("ipcache: crash requested by a test")
	}
}

// rebuild reads the table (empty at agent start), adds the gateways as
// the host and writes everything to the datapath.
func (a *ipcacheActor) rebuild(ctx actor.Context) {
	a.entries = map[netip.Prefix]*index.IPCacheEntry{}
	a.replacing = map[string]*remoteReplace{}
	a.reserved = map[string]map[netip.Prefix]struct{}{}
	a.lens = [2][129]int{}
	for _, e := range a.deps.ix.IPCache() {
		a.entries[e.Prefix] = e
		a.track(e.Prefix, e.Claims)
		a.rec.mark(e.Prefix)
		fam := 0
		if e.Prefix.Addr().Is6() {
			fam = 1
		}
		a.lens[fam][e.Prefix.Bits()]++
	}
	a.publishLens()
	for _, gw := range a.gateways {
		a.claim(ctx, netip.PrefixFrom(gw, gw.BitLen()), index.IPCacheClaim{Source: index.SourceReserved, Identity: identity.ReservedHost})
	}
	a.rec.sync(ctx)
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
	a.rec.sync(ctx)
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
	a.track(p, claims)
	if len(claims) == 0 {
		if old != nil {
			delete(a.entries, p)
			a.countLen(p, -1)
			a.batch.delKeyed(ctx, index.TableIPCache, p, old)
			a.rec.mark(p)
		}
		return
	}
	best := claims[0]
	for _, c := range claims[1:] {
		if r, br := sourceRank(c.Source), sourceRank(best.Source); r < br || (r == br && c.Origin < best.Origin) {
			best = c
		}
	}
	e := newIPCacheEntry(claims)
	e.Prefix, e.Identity, e.Source = p, best.Identity, best.Source
	if best.Source == index.SourceRemote {
		e.TunnelEndpoint = best.NodeIP
	}
	a.entries[p] = e
	if old == nil {
		a.countLen(p, 1)
	}
	a.batch.putKeyed(ctx, index.TableIPCache, p, e)
	if old == nil || old.Identity != e.Identity || old.TunnelEndpoint != e.TunnelEndpoint {
		a.rec.mark(p)
	}
}

// entryOneClaim is an ipcache entry and its only claim in one
// allocation (192 bytes, a size class, where two take 112 + 96): almost
// every prefix (a remote endpoint's above all) has one claim.
type entryOneClaim struct {
	e index.IPCacheEntry
	c [1]index.IPCacheClaim
}

// newIPCacheEntry returns an entry holding claims (never modified
// afterwards: an entry is immutable once in the index).
func newIPCacheEntry(claims []index.IPCacheClaim) *index.IPCacheEntry {
	if len(claims) != 1 {
		return &index.IPCacheEntry{Claims: claims}
	}
	x := &entryOneClaim{c: [1]index.IPCacheClaim{claims[0]}}
	x.e.Claims = x.c[:]
	return &x.e
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
	case index.SourceKubeAPIServer:
		return 2
	case index.SourceNode:
		return 3
	case index.SourceRemote:
		return 4
	case index.SourceCIDRPolicy:
		return 5
	}
	return 6
}

// reservedSet makes msg.Source's claims exactly msg.Addrs: the other
// nodes' addresses as remote-node, the API server's as kube-apiserver.
// Both rank below this node's endpoints and host addresses (an API
// server on this node stays host) and above other nodes' endpoint
// claims and policy CIDRs.
func (a *ipcacheActor) reservedSet(ctx actor.Context, msg *messages.IPCacheReservedSet) {
	var id identity.NumericIdentity
	switch msg.Source {
	case index.SourceNode:
		id = identity.ReservedRemoteNode
	case index.SourceKubeAPIServer:
		id = identity.ReservedKubeAPIServer
	default:
		a.log.Error("reserved address set of an unknown source ignored", "source", msg.Source)
		return
	}
	want := make(map[netip.Prefix]struct{}, len(msg.Addrs))
	for _, ip := range msg.Addrs {
		if ip = ip.Unmap(); ip.IsValid() {
			want[netip.PrefixFrom(ip, ip.BitLen())] = struct{}{}
		}
	}
	mine := func(c index.IPCacheClaim) bool { return c.Source == msg.Source }
	var gone []netip.Prefix
	for p := range a.reserved[msg.Source] {
		if _, keep := want[p]; !keep {
			gone = append(gone, p)
		}
	}
	for _, p := range gone {
		a.drop(ctx, p, mine)
	}
	for p := range want {
		pid := id
		if nid, ok := msg.Identities[p.Addr()]; ok {
			pid = nid
		}
		a.claim(ctx, p, index.IPCacheClaim{Source: msg.Source, Identity: pid})
	}
	a.rec.sync(ctx)
}

// update is the reconciler's job writing prefixes: each its entry's
// identity and tunnel endpoint, or deleted when it has no entry.
func (a *ipcacheActor) update(_ actor.Context, prefixes []netip.Prefix) reconcileJob {
	want := make([]datapath.IPCacheValue, len(prefixes)) // zero Identity: delete
	for i, p := range prefixes {
		if e := a.entries[p]; e != nil {
			want[i] = datapath.IPCacheValue{Identity: e.Identity, TunnelEndpoint: e.TunnelEndpoint}
		}
	}
	dp := a.deps.dp
	if b, ok := dp.(datapath.IPCacheBatcher); ok {
		changes := make([]datapath.IPCacheChange, len(prefixes))
		for i, p := range prefixes {
			changes[i] = datapath.IPCacheChange{Prefix: p, Value: want[i], Delete: want[i].Identity == identity.IdentityUnknown}
		}
		return reconcileJob{op: "ipcache", run: func(c context.Context) ([]error, error) {
			return b.ApplyIPCache(c, changes), nil
		}}
	}
	return reconcileJob{op: "ipcache", run: func(c context.Context) ([]error, error) {
		errs := make([]error, len(prefixes))
		for i, p := range prefixes {
			if want[i].Identity == identity.IdentityUnknown {
				errs[i] = dp.DeleteIPCache(c, p)
			} else {
				errs[i] = dp.UpsertIPCache(c, p, want[i].Identity, want[i].TunnelEndpoint)
			}
		}
		return errs, nil
	}}
}

// prune is the reconciler's full sync: the datapath's ipcache holds
// exactly the entries afterwards (IPCachePrune).
func (a *ipcacheActor) prune(actor.Context) reconcileJob {
	desired := make(map[netip.Prefix]datapath.IPCacheValue, len(a.entries))
	for p, e := range a.entries {
		desired[p] = datapath.IPCacheValue{Identity: e.Identity, TunnelEndpoint: e.TunnelEndpoint}
	}
	syncer := a.deps.dp.(datapath.IPCacheSyncer)
	var st datapath.IPCacheSyncStats // written by run; done reads it only once run returned
	return reconcileJob{op: "ipcache-prune",
		run: func(c context.Context) ([]error, error) {
			var err error
			st, err = syncer.SyncIPCache(c, desired)
			return nil, err
		},
		done: func(_ []error, err error) {
			if err == nil {
				a.log.Info("ipcache pruned", "entries", len(desired), "deleted", st.Deleted, "written", st.Written)
			}
		}}
}
