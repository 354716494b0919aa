package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime"
	"strings"
	"time"
)

// Report is what a run measured and found. Its JSON form is --report's.
type Report struct {
	Scenario Scenario  `json:"scenario"`
	Started  time.Time `json:"started"`
	// WallS is the whole run; RampS the ramp-up; ChurnS the churn phase.
	WallS  float64 `json:"wall_s"`
	RampS  float64 `json:"ramp_s"`
	ChurnS float64 `json:"churn_s"`
	// Lifecycles counts pods deleted after an acknowledged ADD (create,
	// regenerations, delete); LifecyclesPerSecond is the churn phase's
	// rate, LifecyclesPerSecondMin its slowest 5 s window.
	Lifecycles             uint64  `json:"lifecycles"`
	LifecyclesPerSecond    float64 `json:"lifecycles_per_second"`
	LifecyclesPerSecondMin float64 `json:"lifecycles_per_second_min_5s"`
	// OpsPerSecond is API calls per second during churn.
	OpsPerSecond float64 `json:"ops_per_second"`
	// CPUMsPerLifecycle is the process's CPU time (agent and harness: the
	// kubelet-like clients run in it too) per lifecycle during churn, a
	// figure the machine's other load barely moves; GCCPUFraction the
	// garbage collector's share of the CPU time the Go runtime used then
	// (its own estimates, /cpu/classes in runtime/metrics, idle-time
	// marking included).
	CPUMsPerLifecycle float64 `json:"cpu_ms_per_lifecycle"`
	GCCPUFraction     float64 `json:"gc_cpu_fraction"`
	// FailedAdds are ADDs that failed (each followed by a DEL).
	FailedAdds uint64 `json:"failed_adds"`
	// LiveEndpointsPeak is the most pods live at once (acknowledged ADD,
	// not deleted); IndexEndpointsPeak the most endpoints the index held.
	LiveEndpointsPeak  int `json:"live_endpoints_peak"`
	IndexEndpointsPeak int `json:"index_endpoints_peak"`
	// HeapBytesPerLiveEndpoint is the heap the live endpoints add, per
	// endpoint, measured on the settled agent with HeapLiveEndpoints live.
	HeapBytesPerLiveEndpoint float64 `json:"heap_bytes_per_live_endpoint"`
	HeapLiveEndpoints        int     `json:"heap_live_endpoints"`
	Restarts                 int     `json:"restarts"`
	// Violations lists the first violations with details; the totals
	// count them all.
	Violations            []Violation    `json:"violations"`
	ViolationsTotal       int            `json:"violations_total"`
	ViolationsByInvariant map[string]int `json:"violations_by_invariant"`
	// MidTransients is, per invariant, the most consecutive mid-run
	// samples a finding lasted without becoming a violation (see
	// claimSamples).
	MidTransients map[string]int      `json:"mid_transients,omitempty"`
	LatencyMS     map[string]*OpStats `json:"latency_ms"`
	Regenerations RegenStats          `json:"regenerations"`
	ProxyTimeouts uint64              `json:"proxy_timeouts"`
	// IndexWrites counts the agent's index commits over the whole run.
	IndexWrites IndexWrites `json:"index_writes"`
	// ZombiesSwept and AddressesSwept are what the final sweeps removed
	// after ambiguous failures; DatapathLeftToGC is how many endpoints'
	// datapath removal the agent gave up on.
	ZombiesSwept     uint64 `json:"zombies_swept"`
	AddressesSwept   uint64 `json:"addresses_swept"`
	DatapathLeftToGC int    `json:"datapath_left_to_gc"`
	// CrashLeftoversCollected is how many endpoints' datapath state a
	// crash left with no endpoint state naming it (the realise done,
	// the state write not durable) and the garbage collector removed.
	CrashLeftoversCollected uint64   `json:"crash_leftovers_collected"`
	PolicyChurn             string   `json:"policy_churn,omitempty"`
	Notes                   []string `json:"notes,omitempty"`
	Events                  []Event  `json:"events"`
	// Resources are the churn phase's resource slopes (a soak's
	// verdict: flat); nil when the phase was too short to fit.
	Resources *ResourceSlopes `json:"resource_slopes,omitempty"`
	Timeline  []Sample        `json:"timeline"`
	Host      Host            `json:"host"`
}

