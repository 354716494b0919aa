package sim

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// Options are the harness settings that are not part of a scenario.
type Options struct {
	// Dir holds the agent's socket and state directory; "" uses a
	// temporary directory, removed at the end, on a tmpfs when there is
	// one (/run, /dev/shm): the agent's default state directory is under
	// /var/run, a tmpfs on a node. The report names the filesystem.
	Dir string
	// AgentLog receives the agent's logs; nil drops them.
	AgentLog slog.Handler
	// Log receives the harness's own messages (phases, crashes); nil drops them.
	Log *slog.Logger
	// Progress receives a progress line every second; nil: none. With
	// ProgressTTY the line is rewritten in place.
	Progress    io.Writer
	ProgressTTY bool
	// CNIBinDir holds the membrane-cni binary (--datapath linux); ""
	// looks next to the running program, in ./bin and in PATH.
	CNIBinDir string
}

// Phases of a run.
const (
	phaseStart int32 = iota
	phaseRamp
	phaseChurn
	phaseSettle
	phaseDrain
	phaseDone
)

var phaseNames = [...]string{"start", "ramp-up", "churn", "settle", "drain", "done"}

// engine runs one scenario.
type engine struct {
	sc   Scenario
	opts Options
	log  *slog.Logger
	dir  string

	start time.Time
	m     *model
	rec   *recorder
	viol  *violations
	tgt   Target
	drv   Driver       // the API driver, or the CNI driver for --datapath linux
	gate  sync.RWMutex // held by every API call for reading; the crash controller locks it to verify a restart
	epoch atomic.Pointer[epoch]

	phase      atomic.Int32
	faultsOn   atomic.Bool
	limiter    atomic.Pointer[limiter]
	rampDone   chan struct{}
	rampOnce   sync.Once
	churnStart atomic.Int64 // unix nanoseconds
	churnEnd   atomic.Int64
	// churnCPU is the process's CPU time and the runtime's GC CPU time at
	// the start and end of the churn phase.
	churnCPU [2]cpuSample

	lifecycles      atomic.Uint64 // ADD acknowledged, then DEL acknowledged
	churnLifecycles atomic.Uint64 // of which during churn
	failedAdds      atomic.Uint64
	pendingDels     atomic.Int64 // the harness's delete queue: DELs not yet acknowledged
	stuckDels       atomic.Int64 // DELs given up on
	zombiesSwept    atomic.Uint64
	crashLeftovers  atomic.Uint64
	ipsSwept        atomic.Uint64
	restarts        atomic.Int32
	lastCrash       atomic.Int64 // unix nanoseconds, 0 if none
	upSince         atomic.Int64 // unix nanoseconds the agent last took calls; 0 while down
	livePeak        atomic.Int64
	indexPeak       atomic.Int64
	// transients: Report.MidTransients (guarded by evMu).
	transients map[string]int

	evMu   sync.Mutex // guards events and notes
	events []Event
	notes  []string

	timeline []Sample // written by the sampler only; read after it stopped

	pol atomic.Pointer[policyChurn] // set when the policy churn runs (policychurn.go)
	// l7 is set for a linux run with the real L7 proxy (faults.proxy_acks
	// > 0): the policy churn then writes HTTP rules too.
	l7 bool
}

// epoch is the agent incarnation calls are made against: a crash cancels
// it, which resets the calls in flight as a killed agent resets its
// connections.
type epoch struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// Event is a run-wide event (crash, restart, phase) for reports.
type Event struct {
	AtS  float64 `json:"at_s"`
	Kind string  `json:"kind"`
	Note string  `json:"note,omitempty"`
}

// Run runs sc against an in-process agent and reports what it measured
// and every invariant violation it found. It returns an error only when
// the run could not be carried out (bad scenario, agent failed to start).
func Run(ctx context.Context, sc Scenario, opts Options) (*Report, error) {
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	e, cleanup, err := newEngine(sc, opts)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	return e.run(ctx)
}

