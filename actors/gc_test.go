package actors_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/index"
)

// heldCollector is a Fake whose GC passes wait until released.
type heldCollector struct {
	*datapath.Fake
	entered chan struct{}
	release chan struct{}
	passes  atomic.Int32
}

func (h *heldCollector) GC(ctx context.Context, live []*endpoint.Endpoint) (datapath.GCReport, error) {
	h.passes.Add(1)
	h.entered <- struct{}{}
	<-h.release
	return datapath.GCReport{Suspects: len(live)}, nil
}

// TestGCActorSharesRunningPass: RunGC requests that arrive while a pass
// runs (in the pool, not in the actor) are all answered by that pass; the
// next request runs a new one.
func TestGCActorSharesRunningPass(t *testing.T) {
	ix, err := index.New()
	if err != nil {
		t.Fatal(err)
	}
	dp := &heldCollector{Fake: datapath.NewFake(1), entered: make(chan struct{}, 4), release: make(chan struct{})}
	sys, err := actors.Start(actors.Config{IPAM: actors.IPAMConfig{IPv4: testIPv4}, GC: actors.GCConfig{Interval: -1}}, ix, dp, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sys.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	stats := sys.MailboxStats(sys.PIDForTest("gc").Id)
	var base int64
	results := make([]*messages.GCResult, 3)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := sys.AskForTest(ctx, sys.PIDForTest("gc"), &messages.RunGC{})
			if err != nil {
				t.Errorf("RunGC %d: %v", i, err)
				return
			}
			results[i] = res.(*messages.GCResult)
		}()
		if i == 0 {
			<-dp.entered // the first request started the pass
			base = stats.Processed()
		}
	}
	// The actor takes the other requests while the pass runs.
	for deadline := time.Now().Add(waitTimeout); stats.Processed() < base+2; {
		if time.Now().After(deadline) {
			t.Fatal("the GC actor did not take the requests made during a pass")
		}
		time.Sleep(time.Millisecond)
	}
	close(dp.release)
	wg.Wait()
	if n := dp.passes.Load(); n != 1 {
		t.Fatalf("%d passes for three concurrent requests, want 1", n)
	}
	for i, r := range results {
		if r == nil || r.Err != nil {
			t.Fatalf("result %d: %+v", i, r)
		}
	}
	if _, err := sys.AskForTest(ctx, sys.PIDForTest("gc"), &messages.RunGC{}); err != nil {
		t.Fatal(err)
	}
	if n := dp.passes.Load(); n != 2 {
		t.Fatalf("%d passes after a later request, want 2", n)
	}
}
