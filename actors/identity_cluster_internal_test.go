package actors

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// memBackend is an in-memory identity.ClusterBackend for the actor
// tests: one store, counted calls, an optional gate that holds Acquire
// and an optional failure.
type memBackend struct {
	mu       sync.Mutex
	byKey    map[string]identity.NumericIdentity
	byID     map[identity.NumericIdentity]labels.Labels
	next     identity.NumericIdentity
	acquires map[string]int
	releases map[identity.NumericIdentity]int
	fail     error
	relFail  error         // non-nil: Release fails with it
	gate     chan struct{} // non-nil: Acquire waits until it is closed
	entered  chan string   // Acquire sends the key here when it starts
	watch    func(identity.ClusterEvent)
	down     string // non-empty: Status reports the store unreachable with this error
}

func newMemBackend() *memBackend {
	return &memBackend{byKey: map[string]identity.NumericIdentity{}, byID: map[identity.NumericIdentity]labels.Labels{},
		next: 1000, acquires: map[string]int{}, releases: map[identity.NumericIdentity]int{}, entered: make(chan string, 128)}
}

func (b *memBackend) Acquire(ctx context.Context, ls labels.Labels) (identity.NumericIdentity, bool, error) {
	b.mu.Lock()
	gate, fail := b.gate, b.fail
	b.acquires[ls.Key()]++
	b.mu.Unlock()
	b.entered <- ls.Key()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return 0, false, ctx.Err()
		}
	}
	if fail != nil {
		return 0, false, fail
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if id, ok := b.byKey[ls.Key()]; ok {
		return id, false, nil
	}
	id := b.next
	b.next++
	b.byKey[ls.Key()], b.byID[id] = id, ls
	if b.watch != nil {
		b.watch(identity.ClusterEvent{Kind: identity.ClusterUpsert, ID: id, Labels: ls})
	}
	return id, true, nil
}

func (b *memBackend) Release(_ context.Context, id identity.NumericIdentity) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.releases[id]++
	return b.relFail
}

func (b *memBackend) Watch(ctx context.Context, fn func(identity.ClusterEvent)) error {
	b.mu.Lock()
	for id, ls := range b.byID {
		fn(identity.ClusterEvent{Kind: identity.ClusterUpsert, ID: id, Labels: ls})
	}
	fn(identity.ClusterEvent{Kind: identity.ClusterSynced})
	b.watch = fn
	b.mu.Unlock()
	<-ctx.Done()
	return ctx.Err()
}

func (b *memBackend) Status() identity.ClusterStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	return identity.ClusterStatus{Backend: "memory", Healthy: b.down == "", Synced: true, LastError: b.down}
}

func (b *memBackend) Close() error { return nil }

// SingleNumber: the store numbers a label set once (byKey), as etcd's.
func (b *memBackend) SingleNumber() bool { return true }

// emit changes the store as another node would and sends the watch
// event. The store keeps the change, so a Watch that starts later (the
// actor's watch runs asynchronously to the test) lists it.
func (b *memBackend) emit(ev identity.ClusterEvent) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch ev.Kind {
	case identity.ClusterUpsert:
		b.byKey[ev.Labels.Key()], b.byID[ev.ID] = ev.ID, ev.Labels
	case identity.ClusterDelete:
		if ls, ok := b.byID[ev.ID]; ok {
			if b.byKey[ls.Key()] == ev.ID { // else renumbered: the labels have another
				delete(b.byKey, ls.Key())
			}
			delete(b.byID, ev.ID)
		}
	}
	if b.watch != nil {
		b.watch(ev)
	}
}

// watching reports whether a Watch receives events.
func (b *memBackend) watching() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.watch != nil
}

func (b *memBackend) counts(key string, id identity.NumericIdentity) (acquires, releases int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.acquires[key], b.releases[id]
}

func (b *memBackend) set(fail error, gate chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fail, b.gate = fail, gate
}