// IndexWrites is how many row changes the index writer committed in how
// many transactions: rows per transaction is how well it batches.
type IndexWrites struct {
	Rows         uint64 `json:"rows"`
	Transactions uint64 `json:"transactions"`
}

// RegenStats compares regenerations requested with those run: requests
// coalesce into at most one pending regeneration per endpoint.
type RegenStats struct {
	Requested uint64 `json:"requested"`
	Run       uint64 `json:"run"`
	Failed    uint64 `json:"failed"`
	Coalesced uint64 `json:"coalesced"`
}

// Host describes where the run happened.
type Host struct {
	GoVersion  string `json:"go_version"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	NumCPU     int    `json:"num_cpu"`
	OS         string `json:"os"`
	// StateFS is the filesystem of the agent's state directory (tmpfs,
	// ext4, ...): its syncs and metadata calls are a large part of a
	// lifecycle's cost on a disk.
	StateFS string `json:"state_fs"`
}

func (e *engine) report(heap float64, heapLive int) *Report {
	r := &Report{Scenario: e.sc, Started: e.start, WallS: e.now(), Lifecycles: e.lifecycles.Load(), FailedAdds: e.failedAdds.Load(),
		LiveEndpointsPeak: int(e.livePeak.Load()), IndexEndpointsPeak: int(e.indexPeak.Load()),
		HeapBytesPerLiveEndpoint: heap, HeapLiveEndpoints: heapLive, Restarts: int(e.restarts.Load()),
		LatencyMS: e.rec.stats(), ZombiesSwept: e.zombiesSwept.Load(), CrashLeftoversCollected: e.crashLeftovers.Load(), AddressesSwept: e.ipsSwept.Load(),
		Host: Host{GoVersion: runtime.Version(), GOMAXPROCS: runtime.GOMAXPROCS(0), NumCPU: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, StateFS: fsType(e.dir)}}
	r.Violations, r.ViolationsByInvariant, r.ViolationsTotal = e.viol.snapshot()
	if cs, ce := e.churnStart.Load(), e.churnEnd.Load(); cs > 0 && ce > cs {
		r.RampS = time.Unix(0, cs).Sub(e.start).Seconds()
		r.ChurnS = time.Duration(ce - cs).Seconds()
		r.LifecyclesPerSecond = float64(e.churnLifecycles.Load()) / r.ChurnS
	}
	r.LifecyclesPerSecondMin, r.OpsPerSecond = churnRates(e.timeline)
	r.CPUMsPerLifecycle, r.GCCPUFraction = cpuPerLifecycle(e.churnCPU, e.churnLifecycles.Load())
	c := e.tgt.Counters()
	r.Regenerations = RegenStats{Requested: c.RegenerationsRequested, Run: c.RegenerationsRun, Failed: c.RegenerationsFailed}
	if c.RegenerationsRequested > c.RegenerationsRun {
		r.Regenerations.Coalesced = c.RegenerationsRequested - c.RegenerationsRun
	}
	r.ProxyTimeouts = c.ProxyTimeouts
	r.IndexWrites = IndexWrites{Rows: c.IndexRows, Transactions: c.IndexTransactions}
	r.PolicyChurn = e.policySummary() // policychurn.go
	if in, ok := e.tgt.(interface{ hookLeftToGC() int }); ok {
		r.DatapathLeftToGC = in.hookLeftToGC()
	}
	e.evMu.Lock()
	r.Events, r.Notes = append([]Event{}, e.events...), append([]string{}, e.notes...)
	r.MidTransients = maps.Clone(e.transients)
	e.evMu.Unlock()
	r.Timeline = e.timeline
	r.Resources = resourceSlopes(e.timeline)
	if r.Violations == nil {
		r.Violations = []Violation{}
	}
	return r
}

// churnRates returns the slowest 5-sample lifecycle rate and the mean
// operation rate over the churn samples. A sample covers the second
// before it, so the first sample tagged churn covers mostly ramp-up (no
// lifecycle ends there): only samples whose whole interval is churn
// count, unless there are none.
func churnRates(tl []Sample) (minLC, ops float64) {
	var churn, all []Sample
	for i, s := range tl {
		if s.Phase != phaseNames[phaseChurn] {
			continue
		}
		all = append(all, s)
		if i > 0 && tl[i-1].Phase == s.Phase {
			churn = append(churn, s)
		}
	}
	if len(churn) == 0 {
		churn = all
	}
	if len(churn) == 0 {
		return 0, 0
	}
	w := min(5, len(churn))
	minLC = -1
	for i := 0; i+w <= len(churn); i++ {
		sum := 0.0
		for _, s := range churn[i : i+w] {
			sum += s.LifecyclesPerS
		}
		if avg := sum / float64(w); minLC < 0 || avg < minLC {
			minLC = avg
		}
	}
	minLC = max(minLC, 0)
	for _, s := range churn {
		ops += s.OpsPerS
	}
	return minLC, ops / float64(len(churn))
}

// OK reports whether the run found no violation.
func (r *Report) OK() bool { return r.ViolationsTotal == 0 }

// WriteJSONFile writes the report as indented JSON.
func (r *Report) WriteJSONFile(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// WriteText writes the human-readable report.
func (r *Report) WriteText(w io.Writer) {
	sc := r.Scenario
	fmt.Fprintf(w, "membrane-sim: scenario %q, seed %d, %d endpoints, %d workers, %s of churn, %d crashes, datapath %s\n",
		sc.Name, sc.Seed, sc.Endpoints, sc.Workers, sc.Duration.D(), sc.Crashes, sc.Datapath)
	f := sc.Faults
	fmt.Fprintf(w, "faults: datapath errors %.3g, slow datapath %.3g (+%s), proxy acks %d lost %.3g, client timeouts %.3g (<%s)\n",
		f.DatapathErrorRate, f.SlowDatapathRate, f.SlowDatapathDelay.D(), f.ProxyAcks, f.ProxyAckDropRate, f.ClientTimeoutRate, f.ClientTimeout.D())
	fs := r.Host.StateFS
	if fs == "" {
		fs = "an unknown filesystem"
	}
	fmt.Fprintf(w, "host: %s, GOMAXPROCS %d, %d CPUs, state on %s\n\n", r.Host.GoVersion, r.Host.GOMAXPROCS, r.Host.NumCPU, fs)
	fmt.Fprintf(w, "time:            %.1fs (ramp-up %.1fs, churn %.1fs)\n", r.WallS, r.RampS, r.ChurnS)
	fmt.Fprintf(w, "lifecycles:      %d total, %.0f/s during churn (slowest 5s: %.0f/s), %d failed ADDs\n",
		r.Lifecycles, r.LifecyclesPerSecond, r.LifecyclesPerSecondMin, r.FailedAdds)
	fmt.Fprintf(w, "API calls:       %.0f/s during churn\n", r.OpsPerSecond)
	if r.CPUMsPerLifecycle > 0 {
		fmt.Fprintf(w, "CPU:             %.2f ms per lifecycle (agent and clients); GC %.0f%% of the runtime's CPU\n", r.CPUMsPerLifecycle, 100*r.GCCPUFraction)
	}
	fmt.Fprintf(w, "live endpoints:  peak %d (index peak %d)\n", r.LiveEndpointsPeak, r.IndexEndpointsPeak)
	fmt.Fprintf(w, "heap:            %.0f bytes per live endpoint (%d live, settled)\n", r.HeapBytesPerLiveEndpoint, r.HeapLiveEndpoints)
	fmt.Fprintf(w, "regenerations:   %d requested, %d run (%d coalesced), %d failed; %d proxy timeouts\n",
		r.Regenerations.Requested, r.Regenerations.Run, r.Regenerations.Coalesced, r.Regenerations.Failed, r.ProxyTimeouts)
	if t := r.IndexWrites.Transactions; t > 0 {
		fmt.Fprintf(w, "index writes:    %d rows in %d transactions (%.1f rows each)\n", r.IndexWrites.Rows, t, float64(r.IndexWrites.Rows)/float64(t))
	}
	if rs := r.Resources; rs != nil {
		pins := "-"
		if rs.Last.Pins >= 0 {
			pins = fmt.Sprintf("%d -> %d (%+.2f/min)", rs.First.Pins, rs.Last.Pins, rs.PinsPerMinute)
		}
		fmt.Fprintf(w, "resources:       slopes over the churn's second half (%d readings): heap %.1f -> %.1f MiB (%+.1f KiB/min), goroutines %d -> %d (%+.2f/min), fds %d -> %d (%+.2f/min), state dir %.1f -> %.1f MiB (%+.1f KiB/min), pins %s, slab (system) %+.1f KiB/min\n",
			rs.Samples, mibf(rs.First.HeapBytes), mibf(rs.Last.HeapBytes), rs.HeapPerMinute/1024, rs.First.Goroutines, rs.Last.Goroutines, rs.GoroutinesPerMinute,
			rs.First.FDs, rs.Last.FDs, rs.FDsPerMinute, float64(rs.First.StateDirBytes)/(1<<20), float64(rs.Last.StateDirBytes)/(1<<20), rs.StateDirPerMinute/1024,
			pins, rs.SlabPerMinute/1024)
		if len(rs.Growing) == 0 {
			fmt.Fprintf(w, "soak:            flat over the last %.1f min of churn\n", rs.Minutes)
		} else {
			fmt.Fprintf(w, "soak:            GROWING: %s\n", strings.Join(rs.Growing, "; "))
		}
	}
	fmt.Fprintf(w, "restarts:        %d\n", r.Restarts)
	fmt.Fprintf(w, "swept:           %d endpoints and %d addresses left by ambiguous failures; %d datapath removals left to GC; %d crash leftovers collected by GC\n\n",
		r.ZombiesSwept, r.AddressesSwept, r.DatapathLeftToGC, r.CrashLeftoversCollected)
	fmt.Fprintf(w, "%-20s %9s %9s %9s %9s %9s %9s  %s\n", "latency (ms)", "count", "p50", "p90", "p99", "p99.9", "max", "errors")
	for _, name := range sortedOps(r.LatencyMS) {
		s := r.LatencyMS[name]
		fmt.Fprintf(w, "%-20s %9d %9.2f %9.2f %9.2f %9.2f %9.2f  %s\n", name, s.Count, s.P50, s.P90, s.P99, s.P999, s.Max, errorsLine(s.Errors))
	}
	var crashes []string
	for _, ev := range r.Events {
		if ev.Kind == "crash" || ev.Kind == "restart" {
			crashes = append(crashes, fmt.Sprintf("%s %s at %.2fs", ev.Kind, ev.Note, ev.AtS))
		}
	}
	if len(crashes) > 0 {
		fmt.Fprintf(w, "\ncrashes: %s\n", strings.Join(crashes, "; "))
	}
	if r.PolicyChurn != "" {
		fmt.Fprintf(w, "\npolicy churn: %s\n", r.PolicyChurn)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	r.writeViolations(w)
}

func errorsLine(errs map[string]uint64) string {
	var parts []string
	for _, k := range sortedKeys(errs) {
		parts = append(parts, fmt.Sprintf("%s: %d", k, errs[k]))
	}
	return strings.Join(parts, ", ")
}

func (r *Report) writeViolations(w io.Writer) {
	if r.ViolationsTotal == 0 {
		fmt.Fprintf(w, "\ninvariants: all held (0 violations)\n")
		return
	}
	fmt.Fprintf(w, "\nVIOLATIONS: %d", r.ViolationsTotal)
	for _, k := range sortedKeys(r.ViolationsByInvariant) {
		fmt.Fprintf(w, ", %s %d", k, r.ViolationsByInvariant[k])
	}
	fmt.Fprintln(w)
	const show = 20
	for i, v := range r.Violations {
		if i == show {
			fmt.Fprintf(w, "... %d more in the JSON report\n", r.ViolationsTotal-show)
			break
		}
		fmt.Fprintf(w, "- [%s] at %.2fs (%s): %s\n", v.Invariant, v.AtS, v.Phase, v.Message)
		for _, h := range v.History {
			fmt.Fprintf(w, "      %s\n", h)
		}
	}
}

func mibf(b uint64) float64 { return float64(b) / (1 << 20) }
