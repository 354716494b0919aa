package sim

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// scaleRun is a multi-node report as a sweep's run at n nodes would
// give it: 2,000 endpoints over the cluster, 100 lifecycles/s (200
// changes/s) for 30 s, a CPU of 0.5 s/s plus 20 µs per remote update,
// a heap of 50 MiB plus 1,000 B per remote entry held, etcd at 0.1 s/s
// plus 0.002 s/s per node, a steady p99 of 10 ms per node, caught up
// n/10 s after the churn (at 100 nodes: not within the wait).
func scaleRun(n int) *MultiReport {
	changes := int64(200 * 30)
	upd := changes * int64(n-1)
	local := 2000
	c := &MultiCost{Seconds: 30, Changes: changes, RemoteUpdates: upd, ProcessCPUSeconds: 30 * (0.5 + 20e-6*float64(upd)/30),
		EtcdCPUSeconds: 30 * (0.1 + 0.002*float64(n)), HeapBaseBytes: 50 << 20, HeapBytes: 50<<20 + uint64(1000*local*(n-1)),
		LocalHeld: local, RemoteHeld: local * (n - 1), SchedLatencyP99US: 2000, CaughtUp: n < 100, CatchUpSeconds: float64(n) / 10}
	c.CPUPerRemoteUpdateUS = c.ProcessCPUSeconds * 1e6 / float64(upd)
	c.HeapPerRemoteEndpoint = float64(c.HeapBytes-c.HeapBaseBytes) / float64(c.RemoteHeld)
	return &MultiReport{Nodes: n, EndpointsPerNode: 2000 / n, Cost: c, Convergence: &ConvergenceReport{
		SteadyEverywhere: &OpStats{P50: 3 * float64(n), P99: 10 * float64(n), Max: 12 * float64(n)},
		Everywhere:       &OpStats{P50: 4 * float64(n), P99: 20 * float64(n), Max: 30 * float64(n)}}}
}

// TestScaleReport: the sweep's rows and the slopes fitted across them
// (the marginal CPU per remote update with the local work apart, the
// heap per remote endpoint, etcd's CPU per node, the p99 per node), in
// the text, JSON and HTML reports; a run with a violation fails the
// sweep.
func TestScaleReport(t *testing.T) {
	rep := &ScaleReport{TotalEndpoints: 2000, ChurnRate: 100, Duration: "30s"}
	for _, n := range []int{10, 30, 50, 100} {
		r := scaleRun(n)
		rep.Rows = append(rep.Rows, scaleRow(r, time.Minute))
		rep.Runs = append(rep.Runs, r)
	}
	// The 100-node run did not catch up: its cost, off the lines, is left
	// out of the cost fits.
	rep.Rows[3].Cost.ProcessCPUSeconds *= 3
	rep.Rows[3].Cost.HeapBytes *= 3
	rep.Rows[3].EtcdCPUPerSecond *= 3
	rep.fit()
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-6*math.Max(1, math.Abs(want)) {
			t.Errorf("%s = %g, want %g", what, got, want)
		}
	}
	near("CPU per remote update (s)", rep.CPUPerRemoteUpdate.Slope, 20e-6)
	near("local CPU (s per run)", rep.CPUPerRemoteUpdate.Intercept, 15)
	near("heap per remote endpoint", rep.HeapPerRemoteEndpoint.Slope, 1000)
	near("etcd CPU per node", rep.EtcdCPUPerNode.Slope, 0.002)
	near("steady p99 per node", rep.ConvergenceP99PerNode.Slope, 10)
	row := rep.Rows[3]
	near("100 nodes: remote updates/s", row.RemoteUpdatesPerSecond, 200*99)
	near("100 nodes: etcd CPU/s", row.EtcdCPUPerSecond, 0.9)
	if row.SteadyP99MS != 1000 || row.AllP99MS != 2000 || row.EndpointsPerNode != 20 {
		t.Errorf("100 nodes: %+v", row)
	}
	if !rep.OK() {
		t.Error("a sweep without violations is not OK")
	}
	var txt strings.Builder
	rep.WriteText(&txt)
	for _, s := range []string{scaleHeader, "CPU 20.0 µs per remote update", "heap 1000 B per remote endpoint", "  100     20      300     1000     1200      400     2000     3000   19800    0.90      45   1000   0.90    2.0   >10     0     0",
		"   50     40      150      500      600      200     1000     1500    9800    0.70      71   1000   0.20    2.0     5     0     0"} {
		if !strings.Contains(txt.String(), s) {
			t.Errorf("text report without %q:\n%s", s, txt.String())
		}
	}
	dir := t.TempDir()
	js, html := filepath.Join(dir, "s.json"), filepath.Join(dir, "s.html")
	if err := rep.WriteJSONFile(js); err != nil {
		t.Fatal(err)
	}
	if err := rep.WriteHTMLFile(html); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(js)
	var back ScaleReport
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Rows) != 4 || back.Rows[3].Cost == nil || back.HeapPerRemoteEndpoint.Slope != rep.HeapPerRemoteEndpoint.Slope {
		t.Errorf("JSON round trip: %+v", back)
	}
	if raw, _ := os.ReadFile(html); !strings.Contains(string(raw), "CPU per remote update") || !strings.Contains(string(raw), "<td>100</td>") {
		t.Error("HTML report without the table")
	}
	rep.Runs[1].Violations = []string{"x"}
	if rep.OK() {
		t.Error("a sweep with a violation is OK")
	}
	// A run without its cost (never reached its endpoints) is a row
	// without figures, left out of the fits.
	r := scaleRun(20)
	r.Cost = nil
	rep.Rows = append(rep.Rows, scaleRow(r, time.Minute))
	rep.fit()
	near("CPU per remote update without the unmeasured run", rep.CPUPerRemoteUpdate.Slope, 20e-6)
	if rep.Rows[4].EtcdCPUPerSecond != -1 || rep.CPUPerRemoteUpdate.Points != 3 || rep.ConvergenceP99PerNode.Points != 5 {
		t.Errorf("unmeasured run: %+v, fit %+v", rep.Rows[4], rep.CPUPerRemoteUpdate)
	}
}