func clusterSystem(tb testing.TB, b *memBackend, hub *events.Hub) *System {
	tb.Helper()
	sys, _ := clusterSystemDP(tb, b, hub)
	return sys
}

func clusterSystemDP(tb testing.TB, b *memBackend, hub *events.Hub) (*System, *datapath.Fake) {
	tb.Helper()
	return svSystem(tb, func(c *Config) {
		c.IdentityBackend = b
		c.ClusterIdentity.RetryMin = 10 * time.Millisecond
		c.ClusterIdentity.RetryMax = 50 * time.Millisecond
		c.Events = hub
	})
}

func ciLabels(tb testing.TB, s ...string) labels.Labels {
	tb.Helper()
	ls, err := labels.ParseSet(s)
	if err != nil {
		tb.Fatal(err)
	}
	return ls
}

func ciHolder(tb testing.TB, sys *System) *actor.PID {
	tb.Helper()
	pid := sys.Actors.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	tb.Cleanup(func() { sys.Actors.Root.Stop(pid) })
	return pid
}

func ciAcquire(tb testing.TB, sys *System, holder *actor.PID, ls labels.Labels) *messages.IdentityAcquired {
	tb.Helper()
	return svAsk(tb, sys, sys.identity, &messages.IdentityAcquire{Labels: ls, Holder: holder}).(*messages.IdentityAcquired)
}

