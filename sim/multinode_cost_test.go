package sim

import (
	"context"
	"encoding/json"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/metrics"
	"strings"
	"testing"
	"time"
)

// TestFitXY: the fit recovers a line exactly, gives the slope's standard
// error for noisy points, and nothing for too few or identical x.
func TestFitXY(t *testing.T) {
	f := fitXY([]float64{10, 30, 50, 100}, []float64{25, 65, 105, 205})
	if f.Slope != 2 || f.Intercept != 5 || f.Stderr != 0 || f.Points != 4 {
		t.Errorf("exact line: %+v, want slope 2, intercept 5, stderr 0", f)
	}
	f = fitXY([]float64{1, 2, 3, 4}, []float64{1, 3, 2, 4})
	if math.Abs(f.Slope-0.8) > 1e-9 || math.Abs(f.Intercept-0.5) > 1e-9 || math.Abs(f.Stderr-math.Sqrt(1.8/2/5)) > 1e-9 {
		t.Errorf("noisy points: %+v, want slope 0.8, intercept 0.5, stderr %.4f", f, math.Sqrt(1.8/2/5))
	}
	for _, xs := range [][]float64{{3}, {2, 2, 2}} {
		ys := make([]float64, len(xs))
		if f := fitXY(xs, ys); f.Slope != 0 || f.Intercept != 0 || f.Points != len(xs) {
			t.Errorf("fit over %v: %+v, want none", xs, f)
		}
	}
}

// TestHistDiffQuantile: the quantile is of what was counted between the
// two readings only (the upper bound of its bucket).
func TestHistDiffQuantile(t *testing.T) {
	buckets := []float64{math.Inf(-1), 0.001, 0.01, 0.1, 1, math.Inf(1)}
	a := &metrics.Float64Histogram{Buckets: buckets, Counts: []uint64{0, 1000, 0, 0, 0}}
	b := &metrics.Float64Histogram{Buckets: buckets, Counts: []uint64{0, 1000, 98, 2, 0}}
	if q := histDiffQuantile(a, b, 0.5); q != 0.1 {
		t.Errorf("p50 = %g, want 0.1 (the earlier counts left out)", q)
	}
	if q := histDiffQuantile(a, b, 0.99); q != 1 {
		t.Errorf("p99 = %g, want 1", q)
	}
	b.Counts[4] = 10
	if q := histDiffQuantile(a, b, 1); q != 1 {
		t.Errorf("max = %g, want 1 (the unbounded bucket's lower bound)", q)
	}
	if q := histDiffQuantile(a, a, 0.5); q != 0 {
		t.Errorf("no counts: %g, want 0", q)
	}
}

// TestNewMultiCost: the window's figures from two samples.
func TestNewMultiCost(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a := costSample{at: t0, cpu: cpuSample{process: 10 * time.Second, gc: time.Second, busy: 10 * time.Second}, etcd: 2 * time.Second, changes: 100}
	b := costSample{at: t0.Add(20 * time.Second), cpu: cpuSample{process: 30 * time.Second, gc: 3 * time.Second, busy: 30 * time.Second},
		etcd: 6 * time.Second, changes: 4100}
	c := newMultiCost(11, a, b, 100<<20, 300<<20, 2000, false)
	want := MultiCost{Seconds: 20, Changes: 4000, RemoteUpdates: 40000, ProcessCPUSeconds: 20, CPUPerChangeMS: 5,
		CPUPerRemoteUpdateUS: 500, GCFraction: 0.1, EtcdCPUSeconds: 4, EtcdCPUPerChangeUS: 1000,
		HeapBaseBytes: 100 << 20, HeapBytes: 300 << 20, LocalHeld: 2000, RemoteHeld: 20000, HeapPerRemoteEndpoint: float64(200<<20) / 20000}
	if *c != want {
		t.Errorf("cost\n %+v, want\n %+v", *c, want)
	}
	if c := newMultiCost(11, a, b, 100<<20, 300<<20, 2000, true); c.EtcdCPUSeconds != -1 || c.EtcdCPUPerChangeUS != 0 {
		t.Errorf("etcd restarted in the window: %+v, want its CPU unmeasured", c)
	}
	a.etcd = -1
	if c := newMultiCost(11, a, b, 100<<20, 300<<20, 2000, false); c.EtcdCPUSeconds != -1 {
		t.Errorf("embedded etcd: %+v, want its CPU unmeasured", c)
	}
}

// TestMultiNodeCost: a run with etcd as its own process and no faults
// reports its cost from the first create until every node caught up
// (CPU per remote update, heap per remote endpoint with the 30 endpoints
// and 3 probes held, etcd's CPU, the scheduler's latency) in the text,
// JSON and HTML reports. On a loaded machine the churn may end before
// every node filled its 10 endpoints: the count held is checked for
// consistency, not for being full (24 of 33 once, load 24).
func TestMultiNodeCost(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node run: seconds of churn")
	}
	dir := t.TempDir()
	rep, err := RunMultiNode(context.Background(), MultiConfig{Nodes: 3, EndpointsPerNode: 10, Duration: 4 * time.Second, ChurnRate: 30,
		EtcdBin: etcdBinary(t), Dir: dir, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Violations {
		t.Error(v)
	}
	c := rep.Cost
	if c == nil {
		t.Fatal("no cost measured")
	}
	if c.Seconds <= 0 || c.Changes <= 0 || c.RemoteUpdates != 2*c.Changes || c.ProcessCPUSeconds <= 0 || c.CPUPerRemoteUpdateUS <= 0 ||
		c.EtcdCPUSeconds < 0 || c.SchedLatencyP99US <= 0 || c.HeapBytes <= c.HeapBaseBytes || c.LocalHeld < 1 || c.LocalHeld > 33 || c.RemoteHeld != 2*c.LocalHeld || !c.CaughtUp || c.CatchUpSeconds <= 0 ||
		c.HeapPerRemoteEndpoint <= 0 || rep.StateFS == "" {
		t.Errorf("cost %+v (state on %q)", *c, rep.StateFS)
	}
	var txt strings.Builder
	rep.WriteText(&txt)
	for _, s := range []string{"µs per remote update", "B per remote endpoint", "etcd CPU", "waited for a CPU", "every node caught up"} {
		if !strings.Contains(txt.String(), s) {
			t.Errorf("text report without %q:\n%s", s, txt.String())
		}
	}
	js, html := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.html")
	if err := rep.WriteJSONFile(js); err != nil {
		t.Fatal(err)
	}
	if err := rep.WriteHTMLFile(html); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(js)
	var back struct {
		Cost map[string]any `json:"cost"`
	}
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"cpu-us-per-remote-update", "heap-bytes-per-remote-endpoint", "etcd-cpu-seconds", "sched-latency-p99-us"} {
		if v, ok := back.Cost[k].(float64); !ok || v <= 0 {
			t.Errorf("JSON cost.%s = %g", k, back.Cost[k])
		}
	}
	if raw, _ := os.ReadFile(html); !strings.Contains(string(raw), "per remote update") {
		t.Error("HTML report without the cost")
	}
	t.Logf("%+v", *c)
}

// TestMultiConfigLogDiscarded: a multi-node run without a log drops the
// agents' lines before formatting them.
func TestMultiConfigLogDiscarded(t *testing.T) {
	cfg, err := MultiConfig{Nodes: 2, EndpointsPerNode: 10, Duration: time.Second}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Log.Enabled(context.Background(), slog.LevelError) {
		t.Fatal("the default agent log is enabled")
	}
}
