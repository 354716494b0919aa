package actors_test

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
)

// TestStopAnswersPendingRequests: Stop answers a caller whose request
// the actors will never finish (a sync create held in the datapath, with
// hour-long timeouts), and the stopped system becomes
// garbage: no pending request's timer keeps it reachable.
func TestStopAnswersPendingRequests(t *testing.T) {
	errc := make(chan error, 1)
	gone := stoppedWithPendingRequest(t, errc)
	select {
	case err := <-errc:
		if !errors.Is(err, actors.ErrEndpointGone) { // its actor stopped unanswered
			t.Fatalf("pending create after Stop: got %v, want %v", err, actors.ErrEndpointGone)
		}
	case <-time.After(10 * time.Second): // bounded wait, not a timing assertion
		t.Fatal("a pending create was not answered by Stop")
	}
	for i := 0; i < 500 && !gone.Load(); i++ {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if !gone.Load() {
		t.Fatal("the stopped actor system is still reachable")
	}
}

// stoppedWithPendingRequest starts a system, creates an endpoint whose
// first regeneration is held in the datapath, stops the system and
// reports the create's result on errc. The returned flag turns true once
// the actor system is collected.
func stoppedWithPendingRequest(t *testing.T, errc chan<- error) *atomic.Bool {
	t.Helper()
	ix, err := index.New()
	if err != nil {
		t.Fatal(err)
	}
	cfg := actors.Config{IPAM: actors.IPAMConfig{IPv4: testIPv4, Strategy: ipam.Sequential, Seed: 1}, Pool: actors.PoolConfig{Workers: 2},
		Endpoint: actors.EndpointConfig{DatapathTimeout: time.Hour, RequestTimeout: time.Hour}}
	dp := datapath.NewFake(1)
	held := make(chan struct{})
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	dp.Set(datapath.FakeHooks{BeforeRealize: func(ctx context.Context, _ *endpoint.Endpoint, _ uint64) error {
		close(held)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}})
	sys, err := actors.Start(cfg, ix, dp, testLogger(t))
	if err != nil {
		t.Fatalf("actors.Start: %v", err)
	}
	gone := new(atomic.Bool)
	runtime.AddCleanup(sys.Actors, func(g *atomic.Bool) { g.Store(true) }, gone)
	go func() {
		_, err := sys.CreateEndpoint(context.Background(), &endpoint.Endpoint{ContainerID: "held", Labels: mustLabels(t, "k8s:app=held")}, true)
		errc <- err
	}()
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the regeneration never reached the datapath")
	}
	sys.Stop()
	return gone
}