// TestClusterIdentityCoalescesWithoutBlocking: three endpoint actors ask
// for one new label set while the backend's Acquire is held: the backend
// sees one call, the actor keeps answering other requests meanwhile (it
// never calls the backend in Receive), and all three get the same number
// with three local references. Releasing them all sends one Release; the
// identity stays known (the store holds it) with no local reference.
func TestClusterIdentityCoalescesWithoutBlocking(t *testing.T) {
	b := newMemBackend()
	gate := make(chan struct{})
	b.set(nil, gate)
	sys := clusterSystem(t, b, nil)
	ls := ciLabels(t, "k8s:app=coalesce")
	holders := []*actor.PID{ciHolder(t, sys), ciHolder(t, sys), ciHolder(t, sys)}
	var futures []*actor.Future
	for _, h := range holders {
		futures = append(futures, sys.Actors.Root.RequestFuture(sys.identity, &messages.IdentityAcquire{Labels: ls, Holder: h}, svTimeout))
	}
	<-b.entered // the backend call is running, and held
	host := ciAcquire(t, sys, holders[0], ciLabels(t, "reserved:host"))
	if host.Err != nil || host.Identity.ID != identity.ReservedHost {
		t.Fatalf("reserved acquire while the backend is held: %+v", host)
	}
	close(gate)
	var got identity.NumericIdentity
	for i, f := range futures {
		res, err := f.Result()
		if err != nil {
			t.Fatalf("waiter %d: %v", i, err)
		}
		r := res.(*messages.IdentityAcquired)
		if r.Err != nil || (got != 0 && r.Identity.ID != got) {
			t.Fatalf("waiter %d: %+v (first got %d)", i, r, got)
		}
		got = r.Identity.ID
	}
	if n, _ := b.counts(ls.Key(), got); n != 1 {
		t.Fatalf("backend Acquire called %d times for one label set, want 1", n)
	}
	if row, ok := sys.Index.Identity(got); !ok || row.RefCount != 3 || !row.Cluster {
		t.Fatalf("index row %+v %v, want 3 local references, cluster", row, ok)
	}
	for _, h := range holders {
		r := svAsk(t, sys, sys.identity, &messages.IdentityRelease{ID: got, Holder: h}).(*messages.IdentityReleased)
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	testutil.Eventually(t, "the backend Release", func() bool { _, n := b.counts(ls.Key(), got); return n == 1 })
	if row, ok := sys.Index.Identity(got); !ok || row.RefCount != 0 || !row.Cluster {
		t.Fatalf("after the last release: %+v %v, want a cluster row without local references", row, ok)
	}
	if _, n := b.counts(ls.Key(), got); n != 1 {
		t.Fatalf("backend Release called %d times, want 1", n)
	}
}

// TestClusterIdentityRestartKeepsNumbers: the identity actor restarts
// after a panic and rebuilds from the index: a holder acquiring again gets
// its number back without a backend call (the node's use is recorded),
// and the known identities survive.
func TestClusterIdentityRestartKeepsNumbers(t *testing.T) {
	b := newMemBackend()
	sys := clusterSystem(t, b, nil)
	ls := ciLabels(t, "k8s:app=restart")
	h := ciHolder(t, sys)
	first := ciAcquire(t, sys, h, ls)
	if first.Err != nil || !first.IsNew {
		t.Fatalf("first acquire: %+v", first)
	}
	b.emit(identity.ClusterEvent{Kind: identity.ClusterUpsert, ID: 7000, Labels: ciLabels(t, "k8s:app=elsewhere")})
	testutil.Eventually(t, "the remote identity indexed", func() bool { _, ok := sys.Index.Identity(7000); return ok })
	sys.Actors.Root.Send(sys.identity, &crashForTest{})
	again := ciAcquire(t, sys, h, ls)
	if again.Err != nil || again.Identity.ID != first.Identity.ID {
		t.Fatalf("after restart: %+v, want %d", again, first.Identity.ID)
	}
	if n, _ := b.counts(ls.Key(), 0); n != 1 {
		t.Fatalf("backend Acquire called %d times, want 1 (the restart rebuilt the local use)", n)
	}
	if row, ok := sys.Index.Identity(first.Identity.ID); !ok || row.RefCount != 1 {
		t.Fatalf("after restart: %+v %v, want one reference", row, ok)
	}
	if row, ok := sys.Index.Identity(7000); !ok || !row.Cluster || row.RefCount != 0 {
		t.Fatalf("remote identity after restart: %+v %v", row, ok)
	}
}

// TestClusterIdentityRemoteFromWatch: identities the store holds appear
// in the index as remote ones; acquiring one still records the node's
// use (a backend Acquire); a store delete removes an unused one.
func TestClusterIdentityRemoteFromWatch(t *testing.T) {
	b := newMemBackend()
	remote := ciLabels(t, "k8s:app=remote")
	b.byKey[remote.Key()], b.byID[4242] = 4242, remote
	sys := clusterSystem(t, b, nil)
	testutil.Eventually(t, "the remote identity indexed", func() bool { _, ok := sys.Index.Identity(4242); return ok })
	if row, _ := sys.Index.Identity(4242); !row.Cluster || row.RefCount != 0 || row.Key != remote.Key() {
		t.Fatalf("remote row %+v", row)
	}
	h := ciHolder(t, sys)
	r := ciAcquire(t, sys, h, remote)
	if r.Err != nil || r.Identity.ID != 4242 || r.IsNew {
		t.Fatalf("acquire of a known identity: %+v", r)
	}
	if n, _ := b.counts(remote.Key(), 0); n != 1 {
		t.Fatalf("backend Acquire called %d times for a known identity, want 1 (the node's use)", n)
	}
	gone := ciLabels(t, "k8s:app=gone")
	b.emit(identity.ClusterEvent{Kind: identity.ClusterUpsert, ID: 4300, Labels: gone})
	testutil.Eventually(t, "identity 4300 indexed", func() bool { _, ok := sys.Index.Identity(4300); return ok })
	b.emit(identity.ClusterEvent{Kind: identity.ClusterDelete, ID: 4300})
	testutil.Eventually(t, "identity 4300 removed", func() bool { _, ok := sys.Index.Identity(4300); return !ok })
	st, ok := sys.ClusterIdentities()
	if !ok || st.Known != 1 || st.InUse != 1 || st.Store.Backend != "memory" {
		t.Fatalf("cluster status %+v %v, want 1 known (4300 went), 1 in use", st, ok)
	}
}

// TestClusterReleaseRetryYieldsToAcquire: a Release the store refuses is
// retried by the actor, one attempt per worker job, so an Acquire of the
// same label set runs after at most one attempt (a worker that retried
// in place held it behind all 20, and the endpoint timed out); once an
// endpoint holds the identity again, the pending retry is dropped (a
// late Release would remove the node's use of an identity it uses).
func TestClusterReleaseRetryYieldsToAcquire(t *testing.T) {
	b := newMemBackend()
	sys := clusterSystem(t, b, nil)
	ls := ciLabels(t, "k8s:app=retry")
	h1, h2 := ciHolder(t, sys), ciHolder(t, sys)
	got := ciAcquire(t, sys, h1, ls)
	if got.Err != nil {
		t.Fatal(got.Err)
	}
	n := got.Identity.ID
	b.mu.Lock()
	b.relFail = errors.New("store unreachable")
	b.mu.Unlock()
	svAsk(t, sys, sys.identity, &messages.IdentityRelease{ID: n, Holder: h1})
	testutil.Eventually(t, "the failed release retried", func() bool { _, r := b.counts(ls.Key(), n); return r >= 2 })
	again := ciAcquire(t, sys, h2, ls)
	_, rel := b.counts(ls.Key(), n)
	if again.Err != nil || again.Identity.ID != n {
		t.Fatalf("acquire while the release fails: %+v", again)
	}
	if attempts := sys.Config.ClusterIdentity.Attempts; rel >= attempts {
		t.Fatalf("the acquire waited for all %d release attempts (%d made)", attempts, rel)
	}
	b.mu.Lock()
	b.relFail = nil
	b.mu.Unlock()
	// A retry armed before the acquire fires within RetryMax (50 ms) and
	// must find the identity in use: wait well past it.
	time.Sleep(20 * sys.Config.ClusterIdentity.RetryMax)
	// One attempt may have been on the worker when the acquire came; none
	// may follow it.
	if _, after := b.counts(ls.Key(), n); after > rel+1 {
		t.Fatalf("releases went on after the identity was acquired again: %d, then %d", rel, after)
	}
	if row, ok := sys.Index.Identity(n); !ok || row.RefCount != 1 {
		t.Fatalf("identity %d: %+v %v, want one reference", n, row, ok)
	}
}

// TestClusterIdentityStoreUnavailable: while the store fails, an endpoint
// with a known identity keeps working, a new label set waits visibly (the
// endpoint's error, the status, an event) and is bound once the store is
// back, without anyone asking again but the endpoint's own retry.
func TestClusterIdentityStoreUnavailable(t *testing.T) {
	b := newMemBackend()
	hub := events.New(0)
	sub := hub.Subscribe(0)
	t.Cleanup(sub.Close)
	sys := clusterSystem(t, b, hub)
	ep := svCreate(t, sys, "outage")
	b.set(errors.New("connection refused"), nil)
	add := ciLabels(t, "k8s:tier=new")
	ctx, cancel := context.WithTimeout(context.Background(), svTimeout)
	defer cancel()
	_, err := sys.PatchLabels(ctx, ep.ID, add, nil)
	if !errors.Is(err, ErrIdentityStoreUnavailable) {
		t.Fatalf("relabel while the store is down: %v, want ErrIdentityStoreUnavailable", err)
	}
	cur, _ := sys.Index.Endpoint(ep.ID)
	if cur.Identity != ep.Identity || !strings.Contains(cur.LastError, "cluster identity store unavailable") {
		t.Fatalf("endpoint while waiting: identity %d (want %d), last error %q", cur.Identity, ep.Identity, cur.LastError)
	}
	st, _ := sys.ClusterIdentities()
	if st.Waiting != 1 || st.LastError == "" {
		t.Fatalf("status while waiting: %+v", st)
	}
	if !sawEvent(t, sub, events.IdentityWaiting) {
		t.Fatal("no identity-waiting event")
	}
	b.set(nil, nil)
	testutil.Eventually(t, "the endpoint's new identity", func() bool {
		cur, _ := sys.Index.Endpoint(ep.ID)
		return cur.Identity != ep.Identity && cur.State == endpoint.StateReady
	})
	cur, _ = sys.Index.Endpoint(ep.ID)
	want := ep.Labels.Add(add)
	if row, ok := sys.Index.Identity(cur.Identity); !ok || row.Key != want.Key() || row.RefCount != 1 {
		t.Fatalf("new identity row %+v %v, want %s", row, ok, want.Key())
	}
	testutil.Eventually(t, "nothing waiting", func() bool { st, _ := sys.ClusterIdentities(); return st.Waiting == 0 })
}

// TestClusterIdentityRetriedOnResume: a label set waiting for the store
// is asked for again as soon as the backend reports the store reachable
// (ClusterResumed), not at its next backoff (an hour here).
func TestClusterIdentityRetriedOnResume(t *testing.T) {
	b := newMemBackend()
	sys, _ := svSystem(t, func(c *Config) {
		c.IdentityBackend = b
		c.ClusterIdentity.RetryMin, c.ClusterIdentity.RetryMax = time.Hour, time.Hour
	})
	ep := svCreate(t, sys, "resume")
	b.set(errors.New("connection refused"), nil)
	add := ciLabels(t, "k8s:tier=resumed")
	ctx, cancel := context.WithTimeout(context.Background(), svTimeout)
	defer cancel()
	if _, err := sys.PatchLabels(ctx, ep.ID, add, nil); !errors.Is(err, ErrIdentityStoreUnavailable) {
		t.Fatalf("relabel while the store is down: %v, want ErrIdentityStoreUnavailable", err)
	}
	b.set(nil, nil)
	testutil.Eventually(t, "the actor's watch", b.watching) // an event before it would be lost
	b.emit(identity.ClusterEvent{Kind: identity.ClusterResumed})
	testutil.Eventually(t, "the endpoint's new identity", func() bool {
		cur, _ := sys.Index.Endpoint(ep.ID)
		return cur.Identity != ep.Identity && cur.State == endpoint.StateReady
	})
	testutil.Eventually(t, "nothing waiting", func() bool { st, _ := sys.ClusterIdentities(); return st.Waiting == 0 })
}

// TestClusterIdentityResumedDuringAttempt: the store reported reachable
// while an attempt is in flight; that attempt fails (it began during the
// outage) and the next one follows at once, not after the backoff (an
// hour here).
func TestClusterIdentityResumedDuringAttempt(t *testing.T) {
	b := newMemBackend()
	sys, _ := svSystem(t, func(c *Config) {
		c.IdentityBackend = b
		c.ClusterIdentity.RetryMin, c.ClusterIdentity.RetryMax = time.Hour, time.Hour
	})
	ep := svCreate(t, sys, "resume-inflight")
	down := errors.New("connection refused")
	b.set(down, nil)
	add := ciLabels(t, "k8s:tier=inflight")
	ctx, cancel := context.WithTimeout(context.Background(), svTimeout)
	defer cancel()
	if _, err := sys.PatchLabels(ctx, ep.ID, add, nil); !errors.Is(err, ErrIdentityStoreUnavailable) {
		t.Fatalf("relabel while the store is down: %v, want ErrIdentityStoreUnavailable", err)
	}
	for len(b.entered) > 0 {
		<-b.entered
	}
	gate := make(chan struct{})
	b.set(down, gate)
	testutil.Eventually(t, "the actor's watch", b.watching)      // an event before it would be lost
	b.emit(identity.ClusterEvent{Kind: identity.ClusterResumed}) // starts an attempt, held at the gate
	select {
	case <-b.entered:
	case <-ctx.Done():
		t.Fatal("no attempt after ClusterResumed")
	}
	b.set(nil, nil)
	b.emit(identity.ClusterEvent{Kind: identity.ClusterResumed}) // while it is in flight
	close(gate)                                                  // it fails: it read the outage
	testutil.Eventually(t, "the endpoint's new identity", func() bool {
		cur, _ := sys.Index.Endpoint(ep.ID)
		return cur.Identity != ep.Identity && cur.State == endpoint.StateReady
	})
}

// sawEvent reads sub until an event of type typ (true) or a quiet end.
func sawEvent(tb testing.TB, sub *events.Subscription, typ events.Type) bool {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), svTimeout)
	defer cancel()
	for {
		ev, err := sub.Next(ctx)
		if err != nil {
			return false
		}
		if ev.Type == typ {
			return true
		}
	}
}

