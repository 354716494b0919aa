package kvstore

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// Source is the name the mirror gives the agent for what it feeds.
const Source = "kvstore"

// RemoteSink takes other nodes' endpoints into the ipcache
// (*actors.System's front door once the remote-endpoint methods exist).
type RemoteSink interface {
	ReplaceRemoteEndpoints(ctx context.Context, source string, eps []endpoint.Remote) error
	// ChangeRemoteEndpoints deletes dels, then upserts ups, in one pass of
	// the ipcache (an address is never in both).
	ChangeRemoteEndpoints(ctx context.Context, source string, ups []endpoint.Remote, dels []netip.Addr) error
}

// NodeSink takes the full set of other nodes (*actors.System's SyncNodes).
type NodeSink interface {
	SyncNodes(ctx context.Context, source string, nodes []datapath.RemoteNode) error
}

// Mirror watches every other node's endpoints and node entry and feeds
// them to the agent: the full set after each (re-)list, changes in
// between. The watches never wait for the agent: they record each change
// and queue its addresses (Backlog), and one goroutine hands the queued
// addresses' latest state to the agent in batches, so a burst of changes
// to one address costs one update and an agent that cannot keep up falls
// visibly behind (Stats) instead of holding up the watch. A node whose
// lease expired loses its keys, and so its endpoints and routes. A
// failed hand-over is retried as a full replacement. An address claimed
// by two nodes' endpoints (a pod moved and the old node has not withdrawn
// it yet) goes to the latest claim: the record written last (its etcd
// ModRevision; in one transaction, the greater key), however the mirror
// learnt of them (in a watch, a re-list, or accepted later when their
// node's record arrived); when that one goes, the latest of the others
// takes it back.
//
// An endpoint record is believed only as a claim of the node its key
// names (state/endpoints/v1/<node>/...; the record's node must agree),
// while that node's record is known, holds every claimed address in its
// pod CIDRs and lists the claimed node address, and its identity is not
// a reserved one (endpoint.Remote.CheckOwner). A refused record is kept,
// logged once per reason and counted, and checked again when its node's
// record changes: a record that arrives before its node is accepted when
// the node appears.
// etcd itself holds no per-node authority: any agent with the
// cluster's etcd credentials can write any node's keys.
type Mirror struct {
	c     *Client
	eps   RemoteSink
	nodes NodeSink
	self  string
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
	kick  chan struct{}
	// nodeKick wakes the node loop, the only caller of the node sink.
	nodeKick chan struct{}

	// mu guards everything below. Neither sink is called with mu held:
	// the node sink only by the node loop, with the node set when it was
	// taken (a later change makes another hand-over due), the endpoint
	// sink only by the send loop, with each address's state when it was
	// taken (a later change is queued again and sent after). The watches
	// therefore never wait for the agent.
	//
	// An endpoint is named by its record key: its etcd key less the
	// endpoints prefix, "<node>/<id>" (recKey). The per-endpoint state is
	// a record key, one heldRecord and the address's owner (heap per
	// remote endpoint is a target: docs/scale.md).
	mu   sync.Mutex
	recs map[string]*heldRecord // record key -> record (refused ones too)
	// byNode holds the record keys of m.recs by their key's node: a node
	// record's change checks its node's records only.
	byNode map[string]map[string]struct{}
	// owners maps an address to the latest accepted record key claiming
	// it (claimBefore); contested holds, for the few addresses that more
	// than one accepted record claims, the earlier claims, oldest first
	// (never the owner's key, never an empty list).
	owners    map[netip.Addr]string
	contested map[netip.Addr][]string
	nodeRecs  map[string]nodeRecord
	// refused holds, per refused record key, the reason (one of
	// endpoint.Refused*) last logged; refusals counts refusals by reason
	// (each record once per reason it was refused for).
	refused  map[string]string
	refusals map[string]uint64
	epStale  bool // the sink missed something: replace everything
	nodeSent bool // the node set was handed over since it last changed
	// nodeGen counts the node set's changes: a hand-over of an earlier
	// one leaves nodeSent false.
	nodeGen uint64
	// pending names the addresses whose latest state the sink has not
	// taken yet: the send loop hands each one's state at that moment
	// (its latest claim, or a deletion), so any number of changes to one
	// address cost one update. It is bounded by the addresses the other
	// nodes' pod CIDRs hold, never by the rate of changes.
	pending map[netip.Addr]struct{}
	// pendingSince is when the oldest change not yet handed over arrived
	// (zero: none): the first change pending, or the one that made the
	// endpoints stale; inFlightSince is the oldest change of the hand-over
	// in flight (zero: none).
	pendingSince, inFlightSince time.Time
	// inFlight counts the addresses of the hand-over in flight.
	inFlight     int
	backlog      backlogStats
	behindLogged bool // "behind" was logged and "caught up" not yet
	synced       [2]bool
	lastErr      error
	// firstSync is closed once both prefixes were listed and the sinks
	// took the full set (FirstSync); fullSynced says it is.
	firstSync  chan struct{}
	fullSynced bool
}

