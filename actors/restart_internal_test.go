package actors

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/endpoint"
	"github.com/membrane-cni/membrane/pkg/index"
	"github.com/membrane-cni/membrane/pkg/labels"
)

func startInternal(tb testing.TB) (*System, *datapath.Fake) {
	tb.Helper()
	ix, err := index.New()
	if err != nil {
		tb.Fatal(err)
	}
	dp := datapath.NewFake(7)
	cfg := Config{IPAM: IPAMConfig{IPv4: netip.MustParsePrefix("10.77.0.0/24")}}
	sys, err := Start(cfg, ix, dp, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(sys.Stop)
	return sys, dp
}

func ask(tb testing.TB, sys *System, pid *actor.PID, msg any) any {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := sys.Ask(ctx, pid, msg)
	if err != nil {
		tb.Fatalf("ask %T: %v", msg, err)
	}
	return res
}

func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// createReady allocates an address and creates a ready endpoint.
func createReady(tb testing.TB, sys *System, cid string) *endpoint.Endpoint {
	tb.Helper()
	alloc := ask(tb, sys, sys.IPAM, &messages.IPAMAllocate{Family: "ipv4", Owner: "default/" + cid}).(*messages.IPAMAllocated)
	if alloc.Err != nil {
		tb.Fatal(alloc.Err)
	}
	ls, _ := labels.ParseSet([]string{"k8s:app=" + cid})
	spec := &endpoint.Endpoint{ContainerID: cid, Namespace: "default", PodName: cid, Labels: ls, IPv4: alloc.IPv4}
	res := ask(tb, sys, sys.Endpoints, &messages.CreateEndpoint{Spec: spec, Sync: true}).(*messages.EndpointResult)
	if res.Err != nil {
		tb.Fatal(res.Err)
	}
	return res.Endpoint
}

// TestEndpointActorRestartRebuildsFromIndex: a panicking endpoint actor is
// restarted in place, rebuilds from its index row, keeps its IP lease and
// identity, regenerates, and can still be deleted cleanly.
func TestEndpointActorRestartRebuildsFromIndex(t *testing.T) {
	sys, dp := startInternal(t)
	ep := createReady(t, sys, "restart")
	pid := actor.NewPID(sys.Actors.Address(), sys.Endpoints.Id+"/"+endpointActorName(ep.ID))
	_, realizesBefore, _ := dp.Stats()

	sys.Actors.Root.Send(pid, &crashForTest{})
	waitFor(t, "a regeneration after the restart", func() bool {
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
	res := ask(t, sys, sys.Endpoints, &messages.DeleteEndpoint{ID: ep.ID}).(*messages.EndpointResult)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	waitFor(t, "IP released", func() bool { _, ok := sys.Index.IP(ep.IPv4); return !ok })
	waitFor(t, "identity released", func() bool { _, ok := sys.Index.Identity(ep.Identity); return !ok })
}

// TestIPAMAndIdentityRestartRebuildFromIndex: the IPAM and identity actors
// restarted after a panic keep every allocation, owner, lease and refcount.
func TestIPAMAndIdentityRestartRebuildFromIndex(t *testing.T) {
	sys, _ := startInternal(t)
	a := createReady(t, sys, "a")
	b := createReady(t, sys, "b")
	free := ask(t, sys, sys.IPAM, &messages.IPAMAllocate{Family: "ipv4", Owner: "default/pending"}).(*messages.IPAMAllocated)

	sys.Actors.Root.Send(sys.IPAM, &crashForTest{})
	sys.Actors.Root.Send(sys.Identity, &crashForTest{})

	// The rebuilt IPAM must not hand out any address in use.
	next := ask(t, sys, sys.IPAM, &messages.IPAMAllocate{Family: "ipv4", Owner: "default/next"}).(*messages.IPAMAllocated)
	for _, used := range []netip.Addr{a.IPv4, b.IPv4, free.IPv4} {
		if next.IPv4 == used {
			t.Fatalf("rebuilt IPAM handed out %s again", used)
		}
	}
	// A claimed address is still protected after the rebuild.
	rel := ask(t, sys, sys.IPAM, &messages.IPAMRelease{IP: a.IPv4}).(*messages.IPAMReleased)
	if rel.Err == nil {
		t.Fatalf("release of a claimed address after rebuild succeeded")
	}
	// The rebuilt identity actor still counts a's reference and releases it
	// when a is deleted; the death-watch of b was re-established.
	res := ask(t, sys, sys.Endpoints, &messages.DeleteEndpoint{ID: a.ID}).(*messages.EndpointResult)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	waitFor(t, "a's identity freed", func() bool { _, ok := sys.Index.Identity(a.Identity); return !ok })
	pidB := actor.NewPID(sys.Actors.Address(), sys.Endpoints.Id+"/"+endpointActorName(b.ID))
	if err := sys.Actors.Root.StopFuture(pidB).Wait(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b's lease released by death-watch", func() bool { _, ok := sys.Index.IP(b.IPv4); return !ok })
	waitFor(t, "b's identity released by death-watch", func() bool { _, ok := sys.Index.Identity(b.Identity); return !ok })
	waitFor(t, "b's row removed", func() bool { _, ok := sys.Index.Endpoint(b.ID); return !ok })
}
