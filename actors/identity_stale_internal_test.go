package actors

import (
	"errors"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// staleWatchSystem starts a cluster-mode system whose watch reported
// old for ls, then changes the store behind the watch's back: old
// collected, ls numbered anew (TestMultiNode: a watch broken by the etcd
// restart re-lists after the node's Acquires already see the store).
func staleWatchSystem(t *testing.T, label string) (*System, *memBackend, identity.NumericIdentity) {
	t.Helper()
	b := newMemBackend()
	sys := clusterSystem(t, b, nil)
	testutil.Eventually(t, "the actor's watch", b.watching)
	ls := ciLabels(t, label)
	const old identity.NumericIdentity = 900
	b.emit(identity.ClusterEvent{Kind: identity.ClusterUpsert, ID: old, Labels: ls})
	testutil.Eventually(t, "the watched identity known", func() bool {
		row, ok := sys.Index.Identity(old)
		return ok && row.Cluster
	})
	return sys, b, old
}

// TestClusterAnswerNewerThanWatch: an Acquire's answer for a label set
// the watch still reports under another number (collected and numbered
// anew meanwhile) is the store's truth, read in the transaction that
// recorded this node's reference. Before the fix the actor refused it as
// "one label set under two identities", failed the endpoint's ADD and
// never released the reference the Acquire had recorded: TestMultiNode's
// "sim-node-0 holds a reference ... without a live endpoint using it".
func TestClusterAnswerNewerThanWatch(t *testing.T) {
	sys, b, old := staleWatchSystem(t, "k8s:app=answer-newer")
	ls := ciLabels(t, "k8s:app=answer-newer")
	const renumbered identity.NumericIdentity = 4343
	b.renumberQuietly(ls, old, renumbered)

	h := ciHolder(t, sys)
	r := ciAcquire(t, sys, h, ls)
	if r.Err != nil {
		acq, rel := b.counts(ls.Key(), renumbered)
		t.Fatalf("acquire with the watch behind the store: %v; the store records this node's use of %d (%d acquires, %d releases) and no endpoint here uses it",
			r.Err, renumbered, acq, rel)
	}
	if r.Identity.ID != renumbered {
		t.Fatalf("acquired %d, want the store's number %d", r.Identity.ID, renumbered)
	}
	if row, ok := sys.Index.Identity(renumbered); !ok || !row.Cluster || row.RefCount != 1 || row.Key != ls.Key() {
		t.Fatalf("row of %d = %+v %v, want the store's identity with one reference", renumbered, row, ok)
	}
	if row, ok := sys.Index.Identity(old); ok {
		t.Fatalf("the stale number %d still known: %+v", old, row)
	}
	// The watch catches up (the collection, then the new number): nothing
	// changes, and the holder's release is the node's last use.
	b.emit(identity.ClusterEvent{Kind: identity.ClusterDelete, ID: old})
	b.emit(identity.ClusterEvent{Kind: identity.ClusterUpsert, ID: renumbered, Labels: ls})
	rel := ciRelease(t, sys, h, renumbered)
	if !rel {
		t.Fatalf("release of %d released nothing", renumbered)
	}
	testutil.Eventually(t, "the node's use released in the store", func() bool { _, n := b.counts("", renumbered); return n == 1 })
}

// TestClusterConfirmNewerThanWatch: a label set bound here without the
// store (provisionally, to the number the watch reported) is confirmed
// by an answer with another number while the watch is behind (the number
// collected, the labels numbered anew). Before the fix the actor refused
// the answer, released the node's use of the store's number, dropped the
// confirmation and kept its endpoints on a number the store no longer
// has, with nothing left to ask again (the watch's late re-list is the
// only way out, and it says nothing about a number it never saw):
// TestMultiNode's "identity N held by sim-node-2's endpoints is not in
// etcd". The endpoints must move to the store's number.
func TestClusterConfirmNewerThanWatch(t *testing.T) {
	sys, b, old := staleWatchSystem(t, "k8s:app=confirm-newer")
	ls := ciLabels(t, "k8s:app=confirm-newer")
	b.set(errors.New("connection refused"), nil)
	h := ciHolder(t, sys)
	if r := ciAcquire(t, sys, h, ls); r.Err != nil || r.Identity.ID != old {
		t.Fatalf("acquire while the store is down: %+v, want the known %d provisionally", r, old)
	}
	const renumbered identity.NumericIdentity = 4344
	b.renumberQuietly(ls, old, renumbered)
	b.set(nil, nil)
	testutil.Eventually(t, "the confirmation answered", func() bool {
		st, _ := sys.ClusterIdentities()
		acq, _ := b.counts(ls.Key(), 0)
		return st.Waiting == 0 && acq >= 2
	})
	if row, ok := sys.Index.Identity(old); ok && row.RefCount > 0 {
		t.Fatalf("the holder stays on %d, which the store no longer has (it numbers %s %d): row %+v; releases of %d: %d",
			old, ls.Key(), renumbered, row, renumbered, releases(b, renumbered))
	}
	if row, ok := sys.Index.Identity(renumbered); !ok || !row.Cluster || row.RefCount != 1 || row.Key != ls.Key() {
		t.Fatalf("row of %d = %+v %v, want the store's identity with the holder's reference", renumbered, row, ok)
	}
	if n := releases(b, renumbered); n != 0 {
		t.Fatalf("the node's use of %d released %d times while its holder uses it", renumbered, n)
	}
}

func releases(b *memBackend, id identity.NumericIdentity) int {
	_, n := b.counts("", id)
	return n
}

// ciRelease drops holder's reference on id; it reports whether that was
// the last one here.
func ciRelease(tb testing.TB, sys *System, holder *actor.PID, id identity.NumericIdentity) bool {
	tb.Helper()
	r := svAsk(tb, sys, sys.identity, &messages.IdentityRelease{ID: id, Holder: holder}).(*messages.IdentityReleased)
	if r.Err != nil {
		tb.Fatal(r.Err)
	}
	return r.Released
}

// multiNumber is memBackend as a store that may hold one label set under
// several numbers (the CRD backend).
type multiNumber struct{ *memBackend }

func (multiNumber) SingleNumber() bool { return false }

// TestClusterAnswerNotSupersededByMultiNumberStore: with a store that
// may number a label set twice, a differing answer is not taken over the
// watch (the watch's number may be the one the other nodes' pods carry).
func TestClusterAnswerNotSupersededByMultiNumberStore(t *testing.T) {
	b := newMemBackend()
	sys, _ := svSystem(t, func(c *Config) {
		c.IdentityBackend = multiNumber{b}
		c.ClusterIdentity.RetryMin, c.ClusterIdentity.RetryMax = 10*time.Millisecond, 50*time.Millisecond
	})
	testutil.Eventually(t, "the actor's watch", b.watching)
	ls := ciLabels(t, "k8s:app=multi-number")
	const old, other identity.NumericIdentity = 900, 4345
	b.emit(identity.ClusterEvent{Kind: identity.ClusterUpsert, ID: old, Labels: ls})
	testutil.Eventually(t, "the watched identity known", func() bool {
		row, ok := sys.Index.Identity(old)
		return ok && row.Cluster
	})
	b.renumberQuietly(ls, old, other)
	if r := ciAcquire(t, sys, ciHolder(t, sys), ls); !errors.Is(r.Err, identity.ErrConflict) {
		t.Fatalf("acquire answered %d while the watch reports %d: %+v, want a conflict", other, old, r)
	}
	if row, ok := sys.Index.Identity(old); !ok || !row.Cluster {
		t.Fatalf("the watch's %d: %+v %v, want it still known", old, row, ok)
	}
}
