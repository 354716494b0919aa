package agent_test

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/client"
)

// collected reports when p has been garbage collected.
func collected[T any](p *T) *atomic.Bool {
	done := new(atomic.Bool)
	runtime.AddCleanup(p, func(d *atomic.Bool) { d.Store(true) }, done)
	return done
}

// TestCrashedAgentCollectable: a crashed agent, with an endpoint waiting
// for its regeneration retry, becomes garbage once the next agent runs. A
// timer of a stopped actor would otherwise keep the whole actor system,
// index and API server of every crashed agent reachable until it fires
// (the retry here is an hour away; the wait below is bounded).
func TestCrashedAgentCollectable(t *testing.T) {
	e := newRestoreEnv(t)
	fake := datapath.NewFake(1)
	fake.Set(datapath.FakeHooks{ErrorRate: 1})
	cfg := e.cfg
	cfg.Fake = fake
	cfg.Actors.Endpoint.RetryMin, cfg.Actors.Endpoint.RetryMax = time.Hour, time.Hour
	gone := crashRetrying(t, cfg, e)
	fake.Set(datapath.FakeHooks{})
	e.start(t, fake)           // the next agent, on the same state and datapath
	for i := 0; i < 500; i++ { // bounded: about 10 s
		runtime.GC()
		all := true
		for _, g := range gone {
			all = all && g.Load()
		}
		if all {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	for what, g := range gone {
		if !g.Load() {
			t.Errorf("the crashed agent's %s is still reachable", what)
		}
	}
}

// crashRetrying starts an agent, adds a pod whose regeneration fails (the
// retry is armed) and crashes the agent. It returns what reports the
// collection of the agent's parts; nothing else keeps the agent.
func crashRetrying(t *testing.T, cfg agent.Config, e *restoreEnv) map[string]*atomic.Bool {
	t.Helper()
	a, err := agent.Start(cfg, e.log)
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(cfg.Socket)
	addPod(t, c, "retrying", "x", false)
	c.Close()
	for i := 0; a.System.Counters().RegenerationsFailed == 0; i++ {
		if i == 1000 {
			a.Crash()
			t.Fatal("the regeneration did not fail")
		}
		time.Sleep(10 * time.Millisecond)
	}
	gone := map[string]*atomic.Bool{"agent": collected(a), "index": collected(a.Index),
		"actor system": collected(a.System.Actors), "api server": collected(a.Server)}
	a.Crash()
	return gone
}
