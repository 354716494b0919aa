package actors

import (
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestEndpointActorRestartRebuildsFromIndex: a panicking endpoint actor is
// restarted in place, rebuilds from its index row, keeps its IP lease and
// identity, regenerates, and can still be deleted cleanly.
func TestEndpointActorRestartRebuildsFromIndex(t *testing.T) {
	sys, dp := svSystem(t, nil)
	ep := svCreate(t, sys, "restart")
	pid := svPID(sys, ep.ID)
	_, realizesBefore, _ := dp.Stats()

	sys.Actors.Root.Send(pid, &crashForTest{})
	testutil.Eventually(t, "a regeneration after the restart", func() bool {
		_, n, _ := dp.Stats()
		cur, ok := sys.Index.Endpoint(ep.ID)
		return n > realizesBefore && ok && cur.State == endpoint.StateReady
	})
	cur, _ := sys.Index.Endpoint(ep.ID)
	if cur.Identity != ep.Identity || cur.IPv4 != ep.IPv4 {
		t.Fatalf("after restart: identity %d ip %s, want %d %s", cur.Identity, cur.IPv4, ep.Identity, ep.IPv4)
	}
	row, ok := sys.Index.IP(ep.IPv4)
	if !ok || row.Endpoint != ep.ID {
		t.Fatalf("IP lease after restart: %+v %v", row, ok)
	}
	if id, ok := sys.Index.Identity(ep.Identity); !ok || id.RefCount != 1 {
		t.Fatalf("identity after restart: %+v %v, want refcount 1", id, ok)
	}
	res := svAsk(t, sys, sys.endpoints, &messages.DeleteEndpoint{ID: ep.ID}).(*messages.EndpointResult)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	testutil.Eventually(t, "IP released", func() bool { _, ok := sys.Index.IP(ep.IPv4); return !ok })
	testutil.Eventually(t, "identity released", func() bool { _, ok := sys.Index.Identity(ep.Identity); return !ok })
}

// TestIPAMAndIdentityRestartRebuildFromIndex: the IPAM and identity actors
// restarted after a panic keep every allocation, owner, lease and refcount.
func TestIPAMAndIdentityRestartRebuildFromIndex(t *testing.T) {
	sys, _ := svSystem(t, nil)
	a := svCreate(t, sys, "a")
	b := svCreate(t, sys, "b")
	free := svAsk(t, sys, sys.ipam, &messages.IPAMAllocate{Family: "ipv4", Owner: "sv/pending"}).(*messages.IPAMAllocated)

	sys.Actors.Root.Send(sys.ipam, &crashForTest{})
	sys.Actors.Root.Send(sys.identity, &crashForTest{})

	// The rebuilt IPAM must not hand out any address in use.
	next := svAsk(t, sys, sys.ipam, &messages.IPAMAllocate{Family: "ipv4", Owner: "sv/next"}).(*messages.IPAMAllocated)
	for _, used := range []netip.Addr{a.IPv4, b.IPv4, free.IPv4} {
		if next.IPv4 == used {
			t.Fatalf("rebuilt IPAM handed out %s again", used)
		}
	}
	// A claimed address is still protected after the rebuild.
	rel := svAsk(t, sys, sys.ipam, &messages.IPAMRelease{IP: a.IPv4}).(*messages.IPAMReleased)
	if rel.Err == nil {
		t.Fatalf("release of a claimed address after rebuild succeeded")
	}
	// The rebuilt identity actor still counts a's reference and releases it
	// when a is deleted; the death-watch of b was re-established.
	res := svAsk(t, sys, sys.endpoints, &messages.DeleteEndpoint{ID: a.ID}).(*messages.EndpointResult)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	testutil.Eventually(t, "a's identity freed", func() bool { _, ok := sys.Index.Identity(a.Identity); return !ok })
	pidB := svPID(sys, b.ID)
	if err := sys.Actors.Root.StopFuture(pidB).Wait(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "b's lease released by death-watch", func() bool { _, ok := sys.Index.IP(b.IPv4); return !ok })
	testutil.Eventually(t, "b's identity released by death-watch", func() bool { _, ok := sys.Index.Identity(b.Identity); return !ok })
	testutil.Eventually(t, "b's row removed", func() bool { _, ok := sys.Index.Endpoint(b.ID); return !ok })
}

// TestIPAMRebuildReleasesDeadHolders: a rebuilt IPAM actor releases the
// addresses of lease holders that no longer run (their stop may have been
// reported before the restart lost its books), and keeps the live ones.
func TestIPAMRebuildReleasesDeadHolders(t *testing.T) {
	sys, _ := svSystem(t, nil)
	live := svCreate(t, sys, "live")
	dead := netip.MustParseAddr("10.78.0.200")
	txn := sys.Index.WriteTxn()
	row := &index.IP{IP: dead, Family: "ipv4", Owner: "sv/dead", Endpoint: 999, Holder: "nonexistent/ep-999"}
	if err := index.Insert(txn, index.TableIPAM, row); err != nil {
		t.Fatal(err)
	}
	txn.Commit()

	sys.Actors.Root.Send(sys.ipam, &crashForTest{})
	testutil.Eventually(t, "the dead holder's address released", func() bool { _, ok := sys.Index.IP(dead); return !ok })
	if row, ok := sys.Index.IP(live.IPv4); !ok || row.Endpoint != live.ID {
		t.Fatalf("live endpoint's lease after the rebuild: %+v %v", row, ok)
	}
}