func newEngine(sc Scenario, opts Options) (*engine, func(), error) {
	cleanup := func() {}
	dir := opts.Dir
	if dir == "" {
		tmp, err := os.MkdirTemp(tmpfsBase(), "membrane-sim-")
		if err != nil {
			return nil, nil, fmt.Errorf("run: %w", err)
		}
		dir, cleanup = tmp, func() { _ = os.RemoveAll(tmp) }
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pool := netip.MustParsePrefix(sc.IPv4Range)
	cfg := agent.Config{
		Socket: filepath.Join(dir, "membrane.sock"), StateDir: filepath.Join(dir, "state"),
		IPv4Range: pool, Datapath: "fake", GCPercent: agent.DefaultGCPercent, // as membrane-agent's default
		Actors: actors.Config{IPAM: actors.IPAMConfig{Seed: sc.Seed},
			Endpoint: actors.EndpointConfig{ProxyWaitTimeout: sc.ProxyWaitTimeout.D()}},
	}
	cfg.API.RequestTimeout = sc.APIRequestTimeout.D()
	start := time.Now()
	e := &engine{sc: sc, opts: opts, log: log, dir: dir, start: start, rec: newRecorder(), viol: newViolations(),
		m: newModel(sc.slots(), pool, start), rampDone: make(chan struct{})}
	if sc.Datapath == "linux" {
		undo, err := e.setupLinux(cfg) // linux_linux.go
		if err != nil {
			cleanup()
			return nil, nil, fmt.Errorf("run: %w", err)
		}
		removeDir := cleanup
		cleanup = func() { undo(); removeDir() }
	} else {
		tgt := newInProcess(cfg, opts.AgentLog, sc.Seed)
		e.tgt = tgt
		e.drv = &apiDriver{c: tgt.Client(), rec: e.rec, gate: &e.gate, epoch: &e.epoch}
	}
	e.newEpoch()
	return e, cleanup, nil
}

func (e *engine) newEpoch() {
	ctx, cancel := context.WithCancel(context.Background())
	e.epoch.Store(&epoch{ctx: ctx, cancel: cancel})
}

func (e *engine) now() float64 { return time.Since(e.start).Seconds() }

func (e *engine) event(kind, note string) {
	e.evMu.Lock()
	e.events = append(e.events, Event{AtS: e.now(), Kind: kind, Note: note})
	e.evMu.Unlock()
	e.log.Info(kind, "at", fmt.Sprintf("%.2fs", e.now()), "note", note)
}

func (e *engine) note(s string) {
	e.evMu.Lock()
	e.notes = append(e.notes, s)
	e.evMu.Unlock()
}

func (e *engine) setPhase(p int32) {
	e.phase.Store(p)
	e.event("phase", phaseNames[p])
}

func (e *engine) phaseName() string { return phaseNames[e.phase.Load()] }

func (e *engine) run(ctx context.Context) (*Report, error) {
	g0 := runtime.NumGoroutine()
	if err := e.tgt.Start(ctx); err != nil {
		return nil, fmt.Errorf("run: start agent: %w", err)
	}
	e.upSince.Store(time.Now().UnixNano())
	procBase, _ := e.tgt.ProcessCount()
	heapBase := e.heapInUse()
	stopSampler := e.startSampler()
	e.setFaults(true)
	stopPolicyChurn := e.startPolicyChurn(ctx) // policychurn.go
	e.load(ctx)
	stopPolicyChurn()
	// Cancelling ctx ends the load early; settling and draining still run,
	// bounded by their own timeouts, so the agent is checked and left clean.
	ctx = context.WithoutCancel(ctx)
	e.setFaults(false)
	e.settle(ctx, "settled")
	heap, heapLive := e.heapPerEndpoint(heapBase)
	e.drain(ctx)
	e.settle(ctx, "drained")
	e.checkProcesses(procBase)
	stopSampler()
	e.setPhase(phaseDone)
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.tgt.Stop(sctx); err != nil {
		e.note("agent stop: " + err.Error())
	}
	e.checkGoroutines(g0)
	return e.report(heap, heapLive), nil
}

// load runs the ramp-up and the churn phase, with the crashes.
func (e *engine) load(ctx context.Context) {
	e.limiter.Store(newLimiter(e.sc.ArrivalRate))
	e.setPhase(phaseRamp)
	// Workers stop when the phase changes, after their current lifecycle;
	// an interrupt (ctx) only ends the phase early.
	wctx, stopWorkers := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWorkers()
	done := e.startWorkers(wctx)
	rampLimit := time.Duration(e.sc.Endpoints)*10*time.Millisecond + time.Minute
	select {
	case <-e.rampDone:
	case <-ctx.Done():
		e.note("interrupted during the ramp-up")
	case <-time.After(rampLimit):
		e.note(fmt.Sprintf("ramp-up stopped after %s with %d live endpoints of %d", rampLimit, e.m.liveCount(), e.sc.Endpoints))
	}
	e.limiter.Store(newLimiter(e.sc.ChurnRate))
	e.churnCPU[0] = sampleCPU()
	e.churnStart.Store(time.Now().UnixNano())
	e.setPhase(phaseChurn)
	cctx, stopCrashes := context.WithCancel(wctx)
	crashes := e.startCrashes(cctx)
	select {
	case <-time.After(e.sc.Duration.D()):
		// Every crash asked for happens: slow restarts may push the last
		// ones past the planned end, which then waits for them.
		select {
		case <-crashes:
		default:
			extra := time.Now()
			select {
			case <-crashes:
				e.note(fmt.Sprintf("churn extended by %s for the remaining crashes", time.Since(extra).Round(100*time.Millisecond)))
			case <-ctx.Done():
				e.note("interrupted during churn")
			}
		}
	case <-ctx.Done():
		e.note("interrupted during churn")
	}
	e.churnEnd.Store(time.Now().UnixNano())
	e.churnCPU[1] = sampleCPU()
	e.setPhase(phaseSettle)
	stopCrashes() // a crash under way still restarts the agent
	<-crashes
	e.waitWorkers(done, stopWorkers)
}

// waitWorkers waits for the workers to finish their lifecycles; DEL
// retries are bounded (delBudget), so this ends.
func (e *engine) waitWorkers(done <-chan struct{}, stop context.CancelFunc) {
	select {
	case <-done:
	case <-time.After(delBudget + e.sc.QuiesceTimeout.D()):
		e.note("workers did not finish; cancelling them")
		stop()
		<-done
	}
}

func (e *engine) setFaults(on bool) {
	e.faultsOn.Store(on)
	if on {
		e.tgt.SetFaults(e.sc.Faults)
	} else {
		e.tgt.SetFaults(Faults{})
	}
}

// settle waits for the agent to quiesce, sweeps what ambiguous failures
// left behind (kubelet and CNI GC would), and checks every invariant.
func (e *engine) settle(ctx context.Context, what string) {
	e.quiesce(ctx)
	if e.sweep(ctx) {
		e.quiesce(ctx)
	}
	s, err := e.settledSnapshot(ctx)
	if err != nil {
		e.violate(invAgent, "", "", fmt.Sprintf("%s: cannot read the agent: %v", what, err), nil)
		return
	}
	want := map[string]expectedPod{}
	e.m.eachLive(func(p *pod) {
		if !p.has(flagLost) {
			want[p.key().containerID()] = expectedPod{ip: p.addr(), labels: podLabels(p.shard)}
		}
	})
	for _, f := range e.collectCrashLeftovers(ctx, s, quiescentChecks(s, want)) {
		e.violateFinding(f, what, true)
	}
	for _, f := range e.endChecks(ctx, s) { // endchecks.go: policy, ipcache, linux datapath
		e.violateFinding(f, what, true)
	}
	if n := e.pendingDels.Load(); n > 0 {
		e.violate(invDeleteQueue, "dels", "", fmt.Sprintf("%s: %d DELs still pending", what, n), nil)
	}
}

// quiesce waits until every endpoint is ready, the worker pool is idle
// and no endpoint actor has messages waiting.
// settledSnapshot reads the agent once it is idle. Periodic background
// work (the ipcache sync, a garbage collection pass) may take a datapath
// worker between quiesce and the read: that is not work left behind, so
// the read is retried after another quiesce (a few times; what stays
// busy is reported by the checks).
func (e *engine) settledSnapshot(ctx context.Context) (*Snapshot, error) {
	for attempt := 0; ; attempt++ {
		s, err := e.tgt.Snapshot(ctx, true)
		if err != nil || idle(s) || attempt == 3 {
			return s, err
		}
		e.quiesce(ctx)
	}
}

func (e *engine) quiesce(ctx context.Context) {
	deadline := time.Now().Add(e.sc.QuiesceTimeout.D())
	for {
		s, err := e.tgt.Snapshot(ctx, false)
		if err == nil && allReady(s) {
			if d, err := e.tgt.Snapshot(ctx, true); err == nil && idle(d) {
				return
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			e.note(fmt.Sprintf("the agent did not settle within %s (the checks below say what remained)", e.sc.QuiesceTimeout.D()))
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func allReady(s *Snapshot) bool {
	for _, ep := range s.Endpoints {
		if ep.State != "ready" {
			return false
		}
	}
	return true
}

func idle(s *Snapshot) bool {
	if s.Pool != nil && (s.Pool.Busy > 0 || s.Pool.Backlog > 0) {
		return false
	}
	for _, a := range s.Actors {
		if a.Mailbox > 0 {
			return false
		}
	}
	return true
}

// drain deletes every live pod, with the workers.
func (e *engine) drain(ctx context.Context) {
	e.setPhase(phaseDrain)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	e.waitWorkers(e.startWorkers(wctx), stop)
}

// podLabels are the labels of a pod in shard n.
func podLabels(shard uint16) []string {
	ls, err := labels.ParseSet([]string{"k8s:app=sim", fmt.Sprintf("k8s:shard=%d", shard), nsLabel})
	if err != nil {
		panic(err) // constant labels
	}
	return ls.Strings()
}

// heapInUse is the live heap after collecting garbage, with the client's
// idle connections closed (the agent's side of them goes too).
func (e *engine) heapInUse() uint64 {
	e.tgt.Client().Close()
	time.Sleep(100 * time.Millisecond)
	var ms runtime.MemStats
	for i := 0; i < 3; i++ {
		runtime.GC()
	}
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// heapPerEndpoint measures the heap the live endpoints add, per endpoint,
// the way pkg/agent/api's BenchmarkHeapPerEndpoint does. The harness allocated
// its own tables before the baseline.
func (e *engine) heapPerEndpoint(base uint64) (float64, int) {
	live := e.m.liveCount()
	if live == 0 {
		return 0, 0
	}
	// A crashed agent stays reachable until its hung requests time out.
	if last := e.lastCrash.Load(); last > 0 {
		if d := time.Until(time.Unix(0, last).Add(e.sc.APIRequestTimeout.D() + time.Second)); d > 0 {
			e.note(fmt.Sprintf("heap measured %s later, once the last crashed agent could be collected", d.Round(time.Second)))
			time.Sleep(d)
		}
	}
	now := e.heapInUse()
	if now < base {
		return 0, live
	}
	return float64(now-base) / float64(live), live
}

// checkProcesses compares the actor processes of the drained agent with
// those of the fresh one: endpoint actors and futures must all be gone.
func (e *engine) checkProcesses(base int) {
	var n int
	var err error
	for i := 0; i < 40; i++ { // futures of the last calls may take a moment
		if n, err = e.tgt.ProcessCount(); err == nil && n <= base {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		e.violate(invAgent, "", "", "counting actor processes: "+err.Error(), nil)
		return
	}
	var names []string
	if pn, ok := e.tgt.(interface{ ProcessNames() []string }); ok {
		names = pn.ProcessNames()
	}
	e.violate(invLeakedActors, "processes", "", fmt.Sprintf("%d actor processes after the drain, %d in a fresh agent: %v",
		n, base, names), nil)
}
