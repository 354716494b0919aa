package sim

import (
	"context"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// TestCrashLeftoversCollected: datapath state that no endpoint names is
// a violation at settle; after a crash (which may leave exactly that: a
// new endpoint's realise done, its state write not durable) the
// garbage collector's two orphan passes must remove it, and what they
// removed is counted, not reported.
func TestCrashLeftoversCollected(t *testing.T) {
	e, cleanup, err := newEngine(testScenario("leftovers"), Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	ctx := context.Background()
	if err := e.tgt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.tgt.Stop(ctx) }()
	const orphan = endpoint.ID(4000)
	fake := e.tgt.(*inProcess).fake
	if _, err := fake.Realize(ctx, &endpoint.Endpoint{ID: orphan}, 1); err != nil {
		t.Fatal(err)
	}
	// The agent's own start-up work (a first GC or ipcache sync) may
	// still hold a datapath worker: read it idle, as settle does.
	e.quiesce(ctx)
	s, err := e.settledSnapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fs := quiescentChecks(s, map[string]expectedPod{})
	if len(fs) != 1 || fs[0] != orphanFinding(orphan) {
		t.Fatalf("findings %v, want the orphan's alone", fs)
	}
	if got := e.collectCrashLeftovers(ctx, s, fs); len(got) != 1 || e.crashLeftovers.Load() != 0 {
		t.Errorf("without a crash: findings %v, %d collected; want the orphan reported", got, e.crashLeftovers.Load())
	}
	if _, ok := fake.Realized(orphan); !ok {
		t.Fatalf("without a crash the orphan was collected")
	}
	e.restarts.Store(1)
	if got := e.collectCrashLeftovers(ctx, s, fs); len(got) != 0 || e.crashLeftovers.Load() != 1 {
		t.Errorf("after a crash: findings %v, %d collected; want none left, 1 collected", got, e.crashLeftovers.Load())
	}
	if _, ok := fake.Realized(orphan); ok {
		t.Errorf("after a crash the orphan's datapath state remains")
	}
}
