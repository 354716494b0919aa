package actors

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
)

// KindNodes is the nodes actor's kind (GET /v1/actors).
const KindNodes = "nodes"

// The nodes actor sorts after the other node-wide owners. (Set here, not
// in kindOrder's literal, to keep the cluster branches' merges apart.)
func init() { kindOrder[KindNodes] = kindOrder[KindGC] }

// nodesActor owns the remote nodes: the full set each source ("k8s",
// "kvstore", "file", ...) last reported, one index row per (source,
// node). The union (a node reported by several sources is taken from the
// source first by name) goes to the datapath's NodeRouter through the
// reconciler, as a full sync (SyncNodes takes the whole set): one in
// flight at a time, a failed one retried with backoff. A restart rebuilds
// from the table and syncs again (SyncNodes is idempotent).
type nodesActor struct {
	owner
	deps   *endpointDeps
	local  []netip.Prefix // this node's pod ranges: no remote node may claim them
	router datapath.NodeRouter
	log    *slog.Logger

	rows map[string]*index.Node // by Key(); immutable, shared with the index
	// heard is set by the first SyncNodes: until a source spoke, the
	// datapath keeps what a previous agent left (no route flap at start).
	heard bool
	// rec syncs the union whenever it changed (a full sync; it marks no
	// keys). It does nothing without a router.
	rec reconciler[string]
	// resyncEvery arms timer: a full sync every period, so routes the
	// kernel removed behind the agent's back (a link down and up again)
	// come back. gen tells a stale tick.
	resyncEvery time.Duration
	timer       *time.Timer
	gen         uint64
	// healthRefused holds the health endpoint addresses refused so far,
	// "source/node/address": each is logged and counted once while it
	// stays refused.
	healthRefused map[string]bool
}

// nodesResyncTick is the periodic full sync's timer message.
type nodesResyncTick struct{ gen uint64 }

func newNodesActor(deps *endpointDeps, local []netip.Prefix, resyncEvery time.Duration) *nodesActor {
	l := deps.log.With("actor", "nodes")
	router, _ := deps.dp.(datapath.NodeRouter)
	a := &nodesActor{deps: deps, local: local, router: router, log: l, owner: owner{batch: newBatcher(deps.writer, l)},
		resyncEvery: resyncEvery, healthRefused: map[string]bool{}}
	a.onStart = a.rebuild
	a.onStop = a.stopTimer
	var ops reconcileOps[string]
	if router != nil {
		ops.prune = a.syncAll
	}
	a.rec.init(&a.owner, deps, l, ops)
	return a
}

// Receive implements actor.Actor.
func (a *nodesActor) Receive(ctx actor.Context) {
	defer a.batch.flushOnPanic()
	if a.lifecycle(ctx) {
		return
	}
	switch msg := ctx.Message().(type) {
	case *messages.SyncNodes:
		a.replace(ctx, msg.Source, msg.Nodes)
		if !a.heard {
			a.heard = true
			a.rec.resync() // the first set is synced even if empty
		}
		a.batch.reply(ctx, ctx.Sender(), &messages.NodesResult{})
		a.rec.sync(ctx)
	case *nodesResyncTick:
		if msg.gen != a.gen {
			return
		}
		if a.heard {
			a.rec.resync()
			a.rec.sync(ctx)
		}
		a.arm(ctx)
	case *crashForTest:
		panic("nodes: crash requested by a test")
	}
}

// arm schedules the next periodic full sync (none without a router).
func (a *nodesActor) arm(ctx actor.Context) {
	a.stopTimer()
	if a.router == nil || a.resyncEvery <= 0 {
		return
	}
	a.gen++
	self, system, tick := ctx.Self(), ctx.ActorSystem(), &nodesResyncTick{gen: a.gen}
	a.timer = time.AfterFunc(a.resyncEvery, func() { system.Root.Send(self, tick) })
}

func (a *nodesActor) stopTimer() {
	if a.timer != nil {
		a.timer.Stop()
		a.timer = nil
	}
}

func (a *nodesActor) rebuild(ctx actor.Context) {
	a.rows = map[string]*index.Node{}
	for _, n := range a.deps.ix.Nodes() {
		a.rows[n.Key()] = n
	}
	// At agent start the table is empty: nothing is synced until a source
	// reports, so the routes a previous agent left keep working. After a
	// restart of this actor the table holds what the sources said.
	if a.heard = len(a.rows) > 0; a.heard {
		a.rec.resync()
		a.sendAddrs(ctx)
	}
	a.rec.sync(ctx)
	a.arm(ctx)
}

// validateNodes checks the source name and the set (in the caller's
// goroutine: the front door, not the actor).
func validateNodes(source string, nodes []datapath.RemoteNode) error {
	if source == "" || len(source) > 63 || strings.ContainsAny(source, "/ \t\n") {
		return fmt.Errorf("sync nodes: source %q: want 1-63 bytes without '/' or spaces: %w", source, ErrInvalidSource)
	}
	if err := datapath.CheckNodes(nodes); err != nil {
		return fmt.Errorf("sync nodes from %s: %w", source, err)
	}
	return nil
}