// StartMirror starts watching; nil sinks are skipped.
func StartMirror(c *Client, eps RemoteSink, nodes NodeSink) *Mirror {
	m := newMirror(c, eps, nodes)
	ctx := m.ctx
	m.wg.Add(4)
	go func() { defer m.wg.Done(); c.listWatch(ctx, c.keys.endpoints(), (*epLister)(m)) }()
	go func() { defer m.wg.Done(); c.listWatch(ctx, c.keys.nodes(), (*nodeLister)(m)) }()
	go func() { defer m.wg.Done(); m.sendLoop() }()
	go func() { defer m.wg.Done(); m.nodeLoop() }()
	return m
}

// newMirror returns a Mirror that watches nothing yet.
func newMirror(c *Client, eps RemoteSink, nodes NodeSink) *Mirror {
	ctx, stop := context.WithCancel(c.ctx)
	return &Mirror{c: c, eps: eps, nodes: nodes, self: c.cfg.NodeName, ctx: ctx, stop: stop, kick: make(chan struct{}, 1),
		nodeKick: make(chan struct{}, 1), recs: map[string]*heldRecord{}, byNode: map[string]map[string]struct{}{}, owners: map[netip.Addr]string{}, contested: map[netip.Addr][]string{}, nodeRecs: map[string]nodeRecord{},
		refused: map[string]string{}, refusals: map[string]uint64{}, firstSync: make(chan struct{}), pending: map[netip.Addr]struct{}{}}
}

// Stop stops watching.
func (m *Mirror) Stop() {
	m.stop()
	m.wg.Wait()
}

// FirstSync is closed once the mirror first handed the agent every other
// node's endpoints and nodes as listed from etcd (both prefixes listed,
// every hand-over since taken). Until then the kernel's ipcache still
// holds what an earlier agent wrote for those endpoints, which a prune
// must not take away (the agent prunes after this).
func (m *Mirror) FirstSync() <-chan struct{} { return m.firstSync }

// checkSyncedLocked closes firstSync once the sinks hold the full set.
func (m *Mirror) checkSyncedLocked() {
	if m.fullSynced || !m.synced[0] || !m.synced[1] || m.epStale || !m.nodeSent {
		return
	}
	m.fullSynced = true
	close(m.firstSync)
}

// MirrorStats is what a Mirror knows.
type MirrorStats struct {
	// RemoteEndpoints counts the other nodes' endpoint records, refused
	// ones included.
	RemoteEndpoints, RemoteNodes int
	Synced                       bool
	LastError                    string
	// Refused counts the refused endpoint records by reason (one of
	// endpoint.Refused*), each record once per reason.
	Refused map[string]uint64
	// Backlog is what the agent has not taken yet of what etcd said.
	Backlog Backlog
}

// Backlog is how far the agent is behind the other nodes' endpoints in
// etcd: changes the mirror holds that the ipcache has not taken yet. The
// watch never waits for the agent: changes are queued per address (the
// latest one wins) and handed over in batches by one goroutine, so a
// slow or stalled agent shows here instead of in etcd's buffers, and
// never holds up anything else.
type Backlog struct {
	// Pending counts the addresses whose latest change waits, or is being
	// handed over; Stale says a full replacement is due (after a re-list
	// or a failed hand-over), which covers every address.
	Pending int
	Stale   bool
	// Behind is the age of the oldest change not yet taken (0: caught
	// up); MaxBehind and MaxPending are the largest seen since start.
	Behind, MaxBehind time.Duration
	MaxPending        int
	// Applied counts address changes handed over (a full replacement
	// counts every address), Coalesced the changes that were replaced by
	// a later change to the same address (or by a full replacement due)
	// before they were handed over, Batches the hand-overs, Overflows the
	// times the queue reached its bound (65,536 addresses) and was replaced
	// by a full replacement due.
	Applied, Coalesced, Batches, Overflows uint64
}

