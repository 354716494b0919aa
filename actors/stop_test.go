package actors_test

import (
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
)

// TestStopFailsPendingFutures: Stop completes the futures nobody will
// answer any more as dead letters, and the stopped system becomes
// garbage. A future's timeout timer (an hour here) would otherwise keep
// the whole system reachable until it fired.
func TestStopFailsPendingFutures(t *testing.T) {
	errc := make(chan error, 1)
	gone := stoppedWithPendingFuture(t, errc)
	select {
	case err := <-errc:
		if !errors.Is(err, actor.ErrDeadLetter) {
			t.Fatalf("pending future after Stop: got %v, want %v", err, actor.ErrDeadLetter)
		}
	case <-time.After(10 * time.Second): // bounded wait, not a timing assertion
		t.Fatal("a pending future was not completed by Stop")
	}
	for i := 0; i < 500 && !gone.Load(); i++ {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if !gone.Load() {
		t.Fatal("the stopped actor system is still reachable")
	}
}

// stoppedWithPendingFuture starts a system, asks through a future that no
// actor answers, stops the system and reports the future's result on
// errc. The returned flag turns true once the actor system is collected.
func stoppedWithPendingFuture(t *testing.T, errc chan<- error) *atomic.Bool {
	t.Helper()
	ix, err := index.New()
	if err != nil {
		t.Fatal(err)
	}
	cfg := actors.Config{IPAM: actors.IPAMConfig{IPv4: testIPv4, Strategy: ipam.Sequential, Seed: 1}, Pool: actors.PoolConfig{Workers: 2}}
	sys, err := actors.Start(cfg, ix, datapath.NewFake(1), testLogger(t))
	if err != nil {
		t.Fatalf("actors.Start: %v", err)
	}
	gone := new(atomic.Bool)
	runtime.AddCleanup(sys.Actors, func(g *atomic.Bool) { g.Store(true) }, gone)
	f := actor.NewFuture(sys.Actors, time.Hour) // its answer never comes
	go func() {
		_, err := f.Result()
		errc <- err
	}()
	sys.Stop()
	return gone
}