// TestClusterIdentityRemoteInPolicy: an identity allocated on another
// node (known only from the watch) is selected by policy here, and stops
// being selected when the store removes it.
func TestClusterIdentityRemoteInPolicy(t *testing.T) {
	b := newMemBackend()
	sys, dp := clusterSystemDP(t, b, nil)
	target := svCreate(t, sys, "b")
	pols, err := policy.Parse([]byte(svPolicy))
	if err != nil {
		t.Fatal(err)
	}
	if res := svAsk(t, sys, sys.policy, &messages.PolicyImport{Policies: pols}).(*messages.PolicyResult); res.Err != nil {
		t.Fatal(res.Err)
	}
	const remote identity.NumericIdentity = 6000
	allowed := func() bool {
		return dp.Policy(target.ID) != nil && dp.Policy(target.ID).Allows(remote, 8080, policy.ProtoTCP, policy.Ingress)
	}
	testutil.Eventually(t, "the policy enforced", func() bool { return dp.Policy(target.ID) != nil && dp.Policy(target.ID).Enforced(policy.Ingress) })
	if allowed() {
		t.Fatal("identity 6000 allowed before any node allocated it")
	}
	b.emit(identity.ClusterEvent{Kind: identity.ClusterUpsert, ID: remote, Labels: ciLabels(t, "k8s:app=a")})
	testutil.Eventually(t, "the remote identity allowed by the policy", allowed)
	b.emit(identity.ClusterEvent{Kind: identity.ClusterDelete, ID: remote})
	testutil.Eventually(t, "the removed identity no longer allowed", func() bool { return !allowed() })
}