// maxPending bounds the addresses queued one by one (a variable for
// tests): beyond it the queue is dropped and a full replacement made due
// instead, which covers every address at the cost of one pass over the
// full set; the queue's memory stays bounded whatever the churn.
var maxPending = 1 << 16

// handOverTimeout bounds one hand-over to the agent. Nothing waits for
// it but the send loop, and a failed one costs a full replacement, so it
// is generous: a busy agent takes its time rather than getting the
// larger replacement.
const handOverTimeout = time.Minute

// BehindThreshold is the age of the oldest change not yet taken from
// which the agent reports itself behind (GET /v1/status kvstore.behind,
// an event, the membrane_remote_updates_behind_seconds metric says how
// far at any time).
const BehindThreshold = 5 * time.Second

// backlogStats are Backlog's counters (under Mirror.mu).
type backlogStats struct {
	maxBehind                   time.Duration
	maxPending                  int
	applied, coalesced, batches uint64
	overflows                   uint64
}

// Stats returns what the mirror knows.
func (m *Mirror) Stats() MirrorStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := MirrorStats{RemoteEndpoints: len(m.recs), RemoteNodes: len(m.nodeRecs), Synced: m.synced[0] && m.synced[1],
		Refused: maps.Clone(m.refusals), Backlog: m.backlogLocked(time.Now())}
	if m.lastErr != nil {
		st.LastError = m.lastErr.Error()
	}
	return st
}

// backlogLocked is the backlog at now.
func (m *Mirror) backlogLocked(now time.Time) Backlog {
	b := m.backlog
	out := Backlog{Pending: len(m.pending) + m.inFlight, Stale: m.epStale, MaxBehind: b.maxBehind, MaxPending: b.maxPending,
		Applied: b.applied, Coalesced: b.coalesced, Batches: b.batches, Overflows: b.overflows}
	if since := m.oldestLocked(); !since.IsZero() {
		out.Behind = max(now.Sub(since), 0)
		out.MaxBehind = max(out.MaxBehind, out.Behind)
	}
	return out
}

// oldestLocked is when the oldest change not yet taken arrived (zero:
// none).
func (m *Mirror) oldestLocked() time.Time {
	switch {
	case m.inFlightSince.IsZero():
		return m.pendingSince
	case m.pendingSince.IsZero() || m.inFlightSince.Before(m.pendingSince):
		return m.inFlightSince
	}
	return m.pendingSince
}

func (m *Mirror) poke() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// sendLoop is the only caller of the endpoint sink: it hands the
// pending changes over (or the full set, when a replacement is due),
// one batch after the other, and retries a failed hand-over, as a full
// replacement, with backoff. The watches only mark what changed, so
// they keep reading etcd however slow the agent is.
func (m *Mirror) sendLoop() { m.handOverLoop(m.kick, m.send) }

// handOverLoop runs step whenever kick fires, again while it says more
// arrived, and after a failure (done false) with backoff (100 ms to 5 s),
// until the mirror stops.
func (m *Mirror) handOverLoop(kick <-chan struct{}, step func() (done, more bool)) {
	backoff := 100 * time.Millisecond
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-kick:
		}
		for {
			done, more := step()
			if !done {
				if !sleep(m.ctx, backoff) {
					return
				}
				backoff = min(2*backoff, 5*time.Second)
				continue
			}
			backoff = 100 * time.Millisecond
			if !more || m.ctx.Err() != nil {
				break
			}
		}
	}
}