// replace makes source's rows the given set and recomputes which row of
// each node is active.
func (a *nodesActor) replace(ctx actor.Context, source string, nodes []datapath.RemoteNode) {
	want := make(map[string]*index.Node, len(nodes))
	refused := map[string]bool{}
	for _, n := range nodes {
		r := &index.Node{Source: source, Name: n.Name, Addrs: slices.Clone(n.Addrs), PodCIDRs: slices.Clone(n.PodCIDRs), Labels: maps.Clone(n.Labels)}
		r.HealthIPs = a.healthIPs(source, n, refused)
		want[r.Key()] = r
	}
	for k := range a.healthRefused {
		if strings.HasPrefix(k, source+"/") && !refused[k] {
			delete(a.healthRefused, k)
		}
	}
	for k, r := range a.rows {
		if r.Source == source && want[k] == nil {
			delete(a.rows, k)
			a.batch.delKeyed(ctx, index.TableNodes, k, r)
			a.rec.resync()
		}
	}
	for k, r := range want {
		old := a.rows[k]
		if old != nil && slices.Equal(old.Addrs, r.Addrs) && slices.Equal(old.PodCIDRs, r.PodCIDRs) && maps.Equal(old.Labels, r.Labels) {
			if !slices.Equal(old.HealthIPs, r.HealthIPs) {
				a.rows[k] = r // the ipcache's concern only (sendAddrs), not the router's
			}
			continue
		}
		a.rows[k] = r
		a.rec.resync()
	}
	a.activate(ctx)
	a.sendAddrs(ctx)
}

// healthIPs returns the health endpoint addresses of n that may enter the
// ipcache (endpoint.CheckHealthIPs against n's own pod CIDRs and this
// node's ranges); a refused one is logged and counted once while it stays
// refused, and its key set in refused.
func (a *nodesActor) healthIPs(source string, n datapath.RemoteNode, refused map[string]bool) []netip.Addr {
	if len(n.HealthIPs) == 0 {
		return nil
	}
	ok, bad := endpoint.CheckHealthIPs(&endpoint.OwnerNode{Name: n.Name, Addrs: n.Addrs, PodCIDRs: n.PodCIDRs}, n.HealthIPs, a.local)
	for ip, why := range bad {
		k := source + "/" + n.Name + "/" + ip.String()
		refused[k] = true
		if a.healthRefused[k] {
			continue
		}
		a.healthRefused[k] = true
		a.deps.counters.refusedHealth(source)
		a.log.Warn("node's health endpoint address refused: not entered into the ipcache", "source", source, "node", n.Name,
			"ip", ip, "reason", why.Reason, "detail", why.Detail)
	}
	return ok
}

// sendAddrs gives the ipcache the active nodes' addresses: identity
// remote-node (this node's own entries outrank them there).
func (a *nodesActor) sendAddrs(ctx actor.Context) {
	if a.deps.ipcache == nil {
		return
	}
	var addrs []netip.Addr
	for _, r := range a.rows {
		if r.Active {
			addrs = append(addrs, r.Addrs...)
		}
	}
	ids := map[netip.Addr]identity.NumericIdentity{}
	if a.deps.nodeSelectorLabels {
		ids = a.nodeIdentities(ctx)
	}
	// The nodes' health endpoints: identity health, as this node's own
	// (accepted in replace: inside their node's pod CIDRs).
	for _, r := range a.rows {
		if r.Active {
			for _, ip := range r.HealthIPs {
				addrs = append(addrs, ip)
				ids[ip] = identity.ReservedHealth
			}
		}
	}
	ctx.Send(a.deps.ipcache, &messages.IPCacheReservedSet{Source: index.SourceNode, Addrs: addrs, Identities: ids})
}

// activate marks, for every node name, the row of the source first by
// name active (and writes every row whose flag changed or is new).
func (a *nodesActor) activate(ctx actor.Context) {
	winner := map[string]string{} // name -> source
	for _, r := range a.rows {
		if s, ok := winner[r.Name]; !ok || r.Source < s {
			winner[r.Name] = r.Source
		}
	}
	for k, r := range a.rows {
		active := winner[r.Name] == r.Source
		if in, ok := a.indexed(k); ok && in == r && r.Active == active {
			continue
		}
		c := *r
		c.Active = active
		a.rows[k] = &c
		a.batch.putKeyed(ctx, index.TableNodes, k, &c)
	}
}

// indexed returns the row the index holds for key k.
func (a *nodesActor) indexed(k string) (*index.Node, bool) {
	o, err := a.deps.ix.ReadTxn().First(index.TableNodes, index.IndexID, k)
	if err != nil || o == nil {
		return nil, false
	}
	n, ok := o.(*index.Node)
	return n, ok
}

// union is what the datapath gets: the active rows, by name. Conflicts
// are resolved, with a warning: a node whose pod CIDR overlaps this
// node's own ranges is left out, and of two nodes whose pod CIDRs
// overlap, the one later by name.
func (a *nodesActor) union() []datapath.RemoteNode {
	var out []datapath.RemoteNode
	for _, r := range a.rows {
		if r.Active {
			out = append(out, datapath.RemoteNode{Name: r.Name, Addrs: r.Addrs, PodCIDRs: r.PodCIDRs})
		}
	}
	slices.SortFunc(out, func(x, y datapath.RemoteNode) int { return strings.Compare(x.Name, y.Name) })
	self := datapath.RemoteNode{PodCIDRs: a.local} // named "": never dropped
	for {
		x, y, ok := datapath.FirstOverlap(append(out, self))
		if !ok {
			return out
		}
		drop := max(x.Node, y.Node)
		a.log.Warn("node left out: its pod CIDR overlaps this node's or another node's", "node", drop, "cidrs", []netip.Prefix{x.Prefix, y.Prefix})
		out = slices.DeleteFunc(out, func(n datapath.RemoteNode) bool { return n.Name == drop })
	}
}

// syncAll is the reconciler's job: the router takes the union.
func (a *nodesActor) syncAll(actor.Context) reconcileJob {
	nodes, router := a.union(), a.router
	return reconcileJob{op: "sync-nodes",
		run: func(c context.Context) ([]error, error) { return nil, router.SyncNodes(c, nodes) },
		done: func(_ []error, err error) {
			if err == nil {
				a.log.Debug("nodes synced", "nodes", len(nodes))
			}
		}}
}