// TestClusterIdentityRestoreDuringOutage: a restored endpoint's label set
// (an agent restarted while the store is unreachable) keeps its number
// at once; the identity actor keeps asking the store, across its own
// restart; the node's use is recorded once the store answers, and the
// number is then confirmed as a cluster identity.
func TestClusterIdentityRestoreDuringOutage(t *testing.T) {
	b := newMemBackend()
	b.set(errors.New("connection refused"), nil)
	sys := clusterSystem(t, b, nil)
	ls := ciLabels(t, "k8s:app=restored")
	h := ciHolder(t, sys)
	r := svAsk(t, sys, sys.identity, &messages.IdentityAcquire{Labels: ls, Holder: h, Preferred: 7777}).(*messages.IdentityAcquired)
	if r.Err != nil || r.Identity.ID != 7777 {
		t.Fatalf("restore during the outage: %+v, want 7777", r)
	}
	if row, ok := sys.Index.Identity(7777); !ok || row.RefCount != 1 || row.Cluster {
		t.Fatalf("row %+v %v, want a local reference, not yet confirmed", row, ok)
	}
	if st, _ := sys.ClusterIdentities(); st.Waiting != 1 {
		t.Fatalf("status %+v, want the label set waiting for confirmation", st)
	}
	// Another endpoint with the same labels is answered from the local
	// reference, without the store.
	if r2 := ciAcquire(t, sys, ciHolder(t, sys), ls); r2.Err != nil || r2.Identity.ID != 7777 {
		t.Fatalf("second endpoint: %+v", r2)
	}
	// A restart of the identity actor keeps asking the store.
	before, _ := b.counts(ls.Key(), 0)
	sys.Actors.Root.Send(sys.identity, &crashForTest{})
	testutil.Eventually(t, "the restarted actor asking the store again", func() bool {
		n, _ := b.counts(ls.Key(), 0)
		st, _ := sys.ClusterIdentities()
		return n > before && st.Waiting == 1
	})
	b.mu.Lock()
	b.byKey[ls.Key()], b.byID[7777] = 7777, ls // the store numbered it so before
	b.mu.Unlock()
	b.set(nil, nil)
	testutil.Eventually(t, "the number confirmed by the store", func() bool {
		row, ok := sys.Index.Identity(7777)
		st, _ := sys.ClusterIdentities()
		return ok && row.Cluster && row.RefCount == 2 && st.Waiting == 0
	})
	if _, rel := b.counts(ls.Key(), 7777); rel != 0 {
		t.Fatalf("the confirmed identity was released %d times", rel)
	}
}