// send makes one hand-over: the full endpoint set if a replacement is
// due, else the pending changes. done
// is false when the sink failed (retry later); more when changes arrived
// meanwhile.
func (m *Mirror) send() (done, more bool) {
	m.mu.Lock()
	if m.eps == nil {
		m.checkSyncedLocked()
		m.mu.Unlock()
		return true, false
	}
	var all, ups []endpoint.Remote
	var dels []netip.Addr
	// Taken now: a change meanwhile is queued again, and a list meanwhile
	// makes another replacement due.
	replace, n := m.epStale, 0
	m.epStale = false
	if replace {
		all = m.allLocked()
		n = len(all)
	} else {
		ups, dels = m.takePendingLocked()
		n = len(ups) + len(dels)
		m.traceTaken(ups, time.Now())
	}
	m.inFlightSince, m.pendingSince = m.oldestLocked(), time.Time{}
	m.inFlight = len(m.pending)
	if replace {
		m.inFlight = len(m.owners)
	}
	clear(m.pending)
	m.mu.Unlock()

	var err error
	if n > 0 || replace {
		ctx, cancel := context.WithTimeout(m.ctx, handOverTimeout)
		if replace {
			err = m.eps.ReplaceRemoteEndpoints(ctx, Source, all)
		} else {
			err = m.deliver(ctx, ups, dels)
		}
		cancel()
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	if !m.inFlightSince.IsZero() {
		m.backlog.maxBehind = max(m.backlog.maxBehind, now.Sub(m.inFlightSince))
	}
	since := m.inFlightSince
	m.inFlightSince, m.inFlight = time.Time{}, 0
	if err != nil {
		// Whatever was in flight is covered by the replacement now due.
		m.epStale = true
		if m.pendingSince.IsZero() || (!since.IsZero() && since.Before(m.pendingSince)) {
			m.pendingSince = cmp.Or(since, now)
		}
		m.failLocked(err)
		return false, true
	}
	if n > 0 || replace {
		m.backlog.batches++
		m.backlog.applied += uint64(m.addrCount(ups, dels, all))
	}
	m.checkSyncedLocked()
	m.logBehindLocked(now)
	return true, len(m.pending) > 0 || m.epStale
}

// logBehindLocked logs once when the agent falls BehindThreshold behind
// and once when it caught up again.
func (m *Mirror) logBehindLocked(now time.Time) {
	b := m.backlogLocked(now)
	switch {
	case !m.behindLogged && b.Behind >= BehindThreshold:
		m.behindLogged = true
		m.c.log.Warn("other nodes' endpoint changes are queued: this node's ipcache is behind etcd", "pending", b.Pending, "behind", b.Behind.Round(time.Millisecond))
	case m.behindLogged && b.Pending == 0 && !b.Stale:
		m.behindLogged = false
		m.c.log.Info("other nodes' endpoint changes caught up", "max-behind", b.MaxBehind.Round(time.Millisecond), "coalesced", b.Coalesced)
	}
}

// deliver hands deletions and upserts to the sink in one call: one pass
// of the ipcache and one index transaction, not one each after the other.
func (m *Mirror) deliver(ctx context.Context, ups []endpoint.Remote, dels []netip.Addr) error {
	return m.eps.ChangeRemoteEndpoints(ctx, Source, ups, dels)
}

// addrCount counts the addresses of a hand-over.
func (m *Mirror) addrCount(ups []endpoint.Remote, dels []netip.Addr, all []endpoint.Remote) int {
	n := len(dels)
	for _, list := range [][]endpoint.Remote{ups, all} {
		for i := range list {
			n += len(list[i].IPs)
		}
	}
	return n
}

// markLocked queues the addresses of a change for the send loop.
func (m *Mirror) markLocked(ups []endpoint.Remote, dels []netip.Addr) {
	if m.eps == nil || (len(ups) == 0 && len(dels) == 0) {
		return
	}
	mark := func(ip netip.Addr) {
		if _, ok := m.pending[ip]; ok || m.epStale {
			m.backlog.coalesced++ // a full replacement covers it too
			return
		}
		m.pending[ip] = struct{}{}
	}
	for _, ip := range dels {
		mark(ip)
	}
	for i := range ups {
		for _, ip := range ups[i].IPs {
			mark(ip)
		}
	}
	if m.pendingSince.IsZero() {
		m.pendingSince = time.Now()
	}
	m.backlog.maxPending = max(m.backlog.maxPending, len(m.pending)+m.inFlight)
	if len(m.pending) > maxPending {
		m.c.log.Warn("too many remote endpoint changes queued: the next hand-over replaces the full set", "pending", len(m.pending), "max", maxPending)
		clear(m.pending)
		m.epStale = true
		m.backlog.overflows++
	}
	m.poke()
}

// takePendingLocked turns the pending addresses into what the sink gets:
// each one's latest claim (the addresses of one record together), or
// its deletion.
func (m *Mirror) takePendingLocked() ([]endpoint.Remote, []netip.Addr) {
	var dels []netip.Addr
	byKey := map[string][]netip.Addr{}
	for ip := range m.pending {
		k, ok := m.owners[ip]
		if !ok {
			dels = append(dels, ip)
			continue
		}
		byKey[k] = append(byKey[k], ip)
	}
	return m.remotesLocked(byKey), dels
}

// remotesLocked makes the remote endpoints of byKey (record key ->
// the addresses of it to hand over).
func (m *Mirror) remotesLocked(byKey map[string][]netip.Addr) []endpoint.Remote {
	out := make([]endpoint.Remote, 0, len(byKey))
	for k, ips := range byKey {
		r := m.recs[k].remote()
		slices.SortFunc(ips, func(a, b netip.Addr) int { return a.Compare(b) })
		r.IPs = ips
		out = append(out, r)
	}
	return out
}

// ownKey reports whether record key key is under this node (its own
// endpoints are local, not remote).
func (m *Mirror) ownKey(key string) bool {
	return strings.HasPrefix(key, m.self) && strings.HasPrefix(key[len(m.self):], "/")
}

// recKey is the record key of etcd key k (under the endpoints prefix,
// which the watch guarantees): "<node>/<id>", its own allocation.
func (m *Mirror) recKey(k []byte) string {
	return string(k[min(len(k), len(m.c.keys.endpoints())):])
}

// etcdKey is record key key's etcd key (for logs).
func (m *Mirror) etcdKey(key string) string { return m.c.keys.endpoints() + key }

// recNode is the <node> of record key key ("" when it has none).
func recNode(key string) string {
	node, _, ok := strings.Cut(key, "/")
	if !ok {
		return ""
	}
	return node
}

// fail records a sink failure and schedules a full hand-over.
func (m *Mirror) failLocked(err error) {
	m.lastErr = err
	m.c.log.Warn("handing kvstore state to the agent failed; retrying", "err", err)
	m.poke()
}

// epLister receives the endpoints prefix.
type epLister Mirror

func (l *epLister) list(kvs []*mvccpb.KeyValue) {
	m := (*Mirror)(l)
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.recs)
	clear(m.byNode)
	clear(m.owners)
	clear(m.contested)
	prev := m.refused // keeps the reasons logged: a relist logs no refusal again
	m.refused = map[string]string{}
	for _, kv := range kvs {
		key := m.recKey(kv.Key)
		if r, ok := prev[key]; ok {
			m.refused[key] = r
		}
		m.putLocked(key, kv.Value, kv.ModRevision)
	}
	m.synced[0] = true
	m.replaceLocked()
	m.checkSyncedLocked()
}

