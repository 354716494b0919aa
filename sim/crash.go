package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// Crashes: the agent is killed at random moments of the churn phase
// (agent.Agent.Crash in-process), stays down for a random time below
// CrashDowntime, and is started again on the same socket, state directory
// and datapath. Calls in flight at the crash are reset; calls during the
// downtime are refused, and kubelet-like retries carry on. Once the agent
// is back, new calls are held while the harness checks the restore
// contract: every pod whose ADD was acknowledged and that no DEL touched
// has its endpoint, with its address; no endpoint whose DEL was
// acknowledged came back.

// crashTimes draws n crash moments within the churn phase, sorted.
func crashTimes(rng *rand.Rand, n int, d time.Duration) []time.Duration {
	out := make([]time.Duration, n)
	lo, span := d/20, d*18/20
	for i := range out {
		out[i] = lo
		if span > 0 {
			out[i] += time.Duration(rng.Int64N(int64(span)))
		}
	}
	slices.Sort(out)
	return out
}

// startCrashes runs the crash controller; the channel closes when it is
// done (after the last restart, or when the churn phase ends).
func (e *engine) startCrashes(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	if e.sc.Crashes == 0 {
		close(done)
		return done
	}
	rng := rand.New(rand.NewPCG(e.sc.Seed, 0xc4a54))
	times := crashTimes(rng, e.sc.Crashes, e.sc.Duration.D())
	start := time.Unix(0, e.churnStart.Load())
	go func() {
		defer close(done)
		for i, at := range times {
			if d := time.Until(start.Add(at)); d > 0 {
				sleepCtx(ctx, d)
			}
			if ctx.Err() != nil || e.phase.Load() != phaseChurn {
				e.note(fmt.Sprintf("%d of %d crashes happened (the churn phase ended first)", i, len(times)))
				return
			}
			if !e.crashOnce(ctx, rng, i+1) {
				return
			}
		}
	}()
	return done
}

// crashOnce kills the agent, restarts it and verifies the restore. It
// reports false if the agent could not be restarted.
func (e *engine) crashOnce(ctx context.Context, rng *rand.Rand, n int) bool {
	ctx = context.WithoutCancel(ctx) // once crashed, the agent is restarted
	old := e.epoch.Load()
	e.event("crash", fmt.Sprintf("#%d", n))
	old.cancel() // reset the calls in flight
	e.upSince.Store(0)
	e.lastCrash.Store(time.Now().UnixNano())
	if err := e.tgt.Crash(); err != nil {
		e.violate(invAgent, "crash", "", fmt.Sprintf("crash #%d: %v", n, err), nil)
		return false
	}
	e.newEpoch()
	if max := e.sc.CrashDowntime.D(); max > 0 {
		sleepCtx(ctx, time.Duration(rng.Int64N(int64(max))))
	}
	start := time.Now()
	if err := e.tgt.Restart(ctx); err != nil {
		e.violate(invAgent, "restart", "", fmt.Sprintf("restart after crash #%d: %v", n, err), nil)
		return false
	}
	e.restarts.Add(1)
	e.event("restart", fmt.Sprintf("#%d, ready after %s", n, time.Since(start).Round(time.Millisecond)))
	e.gate.Lock()
	e.verifyRestart(ctx, n)
	e.upSince.Store(time.Now().UnixNano())
	e.gate.Unlock()
	time.Sleep(e.minUptime()) // the agent works a little before the next crash
	return true
}

// minUptime is the least time between a restart and the next crash: a
// quarter of the average spacing, within 100 ms..1 s.
func (e *engine) minUptime() time.Duration {
	d := e.sc.Duration.D() / time.Duration(4*max(e.sc.Crashes, 1))
	return min(max(d, 100*time.Millisecond), time.Second)
}