// renumberQuietly changes the store as another node's GC and allocation
// would (old collected, the labels numbered anew as id) without a watch
// event: the actor's watch is behind (after an etcd restart it re-lists
// late), while the backend's own reads already see the change.
func (b *memBackend) renumberQuietly(ls labels.Labels, old, id identity.NumericIdentity) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.byID, old)
	b.byKey[ls.Key()], b.byID[id] = id, ls
}

// TestClusterReleaseDeferred: the node's last reference to a label set
// going does not release it in the store before ReleaseDelay; acquired
// again meanwhile, the release is void (no Release at all); released
// again, the delay's end releases it once.
func TestClusterReleaseDeferred(t *testing.T) {
	b := newMemBackend()
	sys, _ := svSystem(t, func(c *Config) {
		c.IdentityBackend = b
		c.ClusterIdentity.RetryMin = 10 * time.Millisecond
		c.ClusterIdentity.RetryMax = 50 * time.Millisecond
		c.ClusterIdentity.ReleaseDelay = time.Hour // the test fires the timer itself
	})
	ls := ciLabels(t, "k8s:app=deferred")
	h1, h2 := ciHolder(t, sys), ciHolder(t, sys)
	got := ciAcquire(t, sys, h1, ls)
	if got.Err != nil {
		t.Fatal(got.Err)
	}
	n := got.Identity.ID
	svAsk(t, sys, sys.identity, &messages.IdentityRelease{ID: n, Holder: h1})
	time.Sleep(200 * time.Millisecond) // a Release handed to the worker at once would be counted by now
	if _, rel := b.counts(ls.Key(), n); rel != 0 {
		t.Fatalf("released in the store %d times before ReleaseDelay", rel)
	}
	if again := ciAcquire(t, sys, h2, ls); again.Err != nil || again.Identity.ID != n {
		t.Fatalf("acquired again: %+v", again)
	}
	sys.Actors.Root.Send(sys.identity, &clusterReleaseRetry{id: n}) // the delay ends
	svAsk(t, sys, sys.identity, &messages.IdentityAcquire{Labels: ls, Holder: h2})
	time.Sleep(200 * time.Millisecond)
	if _, rel := b.counts(ls.Key(), n); rel != 0 {
		t.Fatalf("released in the store %d times although acquired again within ReleaseDelay", rel)
	}
	for range 2 {
		svAsk(t, sys, sys.identity, &messages.IdentityRelease{ID: n, Holder: h2})
	}
	sys.Actors.Root.Send(sys.identity, &clusterReleaseRetry{id: n})
	testutil.Eventually(t, "the release once the delay ended", func() bool { _, r := b.counts(ls.Key(), n); return r == 1 })
	time.Sleep(200 * time.Millisecond)
	if _, rel := b.counts(ls.Key(), n); rel != 1 {
		t.Fatalf("released %d times, want 1", rel)
	}
}