func (l *epLister) events(evs []*clientv3.Event) {
	m := (*Mirror)(l)
	got := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	// Each address's last change wins: a response may carry an endpoint's
	// creation and its deletion, which must not reach the agent as a
	// delete followed by an upsert.
	final := finalChanges{}
	for _, ev := range evs {
		key := m.recKey(ev.Kv.Key)
		if m.ownKey(key) {
			continue
		}
		if ev.Type == clientv3.EventTypeDelete {
			final.add(m.deleteLocked(key))
		} else {
			final.add(m.putLocked(key, ev.Kv.Value, ev.Kv.ModRevision))
		}
	}
	m.sendLocked(final)
	m.traceReceived(final, got)
}

// finalChanges are each address's last change (nil: delete).
type finalChanges map[netip.Addr]*endpoint.Remote

// add records upserts and deletions as each address's last change.
func (final finalChanges) add(u []endpoint.Remote, d []netip.Addr) {
	for _, ip := range d {
		final[ip] = nil
	}
	for i := range u {
		for _, ip := range u[i].IPs {
			final[ip] = &u[i]
		}
	}
}

// sendLocked queues each address's last change for the send loop.
func (m *Mirror) sendLocked(final finalChanges) {
	ups, dels := splitFinal(final)
	m.markLocked(ups, dels)
}

// splitFinal turns each address's last change into the deletions and the
// upserts (addresses of one record together) the agent gets.
func splitFinal(final finalChanges) ([]endpoint.Remote, []netip.Addr) {
	var dels []netip.Addr
	byRec := map[*endpoint.Remote][]netip.Addr{}
	var recs []*endpoint.Remote
	for ip, r := range final {
		if r == nil {
			dels = append(dels, ip)
			continue
		}
		if _, ok := byRec[r]; !ok {
			recs = append(recs, r)
		}
		byRec[r] = append(byRec[r], ip)
	}
	ups := make([]endpoint.Remote, 0, len(recs))
	for _, r := range recs {
		u := *r
		u.IPs = byRec[r]
		slices.SortFunc(u.IPs, func(a, b netip.Addr) int { return a.Compare(b) })
		ups = append(ups, u)
	}
	return ups, dels
}

