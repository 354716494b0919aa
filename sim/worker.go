package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// delBudget bounds how long a DEL (or relabel) is retried while the agent
// is up before the harness gives up on it and reports it; time the agent
// spends crashed or restoring does not count, as kubelet retries forever.
const delBudget = 30 * time.Second

// retryExpired reports whether a retry loop that started at start has
// used its budget of agent uptime.
func (e *engine) retryExpired(ctx context.Context, start time.Time) bool {
	if ctx.Err() != nil {
		return true
	}
	up := e.upSince.Load()
	if up == 0 {
		return false // down: wait for the restart
	}
	from := time.Unix(0, up)
	if start.After(from) {
		from = start
	}
	return time.Since(from) > delBudget
}

// limiter spaces operations evenly at a rate; nil means unlimited.
type limiter struct {
	interval int64 // nanoseconds
	next     atomic.Int64
}

func newLimiter(perSecond float64) *limiter {
	if perSecond <= 0 {
		return nil
	}
	return &limiter{interval: int64(float64(time.Second) / perSecond)}
}

// wait blocks until the caller's turn; missed turns do not accumulate.
func (l *limiter) wait(ctx context.Context) {
	if l == nil {
		return
	}
	for {
		cur, now := l.next.Load(), time.Now().UnixNano()
		slot := max(cur, now)
		if l.next.CompareAndSwap(cur, slot+l.interval) {
			if d := time.Duration(slot - now); d > 0 {
				sleepCtx(ctx, d)
			}
			return
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// startWorkers starts the scenario's workers for the current phase; the
// returned channel closes when all have returned.
func (e *engine) startWorkers(ctx context.Context) <-chan struct{} {
	var wg sync.WaitGroup
	for w := 0; w < e.sc.Workers; w++ {
		wg.Add(1)
		rng := rand.New(rand.NewPCG(e.sc.Seed, uint64(e.phase.Load())<<32|uint64(w)))
		go func() {
			defer wg.Done()
			e.worker(ctx, rng)
		}()
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	return done
}

// worker runs lifecycles until its phase ends.
func (e *engine) worker(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		switch e.phase.Load() {
		case phaseRamp:
			e.rampStep(ctx, rng)
		case phaseChurn:
			e.churnStep(ctx, rng)
		case phaseDrain:
			p := e.m.takeLive(rng, podDeleting)
			if p == nil {
				return
			}
			e.m.reserved.Add(-1)
			e.deletePod(ctx, rng, p)
		default:
			return
		}
	}
}

// rampStep adds one pod while the target is not reached.
func (e *engine) rampStep(ctx context.Context, rng *rand.Rand) {
	if e.m.reserved.Add(1) > int64(e.sc.Endpoints) {
		e.m.reserved.Add(-1)
		e.rampOnce.Do(func() { close(e.rampDone) })
		time.Sleep(time.Millisecond) // until the phase changes
		return
	}
	e.limiter.Load().wait(ctx)
	e.addLifecycle(ctx, rng)
}

// churnStep is one lifecycle of churn: delete a random live pod, create a
// new one (with its regenerations), maybe relabel a random live pod.
func (e *engine) churnStep(ctx context.Context, rng *rand.Rand) {
	e.limiter.Load().wait(ctx)
	if e.phase.Load() != phaseChurn {
		return
	}
	// Each turn creates one pod, deleting random live ones to make room at
	// the target (so deletions match creations, and a failed ADD is
	// replaced rather than followed by one more deletion). Concurrent
	// workers may take the room one made; then it deletes again.
	target := int64(e.sc.Endpoints)
	for e.phase.Load() == phaseChurn {
		if e.m.reserved.Load() >= target {
			if p := e.m.takeLive(rng, podDeleting); p != nil {
				e.m.reserved.Add(-1)
				e.deletePod(ctx, rng, p)
			}
		}
		if e.m.reserved.Add(1) <= target {
			e.addLifecycle(ctx, rng)
			break
		}
		e.m.reserved.Add(-1)
		time.Sleep(100 * time.Microsecond)
	}
	if e.sc.LabelChurn > 0 && rng.Float64() < e.sc.LabelChurn {
		if q := e.m.takeLive(rng, podBusy); q != nil {
			e.relabel(ctx, rng, q)
			e.m.putLive(q)
		}
	}
}

// opCtx gives a pod operation its deadline: with the client-timeout
// fault, a short one drawn below Faults.ClientTimeout.
func (e *engine) opCtx(ctx context.Context, rng *rand.Rand) (context.Context, context.CancelFunc) {
	f := e.sc.Faults
	if !e.faultsOn.Load() || f.ClientTimeoutRate <= 0 || rng.Float64() >= f.ClientTimeoutRate {
		return ctx, func() {}
	}
	d := time.Duration(rng.Int64N(int64(f.ClientTimeout.D())) + 1)
	return context.WithTimeout(ctx, d)
}

func (e *engine) ref(p *pod) PodRef {
	k := p.key()
	return PodRef{Namespace: simNamespace, Name: k.podName(), ContainerID: k.containerID(), IPv4: p.addr(),
		Labels: []string{"k8s:app=sim", "k8s:shard=" + strconv.Itoa(int(p.shard)), nsLabel}}
}

// addLifecycle creates a pod (one reserved slot is already counted): ADD,
// then its regenerations; a failed ADD is followed by a DEL.
func (e *engine) addLifecycle(ctx context.Context, rng *rand.Rand) {
	p := e.m.newPod()
	if p == nil {
		e.m.reserved.Add(-1)
		time.Sleep(time.Millisecond)
		return
	}
	p.shard = uint16(rng.IntN(e.sc.Identities))
	if !e.addPod(ctx, rng, p) {
		e.m.reserved.Add(-1)
		e.failedAdds.Add(1)
		e.deletePod(ctx, rng, p)
		return
	}
	for i := 0; i < e.sc.Regenerations; i++ {
		e.regenerate(ctx, rng, p)
	}
	e.m.putLive(p)
	if n := int64(e.m.liveCount()); n > e.livePeak.Load() {
		e.livePeak.Store(n) // approximate under races; the index peak is sampled too
	}
}

// addPod runs the ADD and records what it established.
func (e *engine) addPod(ctx context.Context, rng *rand.Rand, p *pod) bool {
	cctx, cancel := e.opCtx(ctx, rng)
	res, err := e.drv.Add(cctx, e.ref(p))
	cancel()
	_, code := classify(err)
	if !res.IPv4.IsValid() {
		e.m.record(p, opIPAMAllocate, resultOf(err), code)
	} else {
		e.m.record(p, opIPAMAllocate, resOK, res.IPv4.String())
		p.ip = addrToU32(res.IPv4)
		if prev := e.m.ownIP(p, p.ip); prev != 0 {
			gen, st := e.m.pods[prev-1].load()
			e.violate(invIPOwnedTwice, "ip "+res.IPv4.String(), p.key().containerID(),
				fmt.Sprintf("%s was given to %s while %s (%s) held it", res.IPv4, p.key().containerID(),
					makeKey(prev-1, gen).containerID(), st), e.m.history(p))
		}
		e.m.record(p, opPut, resultOf(err), code)
	}
	if err != nil {
		if res.IPAMUnknown {
			p.flags |= flagIPAMUnknown
		}
		if res.CreateUnknown {
			p.flags |= flagCreateUnknown
		}
		return false
	}
	p.flags |= flagAddAcked
	p.epID = uint16(res.Endpoint)
	return true
}

func resultOf(err error) result {
	r, _ := classify(err)
	return r
}

// deletePod is kubelet's DEL: retried until the agent acknowledges it
// (an endpoint already gone is success), within delBudget. A DEL that
// finds no endpoint for a pod whose ADD was acknowledged means the agent
// lost it.
func (e *engine) deletePod(ctx context.Context, rng *rand.Rand, p *pod) {
	e.pendingDels.Add(1)
	defer e.pendingDels.Add(-1)
	p.setState(podDeleting)
	e.m.disownIP(p)
	start := time.Now()
	backoff := 5 * time.Millisecond
	for {
		// Only the pod's own DELs free its address (the agent keeps it when
		// a create fails), so the address is still the pod's unless an
		// earlier DEL may have released it; then the owner-checked sweep
		// takes care of it.
		ref := e.ref(p)
		if p.has(flagAddAcked | flagDelUnknown) {
			ref.IPv4 = netip.Addr{}
		}
		cctx, cancel := e.opCtx(ctx, rng)
		res, err := e.drv.Del(cctx, ref)
		cancel()
		r, code := classify(err)
		e.m.record(p, opDelete, r, code)
		if err == nil {
			if !res.Found && p.has(flagAddAcked) && !p.has(flagDelUnknown|flagLost) {
				e.violate(invEndpointLost, "pod "+p.key().containerID(), p.key().containerID(),
					fmt.Sprintf("DEL of %s found no endpoint, but its ADD was acknowledged (endpoint %d) and it was never deleted",
						p.key().containerID(), p.epID), e.m.history(p))
			}
			if !res.Found && p.ip != 0 && !ref.IPv4.IsValid() {
				p.flags |= flagIPAMUnknown // the sweep releases it if it is still the pod's
			}
			break
		}
		if ambiguous(err) {
			p.flags |= flagDelUnknown
		}
		if e.retryExpired(ctx, start) {
			e.stuckDels.Add(1)
			e.violate(invDeleteQueue, "pod "+p.key().containerID(), p.key().containerID(),
				fmt.Sprintf("DEL of %s not acknowledged after %s of agent uptime: %v (%s)", p.key().containerID(), delBudget, err,
					e.describeIP(ctx, p.addr())), e.m.history(p))
			return // the slot stays taken
		}
		sleepCtx(ctx, backoff+time.Duration(rng.Int64N(int64(backoff))))
		backoff = min(2*backoff, 500*time.Millisecond)
	}
	if p.has(flagAddAcked) {
		e.lifecycles.Add(1)
		if e.phase.Load() == phaseChurn {
			e.churnLifecycles.Add(1)
		}
	}
	if f := p.flags & (flagCreateUnknown | flagIPAMUnknown); f != 0 {
		e.m.suspect(p.key(), f)
	}
	e.m.freePod(p)
}

// regenerate asks for one regeneration. A failed regeneration is the
// agent's to retry; only a missing endpoint matters here.
func (e *engine) regenerate(ctx context.Context, rng *rand.Rand, p *pod) {
	cctx, cancel := e.opCtx(ctx, rng)
	err := e.drv.Regenerate(cctx, e.ref(p))
	cancel()
	r, code := classify(err)
	e.m.record(p, opRegenerate, r, code)
	e.checkNotLost(p, err)
}

func (e *engine) checkNotLost(p *pod, err error) {
	if isNotFound(err) && !p.has(flagLost) {
		p.flags |= flagLost
		e.m.disownIP(p)
		e.violate(invEndpointLost, "pod "+p.key().containerID(), p.key().containerID(),
			fmt.Sprintf("%s: endpoint %d of an acknowledged ADD is not found", p.key().containerID(), p.epID), e.m.history(p))
	}
}

// relabel moves a pod to another shard (new identity, regeneration),
// retried until acknowledged, as the Kubernetes watcher would.
func (e *engine) relabel(ctx context.Context, rng *rand.Rand, p *pod) {
	if p.has(flagLost) || e.sc.Identities < 2 {
		return
	}
	next := uint16(rng.IntN(e.sc.Identities - 1))
	if next >= p.shard {
		next++
	}
	add := []string{"k8s:shard=" + strconv.Itoa(int(next))}
	del := []string{"k8s:shard=" + strconv.Itoa(int(p.shard))}
	start := time.Now()
	for backoff := 5 * time.Millisecond; ; backoff = min(2*backoff, 500*time.Millisecond) {
		cctx, cancel := e.opCtx(ctx, rng)
		err := e.drv.Relabel(cctx, e.ref(p), add, del)
		cancel()
		r, code := classify(err)
		e.m.record(p, opRelabel, r, code)
		switch {
		case err == nil:
			p.shard = next
			return
		case isNotFound(err):
			e.checkNotLost(p, err)
			return
		case e.retryExpired(ctx, start):
			e.violate(invEndpointDiffers, "pod "+p.key().containerID(), p.key().containerID(),
				fmt.Sprintf("relabel of %s not acknowledged after %s of agent uptime: %v", p.key().containerID(), delBudget, err), e.m.history(p))
			return
		}
		sleepCtx(ctx, backoff)
	}
}

// violate records a violation found now.
func (e *engine) violate(inv, key, subject, msg string, history []string) {
	if e.viol.add(key, Violation{Invariant: inv, AtS: e.now(), Phase: e.phaseName(), Endpoint: subject, Message: msg, History: history}) {
		e.log.Warn("violation", "invariant", inv, "endpoint", subject, "message", msg)
	}
}

// violateFinding records a finding of a check, with the pod's history:
// any pod's when the pods are quiet (settled: no worker owns any), a live
// pod's otherwise.
func (e *engine) violateFinding(f finding, phase string, quiet bool) {
	var hist []string
	if k, ok := parseContainerID(f.cid); ok {
		if st, cur := e.m.classify(k); quiet && cur && st != podFree {
			hist = e.m.history(&e.m.pods[k.slot()])
		} else if !quiet {
			hist = e.m.liveHistory(k)
		}
	}
	e.violate(f.inv, f.key, f.cid, phase+": "+f.msg, hist)
}

// describeIP says what the agent's index holds about an address, for
// violation messages.
func (e *engine) describeIP(ctx context.Context, ip netip.Addr) string {
	if !ip.IsValid() {
		return "address unknown"
	}
	s, err := e.tgt.Snapshot(ctx, false)
	if err != nil {
		return "index unreadable: " + err.Error()
	}
	var parts []string
	for _, r := range s.IPs {
		if r.IP == ip {
			parts = append(parts, fmt.Sprintf("index: %s allocated to %q, claimed by endpoint %d held by %q", ip, r.Owner, r.Endpoint, r.Holder))
		}
	}
	if len(parts) == 0 {
		parts = append(parts, fmt.Sprintf("index: %s not allocated", ip))
	}
	for _, ep := range s.Endpoints {
		if ep.IPv4 == ip || ep.IPv6 == ip {
			parts = append(parts, fmt.Sprintf("%s uses it, state %s", epName(ep), ep.State))
		}
	}
	return strings.Join(parts, "; ")
}
