package sim

import (
	"math"
	"runtime"
	"runtime/metrics"
	"time"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// MultiCost is what a multi-node run cost, from its first endpoint
// created until every node caught up with the churn (every node holds
// every other node's convergence probe, created after the churn: the
// changes before it are applied, in etcd's order). All agents share the
// process, so the process's CPU is every agent's; divided by the remote
// updates (each change reaches every other node) it bounds the CPU per
// remote update from above (the local work of each change is in it: its
// REST calls, identity, publishing). Across node counts with the same
// cluster-wide churn the local work stays and the remote updates grow
// with the nodes: the sweep's fit (ScaleReport) separates the two.
type MultiCost struct {
	Seconds float64 `json:"seconds"`
	// CaughtUp says every node got every probe within the probe's wait
	// (else the window ends there, with changes still to apply), and
	// CatchUpSeconds how long after the churn's end that was: how far
	// behind the nodes were.
	CaughtUp       bool    `json:"caught-up"`
	CatchUpSeconds float64 `json:"catch-up-seconds"`
	// Changes are the endpoint creates and deletes the agents answered in
	// the window (ramp-up, churn and probes); RemoteUpdates are Changes
	// times the other nodes.
	Changes       int64 `json:"changes"`
	RemoteUpdates int64 `json:"remote-updates"`
	// ProcessCPUSeconds is the process's CPU (getrusage) in the window:
	// the agents, the harness, and etcd when it is embedded.
	ProcessCPUSeconds    float64 `json:"process-cpu-seconds"`
	CPUPerChangeMS       float64 `json:"cpu-ms-per-change"`
	CPUPerRemoteUpdateUS float64 `json:"cpu-us-per-remote-update"`
	// GCFraction is the garbage collector's share of the CPU the runtime
	// used in the window.
	GCFraction float64 `json:"gc-fraction"`
	// SchedLatency is how long goroutines waited, runnable, for a CPU in
	// the window (the Go runtime's /sched/latencies): the queue of a
	// process with more work than cores.
	SchedLatencyP50US float64 `json:"sched-latency-p50-us"`
	SchedLatencyP99US float64 `json:"sched-latency-p99-us"`
	// EtcdCPUSeconds is the etcd process's CPU in the window (-1: not
	// measured: etcd embedded, so in the process's CPU, or restarted in
	// the window).
	EtcdCPUSeconds     float64 `json:"etcd-cpu-seconds"`
	EtcdCPUPerChangeUS float64 `json:"etcd-cpu-us-per-change"`
	// HeapBaseBytes is the live heap with every node started and no
	// endpoint, HeapBytes once caught up, when the nodes held
	// LocalHeld endpoints and RemoteHeld remote entries (their live
	// endpoints times the other nodes). HeapPerRemoteEndpoint is the
	// growth over RemoteHeld: an upper bound (the local endpoints, one in
	// Nodes-1 of the entries, are in it).
	HeapBaseBytes         uint64  `json:"heap-base-bytes"`
	HeapBytes             uint64  `json:"heap-bytes"`
	LocalHeld             int     `json:"local-held"`
	RemoteHeld            int     `json:"remote-held"`
	HeapPerRemoteEndpoint float64 `json:"heap-bytes-per-remote-endpoint"`
}

// costSample is the process at one moment of a multi-node run.
type costSample struct {
	at      time.Time
	cpu     cpuSample
	etcd    time.Duration // -1: not measured
	changes int64
	sched   *metrics.Float64Histogram
}

func takeCostSample(etcdPID int, changes int64) costSample {
	s := costSample{at: time.Now(), cpu: sampleCPU(), etcd: -1, changes: changes}
	if etcdPID > 0 {
		if d, err := testutil.ProcessCPU(etcdPID); err == nil {
			s.etcd = d
		}
	}
	m := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(m)
	if m[0].Value.Kind() == metrics.KindFloat64Histogram {
		s.sched = m[0].Value.Float64Histogram()
	}
	return s
}

// liveHeapAfterGC is the live heap after a collection.
func liveHeapAfterGC() uint64 {
	runtime.GC()
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(live)
	return live[0].Value.Uint64()
}

// newMultiCost computes the window a..b's cost for nodes nodes holding
// local endpoints in all at the end; etcdRestarted says etcd was
// restarted in it (its CPU counter starts again).
func newMultiCost(nodes int, a, b costSample, heapBase, heap uint64, local int, etcdRestarted bool) *MultiCost {
	c := &MultiCost{Seconds: b.at.Sub(a.at).Seconds(), Changes: b.changes - a.changes, EtcdCPUSeconds: -1,
		HeapBaseBytes: heapBase, HeapBytes: heap, LocalHeld: local, RemoteHeld: local * (nodes - 1)}
	c.RemoteUpdates = c.Changes * int64(nodes-1)
	c.ProcessCPUSeconds = (b.cpu.process - a.cpu.process).Seconds()
	ms, gc := cpuPerLifecycle([2]cpuSample{a.cpu, b.cpu}, uint64(max(c.Changes, 0)))
	c.CPUPerChangeMS, c.GCFraction = ms, gc
	if c.RemoteUpdates > 0 {
		c.CPUPerRemoteUpdateUS = c.ProcessCPUSeconds * 1e6 / float64(c.RemoteUpdates)
	}
	if a.etcd >= 0 && b.etcd >= a.etcd && !etcdRestarted {
		c.EtcdCPUSeconds = (b.etcd - a.etcd).Seconds()
		if c.Changes > 0 {
			c.EtcdCPUPerChangeUS = c.EtcdCPUSeconds * 1e6 / float64(c.Changes)
		}
	}
	if c.RemoteHeld > 0 && heap > heapBase {
		c.HeapPerRemoteEndpoint = float64(heap-heapBase) / float64(c.RemoteHeld)
	}
	c.SchedLatencyP50US = histDiffQuantile(a.sched, b.sched, 0.50) * 1e6
	c.SchedLatencyP99US = histDiffQuantile(a.sched, b.sched, 0.99) * 1e6
	return c
}

// histDiffQuantile is the q-quantile of what histogram b counted since a
// (the same metric read earlier: the same buckets), in the metric's unit:
// the upper bound of the bucket holding it (the lower bound for the
// last, unbounded bucket); 0 without counts.
func histDiffQuantile(a, b *metrics.Float64Histogram, q float64) float64 {
	if b == nil || (a != nil && len(a.Counts) != len(b.Counts)) {
		return 0
	}
	counts := make([]uint64, len(b.Counts))
	var total uint64
	for i := range counts {
		counts[i] = b.Counts[i]
		if a != nil {
			counts[i] -= a.Counts[i]
		}
		total += counts[i]
	}
	if total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(total)))
	var seen uint64
	for i, c := range counts {
		if seen += c; seen >= max(rank, 1) {
			hi := b.Buckets[i+1]
			if math.IsInf(hi, 1) {
				return b.Buckets[i]
			}
			return hi
		}
	}
	return b.Buckets[len(b.Buckets)-1]
}