// putLocked records key's endpoint, written at revision rev; it returns
// what the sink must upsert and delete.
func (m *Mirror) putLocked(key string, v []byte, rev int64) ([]endpoint.Remote, []netip.Addr) {
	if m.ownKey(key) {
		return nil, nil
	}
	dec, err := decodeEndpoint(v)
	if err != nil {
		m.c.log.Warn("unreadable endpoint record ignored", "key", m.etcdKey(key), "err", err)
		return m.deleteLocked(key)
	}
	rec := hold(key, dec, rev)
	var ups []endpoint.Remote
	var dels []netip.Addr
	_, wasRefused := m.refused[key]
	accepted := m.checkLocked(key, rec, false)
	if old, ok := m.recs[key]; ok && !wasRefused && accepted && rec.sameAs(old) && m.ownsAllLocked(key, old) {
		// Written again as it was (its node writing everything again under
		// a new lease): the agent holds it already. The later revision only
		// makes its claims later, and they are all the latest already.
		old.rev = rec.rev
		return nil, nil
	}
	if old, ok := m.recs[key]; ok && !wasRefused { // addresses the endpoint no longer claims
		for _, ip := range old.ips {
			if !accepted || !slices.Contains(rec.ips, ip) {
				u, d := m.disownLocked(ip, key)
				ups, dels = append(ups, u...), append(dels, d...)
			}
		}
	}
	m.setRecLocked(key, rec)
	if !accepted {
		return ups, dels
	}
	return append(ups, m.ownLocked(key, rec)...), dels
}

// ownsAllLocked reports whether key's accepted record rec is the
// latest claim of each of its addresses.
func (m *Mirror) ownsAllLocked(key string, rec *heldRecord) bool {
	for _, ip := range rec.ips {
		if m.owners[ip] != key {
			return false
		}
	}
	return true
}

// claimBefore reports whether record key a's claim is earlier than b's:
// written at an earlier revision, or at the same one (one transaction)
// under a smaller key. Both must be in m.recs.
func (m *Mirror) claimBefore(a, b string) bool {
	ra, rb := m.recs[a].rev, m.recs[b].rev
	return ra < rb || ra == rb && a < b
}

// ownLocked adds key's accepted record rec (in m.recs) as a claim of each
// of its addresses, in the order of the claims' revisions: the addresses
// where it is the latest claim are its; it returns them as the upsert
// the sink needs (none: nothing).
func (m *Mirror) ownLocked(key string, rec *heldRecord) []endpoint.Remote {
	var owned []netip.Addr
	for _, ip := range rec.ips {
		cur, ok := m.owners[ip]
		switch {
		case !ok || cur == key:
		case m.claimBefore(cur, key):
			m.uncontestLocked(ip, key)
			m.contestLocked(ip, cur)
		default: // a later claim owns it: key's is an earlier one
			m.uncontestLocked(ip, key)
			m.contestLocked(ip, key)
			continue
		}
		m.owners[ip] = key // this string: the record's node shares it
		owned = append(owned, ip)
	}
	if len(owned) == 0 {
		return nil
	}
	r := rec.remote()
	if len(owned) < len(rec.ips) {
		r.IPs = owned
	}
	return []endpoint.Remote{r}
}

// contestLocked adds key (not ip's owner) to ip's earlier claims, in
// order.
func (m *Mirror) contestLocked(ip netip.Addr, key string) {
	o := m.contested[ip]
	i := len(o)
	for i > 0 && m.claimBefore(key, o[i-1]) {
		i--
	}
	m.contested[ip] = slices.Insert(o, i, key)
}

// uncontestLocked removes key from ip's earlier claims.
func (m *Mirror) uncontestLocked(ip netip.Addr, key string) {
	o, ok := m.contested[ip]
	if !ok {
		return
	}
	if o = slices.DeleteFunc(o, func(k string) bool { return k == key }); len(o) == 0 {
		delete(m.contested, ip)
	} else {
		m.contested[ip] = o
	}
}