// verifyRestart checks the restore contract on the restarted agent's
// index while no call is in flight.
func (e *engine) verifyRestart(ctx context.Context, n int) {
	s, err := e.tgt.Snapshot(ctx, false)
	if err != nil {
		e.violate(invAgent, "restart", "", fmt.Sprintf("after restart #%d: %v", n, err), nil)
		return
	}
	byCID := make(map[string]*endpoint.Endpoint, len(s.Endpoints))
	for _, ep := range s.Endpoints {
		byCID[ep.ContainerID] = ep
	}
	lost := 0
	e.m.eachLive(func(p *pod) {
		cid := p.key().containerID()
		ep, ok := byCID[cid]
		switch {
		case p.has(flagLost):
		case !ok:
			lost++
			p.flags |= flagLost
			e.m.disownIP(p)
			e.m.record(p, evLost, resMissing, fmt.Sprintf("after restart #%d", n))
			e.violate(invEndpointLost, "pod "+cid, cid, fmt.Sprintf("%s (endpoint %d, %s) was acknowledged and not deleted, "+
				"but is missing after restart #%d", cid, p.epID, p.addr(), n), e.m.history(p))
		case ep.IPv4 != p.addr():
			e.violate(invEndpointDiffers, "pod "+cid, cid, fmt.Sprintf("%s came back from restart #%d with address %s, acknowledged %s",
				cid, n, ep.IPv4, p.addr()), e.m.history(p))
		case !slices.Equal(ep.Labels.Strings(), podLabels(p.shard)):
			e.violate(invEndpointDiffers, "pod "+cid, cid, fmt.Sprintf("%s came back from restart #%d with labels %v, acknowledged %v",
				cid, n, ep.Labels.Strings(), podLabels(p.shard)), e.m.history(p))
		}
	})
	for _, ep := range s.Endpoints {
		k, ok := parseContainerID(ep.ContainerID)
		if !ok {
			continue
		}
		if st, cur := e.m.classify(k); (!cur || st == podFree) && !e.m.isSuspect(k, flagCreateUnknown) {
			e.violate(invDeleteUndone, "pod "+ep.ContainerID, ep.ContainerID, fmt.Sprintf("%s is back after restart #%d, "+
				"but its DEL was acknowledged (or its ADD failed cleanly)", epName(ep), n), nil)
		}
	}
	if lost > 0 {
		e.note(fmt.Sprintf("restart #%d lost %d acknowledged endpoints", n, lost))
	}
}

// gcRunner is a target whose agent runs a garbage collection pass on
// demand.
type gcRunner interface {
	RunGC(ctx context.Context) error
}

// collectCrashLeftovers takes the settled findings and, after crashes,
// runs the garbage collector on the orphans among them: a crash between
// a new endpoint's realise and its state write leaves datapath state no
// endpoint state names (actors.writeAndRealize), which by design the
// GC's orphan passes remove. Two passes (an orphan is removed when two
// consecutive passes see it); each orphan they removed is counted as a
// crash leftover and its finding dropped, each they left stays. Without
// a crash every orphan stays a violation.
func (e *engine) collectCrashLeftovers(ctx context.Context, s *Snapshot, fs []finding) []finding {
	gc, ok := e.tgt.(gcRunner)
	if e.restarts.Load() == 0 || !ok {
		return fs
	}
	orphans := map[finding]endpoint.ID{}
	for id := range s.Realized {
		orphans[orphanFinding(id)] = id
	}
	found := false
	for _, f := range fs {
		_, orphan := orphans[f]
		found = found || orphan
	}
	if !found {
		return fs
	}
	for pass := 0; pass < 2; pass++ {
		if err := gc.RunGC(ctx); err != nil {
			e.note(fmt.Sprintf("crash leftovers: GC pass: %v", err))
			return fs
		}
	}
	after, err := e.tgt.Snapshot(ctx, true)
	if err != nil {
		e.note(fmt.Sprintf("crash leftovers: snapshot after GC: %v", err))
		return fs
	}
	kept := fs[:0]
	for _, f := range fs {
		id, orphan := orphans[f]
		if _, remains := after.Realized[id]; orphan && !remains {
			e.crashLeftovers.Add(1)
			e.note(fmt.Sprintf("crash leftover: the GC removed the datapath state of endpoint %d, which no endpoint state named", id))
			continue
		}
		kept = append(kept, f)
	}
	return kept
}
