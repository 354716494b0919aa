package actors_test

import (
	"context"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// TestRegeneratePolicyJoin: a Join (LearnFQDN's wait for the
// regeneration the policy actor asked for) requests nothing: an idle
// endpoint answers at once without regenerating; a running regeneration
// is waited for; with one owed besides, the owed one (which started
// after every request before the Join) is.
func TestRegeneratePolicyJoin(t *testing.T) {
	h := startSystem(t, nil)
	ep := h.mustCreate(t, podSpec(t, "c1", "default", "a", "k8s:app=a"))
	mgr := h.sys.PIDForTest("endpoints")
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	regens := func() uint64 { e, _ := h.indexed(ep.ID); return e.Regenerations }
	join := func() <-chan error {
		done := make(chan error, 1)
		go func() {
			res, err := h.sys.AskForTest(ctx, mgr, &messages.RegeneratePolicy{ID: ep.ID, Join: true})
			if r, ok := res.(*messages.EndpointResult); ok && err == nil {
				err = r.Err
			}
			done <- err
		}()
		return done
	}
	pending := func(done <-chan error, what string) {
		t.Helper()
		select {
		case err := <-done:
			t.Fatalf("%s: answered (%v) before the regeneration ended", what, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	answered := func(done <-chan error, what string) {
		t.Helper()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		case <-time.After(waitTimeout):
			t.Fatalf("%s: not answered", what)
		}
	}

	// Idle: answered at once, nothing regenerated.
	before := regens()
	answered(join(), "idle")
	time.Sleep(20 * time.Millisecond)
	if n := regens(); n != before {
		t.Fatalf("a join of an idle endpoint regenerated it (%d -> %d)", before, n)
	}

	// Running: the realise is held until released.
	entered, release := make(chan struct{}, 4), make(chan struct{})
	h.fake.Set(datapath.FakeHooks{BeforeRealize: func(ctx context.Context, e *endpoint.Endpoint, _ uint64) error {
		if e.ID == ep.ID {
			entered <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil
	}})
	h.sys.Actors.Root.Send(mgr, &messages.RegeneratePolicy{ID: ep.ID}) // as the policy actor does
	<-entered
	running := join()
	pending(running, "running")
	release <- struct{}{}
	answered(running, "running")
	waitRegens(t, regens, before+1)

	// Running and one owed: the join waits for the owed one too.
	h.sys.Actors.Root.Send(mgr, &messages.RegeneratePolicy{ID: ep.ID})
	<-entered
	h.sys.Actors.Root.Send(mgr, &messages.RegeneratePolicy{ID: ep.ID}) // owed
	owed := join()
	pending(owed, "owed")
	release <- struct{}{}
	<-entered // the owed one runs
	pending(owed, "owed, while it runs")
	release <- struct{}{}
	answered(owed, "owed")
	if n := regens(); n != before+3 {
		t.Fatalf("%d regenerations after the joins, want %d: a join asked for one", n, before+3)
	}
	h.fake.Set(datapath.FakeHooks{})
}

// waitRegens waits until regens() reaches n.
func waitRegens(t *testing.T, regens func() uint64, n uint64) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for regens() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d regenerations, want %d", regens(), n)
		}
		time.Sleep(time.Millisecond)
	}
}