// checkLocked checks key's record against the node its key names and
// records the verdict in m.refused; a refusal for a new reason is logged
// and counted, except (pending, with reason "") a record whose node is
// not known while the nodes are not listed yet or, with withdrawn, whose
// node went away. True when accepted.
func (m *Mirror) checkLocked(key string, rec *heldRecord, withdrawn bool) bool {
	owner := recNode(key)
	var node *endpoint.OwnerNode
	if n, ok := m.nodeRecs[m.c.keys.node(owner)]; ok && owner != "" {
		node = &endpoint.OwnerNode{Name: n.Name, Addrs: n.Addrs, PodCIDRs: n.PodCIDRs}
	}
	r := rec.remote()
	if r.Node == "" {
		r.Node = owner // an unnamed record is its key's node's
	}
	err := r.CheckOwner(owner, node)
	prev, wasRefused := m.refused[key]
	var re *endpoint.RefusedError
	if !errors.As(err, &re) {
		if wasRefused {
			delete(m.refused, key)
			if prev != "" {
				m.c.log.Info("remote endpoint accepted", "key", m.etcdKey(key), "node", owner, "refused-before", prev)
			}
		}
		return true
	}
	if re.Reason == endpoint.RefusedUnknownNode && (!m.synced[1] || withdrawn) {
		m.refused[key] = "" // pending: no node to check against yet, or any more
		return false
	}
	m.refused[key] = re.Reason
	if re.Reason != prev {
		m.refusals[re.Reason]++
		m.c.log.Log(context.Background(), endpoint.RefusalLevel(re.Reason), "remote endpoint refused", "key", m.etcdKey(key), "node", owner, "reason", re.Reason, "detail", re.Detail)
	}
	return false
}

// recheckNodeLocked checks the records of node again after its node
// record changed, and hands what changed to the sink.
func (m *Mirror) recheckNodeLocked(node string) {
	final := finalChanges{}
	withdrawn := 0
	for key := range m.byNode[node] {
		rec := m.recs[key]
		_, was := m.refused[key]
		now := m.checkLocked(key, rec, !was)
		if !now && !was && m.refused[key] == "" {
			withdrawn++
		}
		switch {
		case now && was:
			final.add(m.ownLocked(key, rec), nil)
		case !now && !was:
			for _, ip := range rec.ips {
				final.add(m.disownLocked(ip, key))
			}
		}
	}
	if withdrawn > 0 {
		m.c.log.Info("node record gone: its endpoints withdrawn", "node", node, "endpoints", withdrawn)
	}
	if len(final) > 0 {
		m.sendLocked(final)
	}
}

// deleteLocked forgets key's endpoint.
func (m *Mirror) deleteLocked(key string) ([]endpoint.Remote, []netip.Addr) {
	rec, ok := m.recs[key]
	if !ok {
		return nil, nil
	}
	m.delRecLocked(key)
	if _, refused := m.refused[key]; refused {
		delete(m.refused, key)
		return nil, nil
	}
	var ups []endpoint.Remote
	var dels []netip.Addr
	for _, ip := range rec.ips {
		u, d := m.disownLocked(ip, key)
		ups, dels = append(ups, u...), append(dels, d...)
	}
	return ups, dels
}

// disownLocked removes key's claim on ip: the address is deleted, or
// handed to the latest remaining claim.
func (m *Mirror) disownLocked(ip netip.Addr, key string) ([]endpoint.Remote, []netip.Addr) {
	cur, ok := m.owners[ip]
	if ok && cur == key {
		o := m.contested[ip]
		if len(o) == 0 {
			ok = false
			delete(m.owners, ip)
		} else {
			cur = o[len(o)-1]
			m.owners[ip] = cur
			if o = o[:len(o)-1]; len(o) == 0 {
				delete(m.contested, ip)
			} else {
				m.contested[ip] = o
			}
		}
	} else {
		m.uncontestLocked(ip, key)
	}
	if !ok {
		return nil, []netip.Addr{ip}
	}
	r := m.recs[cur].remote()
	r.IPs = []netip.Addr{ip}
	return []endpoint.Remote{r}, nil
}

// replaceLocked makes a full replacement due (after a list): the send
// loop hands the full set over, which covers every pending change.
func (m *Mirror) replaceLocked() {
	if m.eps == nil {
		return
	}
	if !m.epStale && m.pendingSince.IsZero() {
		m.pendingSince = time.Now()
	}
	m.epStale = true
	m.poke()
}

// allLocked is the full set (each address with its latest claim).
func (m *Mirror) allLocked() []endpoint.Remote {
	byKey := map[string][]netip.Addr{}
	for ip, k := range m.owners {
		byKey[k] = append(byKey[k], ip)
	}
	return m.remotesLocked(byKey)
}

// nodeLister receives the nodes prefix.
type nodeLister Mirror