// TestClusterAcquireDuringBackoff: a label set whose Acquire failed (the
// store down) waits for its next attempt; another endpoint asking for it
// meanwhile is told within WaitMax that the store is unavailable, not
// parked until the next attempt (an hour here; up to RetryMax in an agent,
// past the asking endpoint's deadline: test/multinode
// TestMultiNodeKvstore's ADD then failed with a bare "future: timeout").
func TestClusterAcquireDuringBackoff(t *testing.T) {
	b := newMemBackend()
	sys, _ := svSystem(t, func(c *Config) {
		c.IdentityBackend = b
		c.ClusterIdentity.RetryMin = time.Hour
		c.ClusterIdentity.RetryMax = time.Hour
		c.ClusterIdentity.WaitMax = 200 * time.Millisecond
	})
	b.set(errors.New("connection refused"), nil)
	ls := ciLabels(t, "k8s:app=backoff")
	if got := ciAcquire(t, sys, ciHolder(t, sys), ls); !errors.Is(got.Err, ErrIdentityStoreUnavailable) {
		t.Fatalf("first acquire while the store is down: %+v, want ErrIdentityStoreUnavailable", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second) // a bound, not a timing assertion
	defer cancel()
	res, err := sys.ask(ctx, sys.identity, &messages.IdentityAcquire{Labels: ls, Holder: ciHolder(t, sys)})
	if err != nil {
		t.Fatalf("second acquire during the backoff: %v, want an answer", err)
	}
	if got := res.(*messages.IdentityAcquired); !errors.Is(got.Err, ErrIdentityStoreUnavailable) || !strings.Contains(got.Err.Error(), "connection refused") {
		t.Fatalf("second acquire during the backoff: %+v, want ErrIdentityStoreUnavailable with the store's error", got)
	}
	if st, _ := sys.ClusterIdentities(); st.Waiting != 1 {
		t.Fatalf("status: %+v, want the label set waiting", st)
	}
}

// TestClusterAcquireWhileStoreDown: while the store does not answer (the
// attempt held here, as one hanging until CallTimeout), an Acquire of a
// new label set is answered after WaitMax with
// ErrIdentityStoreUnavailable and the store's error, while the attempt
// goes on; the label set shows as waiting and is bound once the
// store answers. Before, the request waited for the attempt, past the
// endpoint's deadline (TestMultiNodeKvstore's etcd-restart, on a quiet
// machine).
func TestClusterAcquireWhileStoreDown(t *testing.T) {
	b := newMemBackend()
	sys, _ := svSystem(t, func(c *Config) {
		c.IdentityBackend = b
		c.ClusterIdentity.RetryMin = 10 * time.Millisecond
		c.ClusterIdentity.RetryMax = 50 * time.Millisecond
		c.ClusterIdentity.WaitMax = 200 * time.Millisecond
	})
	gate := make(chan struct{})
	b.set(nil, gate)
	b.mu.Lock()
	b.down = "dial tcp 127.0.0.1:2379: connection refused"
	b.mu.Unlock()
	ls := ciLabels(t, "k8s:app=down")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second) // a bound, not a timing assertion
	defer cancel()
	res, err := sys.ask(ctx, sys.identity, &messages.IdentityAcquire{Labels: ls, Holder: ciHolder(t, sys)})
	if err != nil {
		t.Fatalf("acquire while the store is down: %v, want an answer", err)
	}
	if got := res.(*messages.IdentityAcquired); !errors.Is(got.Err, ErrIdentityStoreUnavailable) || !strings.Contains(got.Err.Error(), "connection refused") {
		t.Fatalf("acquire while the store is down: %+v, want ErrIdentityStoreUnavailable with the store's error", got)
	}
	if st, _ := sys.ClusterIdentities(); st.Waiting != 1 {
		t.Fatalf("status: %+v, want the label set waiting", st)
	}
	b.mu.Lock()
	b.down = ""
	b.mu.Unlock()
	close(gate)
	testutil.Eventually(t, "the label set known once the store answers", func() bool {
		st, _ := sys.ClusterIdentities()
		return st.Waiting == 0
	})
	if got := ciAcquire(t, sys, ciHolder(t, sys), ls); got.Err != nil {
		t.Fatalf("acquire once the store is back: %+v", got)
	}
}
