package sim

import (
	"context"
	"fmt"
	"time"
)

// sampleEvery is the period of the timeline, the mid-run checks and the
// progress line.
const sampleEvery = time.Second

// Sample is one point of the run's timeline.
type Sample struct {
	// T is seconds since the run started.
	T     float64 `json:"t"`
	Phase string  `json:"phase"`
	// Live is the pods whose ADD was acknowledged and that are not being
	// deleted; Endpoints and Ready are what the agent's index holds (-1
	// while the agent is down).
	Live      int `json:"live"`
	Endpoints int `json:"endpoints"`
	Ready     int `json:"ready"`
	// OpsPerS counts API calls completed, LifecyclesPerS pods deleted after
	// an acknowledged ADD, during the last period.
	OpsPerS        float64 `json:"ops_per_s"`
	LifecyclesPerS float64 `json:"lifecycles_per_s"`
	// PutP99 and DeleteP99 are the period's 99th percentiles, in ms.
	PutP99     float64 `json:"put_p99_ms"`
	DeleteP99  float64 `json:"delete_p99_ms"`
	Violations int     `json:"violations"`
	// Resources are read every resourceEvery samples (nil otherwise).
	Resources *Resources `json:"resources,omitempty"`
}

// sampler is the state carried from one sample to the next.
type sampler struct {
	last       time.Time
	ops        uint64
	lifecycles uint64
	put, del   []uint64
	// seen counts the consecutive samples each mid-run finding (by
	// invariant and key) was in; one seen twice in a row (finding.samples
	// times where set) is a violation.
	seen map[string]int
	n    int // samples taken
}

func (e *engine) startSampler() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	s := &sampler{last: time.Now(), put: make([]uint64, nBuckets), del: make([]uint64, nBuckets), seen: map[string]int{}}
	go func() {
		defer close(done)
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				e.sample(ctx, s)
			}
		}
	}()
	return func() {
		cancel()
		<-done
		if e.opts.Progress != nil && e.opts.ProgressTTY {
			fmt.Fprintln(e.opts.Progress)
		}
	}
}

func (e *engine) sample(ctx context.Context, s *sampler) {
	now := time.Now()
	dt := now.Sub(s.last).Seconds()
	s.last = now
	ops, lcs := e.rec.total(), e.lifecycles.Load()
	put, del := e.rec.ok[opPut].counts(), e.rec.ok[opDelete].counts()
	smp := Sample{T: e.now(), Phase: e.phaseName(), Live: e.m.liveCount(), Endpoints: -1, Ready: -1,
		OpsPerS: float64(ops-s.ops) / dt, LifecyclesPerS: float64(lcs-s.lifecycles) / dt,
		PutP99: quantile(diff(put, s.put), 0.99), DeleteP99: quantile(diff(del, s.del), 0.99)}
	s.ops, s.lifecycles, s.put, s.del = ops, lcs, put, del
	if snap, err := e.tgt.Snapshot(ctx, false); err == nil {
		smp.Endpoints = len(snap.Endpoints)
		for _, ep := range snap.Endpoints {
			if ep.State == "ready" {
				smp.Ready++
			}
		}
		if int64(smp.Endpoints) > e.indexPeak.Load() {
			e.indexPeak.Store(int64(smp.Endpoints))
		}
		if p := e.phase.Load(); p == phaseRamp || p == phaseChurn || p == phaseDrain {
			e.midCheck(snap, s)
		}
	}
	smp.Violations = e.viol.count()
	if s.n%resourceEvery == 0 {
		smp.Resources = e.readResources()
	}
	s.n++
	e.timeline = append(e.timeline, smp)
	e.progress(smp)
}

// midCheck reports the findings also present in the previous sample: a
// state that lasted a whole sampling period is not a message in flight
// (claimSamples periods where two actors' rows meet). The longest run
// of a finding that did not become a violation is kept per invariant
// (Report.MidTransients).
func (e *engine) midCheck(snap *Snapshot, s *sampler) {
	cur := map[string]int{}
	for _, f := range midChecks(snap) {
		k := f.inv + "|" + f.key
		n := s.seen[k] + 1
		cur[k] = n
		if n >= midSamples(f) {
			e.violateFinding(f, e.phaseName(), false)
		} else if n > 1 {
			e.noteTransient(f.inv, n)
		}
	}
	s.seen = cur
}

// noteTransient records a mid-run finding that lasted n samples without
// becoming a violation.
func (e *engine) noteTransient(inv string, n int) {
	e.evMu.Lock()
	defer e.evMu.Unlock()
	if e.transients == nil {
		e.transients = map[string]int{}
	}
	e.transients[inv] = max(e.transients[inv], n)
}

func diff(now, before []uint64) []uint64 {
	out := make([]uint64, len(now))
	for i := range now {
		out[i] = now[i] - before[i]
	}
	return out
}

func (e *engine) progress(s Sample) {
	w := e.opts.Progress
	if w == nil {
		return
	}
	agentView := "agent down"
	if s.Endpoints >= 0 {
		agentView = fmt.Sprintf("index %d ready %d", s.Endpoints, s.Ready)
	}
	line := fmt.Sprintf("%6.1fs %-8s live %6d (%s) | %6.0f ops/s %5.0f lifecycles/s | p99 put %.1fms del %.1fms | restarts %d/%d | violations %d",
		s.T, s.Phase, s.Live, agentView, s.OpsPerS, s.LifecyclesPerS, s.PutP99, s.DeleteP99, e.restarts.Load(), e.sc.Crashes, s.Violations)
	if e.opts.ProgressTTY {
		fmt.Fprintf(w, "\r\033[K%s", line)
		return
	}
	fmt.Fprintln(w, line)
}