func (l *nodeLister) list(kvs []*mvccpb.KeyValue) {
	m := (*Mirror)(l)
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.nodeRecs)
	for _, kv := range kvs {
		m.putNodeLocked(string(kv.Key), kv.Value)
	}
	m.synced[1] = true
	m.nodesChangedLocked()
	for n := range m.byNode {
		m.recheckNodeLocked(n)
	}
	m.checkSyncedLocked()
}

func (l *nodeLister) events(evs []*clientv3.Event) {
	m := (*Mirror)(l)
	m.mu.Lock()
	defer m.mu.Unlock()
	// A record written again as it was (a node writing everything again
	// under a new lease, its agent restarted) changes nothing: no
	// hand-over, no check of its endpoints.
	changed := map[string]struct{}{}
	for _, ev := range evs {
		key := string(ev.Kv.Key)
		was, existed := m.nodeRecs[key]
		if ev.Type == clientv3.EventTypeDelete {
			delete(m.nodeRecs, key)
		} else {
			m.putNodeLocked(key, ev.Kv.Value)
		}
		now, exists := m.nodeRecs[key]
		if existed != exists || (exists && !now.equal(was)) {
			changed[strings.TrimPrefix(key, m.c.keys.nodes())] = struct{}{}
		}
	}
	if len(changed) == 0 {
		return
	}
	m.nodesChangedLocked()
	for n := range changed {
		m.recheckNodeLocked(n)
	}
}

func (m *Mirror) putNodeLocked(key string, v []byte) {
	rec, err := decodeNode(v)
	if err != nil || key != m.c.keys.node(rec.Name) {
		m.c.log.Warn("unreadable node record ignored", "key", key, "err", err)
		delete(m.nodeRecs, key)
		return
	}
	if rec.Name == m.self {
		return
	}
	m.nodeRecs[key] = rec
}

// setRecLocked holds rec as record key's.
func (m *Mirror) setRecLocked(key string, rec *heldRecord) {
	if _, ok := m.recs[key]; !ok {
		node := recNode(key)
		keys := m.byNode[node]
		if keys == nil {
			keys = map[string]struct{}{}
			m.byNode[node] = keys
		}
		keys[key] = struct{}{}
	}
	m.recs[key] = rec
}

// delRecLocked forgets record key's record.
func (m *Mirror) delRecLocked(key string) {
	delete(m.recs, key)
	node := recNode(key)
	if keys := m.byNode[node]; keys != nil {
		if delete(keys, key); len(keys) == 0 {
			delete(m.byNode, node)
		}
	}
}

// nodesChangedLocked makes a hand-over of the node set due (the node
// loop's).
func (m *Mirror) nodesChangedLocked() {
	m.nodeGen++
	if m.nodes == nil {
		m.nodeSent = true
		return
	}
	m.nodeSent = false
	select {
	case m.nodeKick <- struct{}{}:
	default:
	}
}

// nodeLoop is the only caller of the node sink: it hands the node set
// over whenever it changed (the latest set: changes meanwhile cost one
// hand-over), and retries a failed hand-over with backoff. The node
// watch only records the change, so it never waits for the agent, and
// neither does the endpoint watch (the mirror's lock is not held).
func (m *Mirror) nodeLoop() { m.handOverLoop(m.nodeKick, m.sendNodes) }

// sendNodes hands the node set over if due; ok is false when the sink
// failed (retry later), more when the set changed meanwhile.
func (m *Mirror) sendNodes() (ok, more bool) {
	m.mu.Lock()
	if m.nodeSent || m.nodes == nil {
		m.mu.Unlock()
		return true, false
	}
	gen := m.nodeGen
	all := make([]datapath.RemoteNode, 0, len(m.nodeRecs))
	for _, r := range m.nodeRecs {
		all = append(all, r.remoteNode())
	}
	m.mu.Unlock()
	slices.SortFunc(all, func(a, b datapath.RemoteNode) int { return strings.Compare(a.Name, b.Name) })
	ctx, cancel := context.WithTimeout(m.ctx, m.c.cfg.RequestTimeout)
	err := m.nodes.SyncNodes(ctx, Source, all)
	cancel()

	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		m.lastErr = err
		m.c.log.Warn("handing the node set to the agent failed; retrying", "err", err)
		return false, true
	}
	if m.nodeGen != gen {
		return true, true
	}
	m.nodeSent = true
	m.checkSyncedLocked()
	return true, false
}
