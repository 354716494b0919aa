package actors

import (
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestClusterIdentityConflictRenumbered: the store collects the number
// two endpoints here use for their labels (its GC, while this node could
// not mark it in use: a partition) and another node numbers the labels
// anew. The node converges on the store's number: both endpoints move to
// it through their actors (ipcache, policy, the index's rows and leases),
// an event says so, the store records the node's use of the new number
// and the release of the old, and a policy here selecting those labels
// allows the new number (the one the other nodes' pods carry). Deleting
// the endpoints afterwards drops every reference. Before the fix the
// conflict was only logged: the endpoints kept the old number forever.
// The watch may report the two changes in either order (a relist after
// the partition), and the node converges in both.
func TestClusterIdentityConflictRenumbered(t *testing.T) {
	t.Run("removal first", func(t *testing.T) { testRenumbered(t, true) })
	t.Run("new number first", func(t *testing.T) { testRenumbered(t, false) })
}

func testRenumbered(t *testing.T, removalFirst bool) {
	b := newMemBackend()
	hub := events.New(0)
	sys, dp := clusterSystemDP(t, b, hub)
	sub := hub.Subscribe(0)
	defer sub.Close()
	pols, err := policy.Parse([]byte(svPolicy))
	if err != nil {
		t.Fatal(err)
	}
	if res := svAsk(t, sys, sys.policy, &messages.PolicyImport{Policies: pols}).(*messages.PolicyResult); res.Err != nil {
		t.Fatal(res.Err)
	}
	target := svCreate(t, sys, "b")
	a1 := svCreate(t, sys, "a")
	a2 := svCreate(t, sys, "a2")
	// a2 with a's labels: the second reference on the same number.
	ls := a1.Labels
	if res := svAsk(t, sys, sys.endpoints, &messages.PatchLabels{ID: a2.ID, Add: ls, Delete: a2.Labels}).(*messages.EndpointResult); res.Err != nil {
		t.Fatal(res.Err)
	}
	old := a1.Identity
	testutil.Eventually(t, "both endpoints on one number", func() bool {
		e2, _ := sys.Index.Endpoint(a2.ID)
		return e2.Identity == old && e2.State == endpoint.StateReady
	})
	// A third holder that does not follow the renumbering (an endpoint
	// whose labels change meanwhile): its release of the old number
	// must release the new one.
	h := ciHolder(t, sys)
	if r := ciAcquire(t, sys, h, ls); r.Err != nil || r.Identity.ID != old {
		t.Fatalf("third holder: %+v, want %d", r, old)
	}
	if row, ok := sys.Index.Identity(old); !ok || row.RefCount != 3 || !row.Cluster {
		t.Fatalf("row of %d = %+v %v, want 3 references, a cluster identity", old, row, ok)
	}

	// The node is cut off (its Acquires wait) while the store collects
	// the number and another node numbers the labels anew; the node sees
	// both (the removal makes it ask the store again), then reaches the
	// store.
	const renumbered identity.NumericIdentity = 4242
	gate := make(chan struct{})
	b.set(nil, gate)
	collected := identity.ClusterEvent{Kind: identity.ClusterDelete, ID: old}
	anew := identity.ClusterEvent{Kind: identity.ClusterUpsert, ID: renumbered, Labels: ls} // by another node
	if removalFirst {
		b.emit(collected)
		b.emit(anew)
	} else {
		b.emit(anew)
		b.emit(collected)
	}
	close(gate)

	ready := func(id endpoint.ID) bool {
		ep, ok := sys.Index.Endpoint(id)
		return ok && ep.Identity == renumbered && ep.State == endpoint.StateReady
	}
	testutil.Eventually(t, "the endpoints on the store's number", func() bool { return ready(a1.ID) && ready(a2.ID) })
	for _, ep := range []*endpoint.Endpoint{a1, a2} {
		testutil.Eventually(t, "the ipcache on the store's number", func() bool {
			return dp.IPCache()[netip.PrefixFrom(ep.IPv4, 32)] == renumbered
		})
	}
	if row, ok := sys.Index.Identity(renumbered); !ok || row.RefCount != 3 || !row.Cluster {
		t.Fatalf("row of %d = %+v %v, want 3 references, a cluster identity", renumbered, row, ok)
	}
	if row, ok := sys.Index.Identity(old); ok {
		t.Fatalf("row of the old number %d still there: %+v", old, row)
	}
	for _, l := range sys.Index.IdentityLeases() {
		if l.ID == old {
			t.Fatalf("lease on the old number left: %+v", l)
		}
	}
	testutil.Eventually(t, "the policy allows the store's number", func() bool {
		return dp.Policy(target.ID) != nil && dp.Policy(target.ID).Allows(renumbered, 8080, policy.ProtoTCP, policy.Ingress)
	})
	testutil.Eventually(t, "the node's use recorded, the old number released", func() bool {
		acq, _ := b.counts(ls.Key(), 0)
		_, rel := b.counts("", old)
		return acq >= 2 && rel >= 1
	})
	if !sawEvent(t, sub, events.IdentityRenumbered) {
		t.Fatal("no identity-renumbered event")
	}

	// The references are the holders': releasing the old number and
	// deleting the endpoints drops them all.
	if r := svAsk(t, sys, sys.identity, &messages.IdentityRelease{ID: old, Holder: h}).(*messages.IdentityReleased); r.Err != nil {
		t.Fatal(r.Err)
	}
	if row, ok := sys.Index.Identity(renumbered); !ok || row.RefCount != 2 {
		t.Fatalf("after the third holder released %d: row of %d = %+v %v, want 2 references", old, renumbered, row, ok)
	}
	for _, ep := range []*endpoint.Endpoint{a1, a2} {
		if res := svAsk(t, sys, sys.endpoints, &messages.DeleteEndpoint{ID: ep.ID}).(*messages.EndpointResult); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	testutil.Eventually(t, "no reference left on the store's number", func() bool {
		row, ok := sys.Index.Identity(renumbered)
		return ok && row.RefCount == 0
	})
}
