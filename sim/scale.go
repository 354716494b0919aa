package sim

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ScaleConfig is a node-count sweep (membrane-sim --sweep-nodes, make
// sim-scale): one multi-node run per count in Nodes, each with
// TotalEndpoints over the cluster (TotalEndpoints/N per node, at least
// 1) and Base's churn (its ChurnRate is over the whole cluster, so every
// run has the same cluster-wide churn and the remote updates grow with
// the nodes). Each run waits up to Base.ProbeWait (default here: 5
// minutes) for every node to catch up with the churn, so that its cost
// covers every change it made.
type ScaleConfig struct {
	Nodes          []int
	TotalEndpoints int
	// Base is every run's configuration but Nodes and EndpointsPerNode;
	// each run gets the directory Base.Dir/nodes-N.
	Base MultiConfig
	// Progress gets a line per run (nil: none).
	Progress io.Writer
}

// ScaleRow is one node count's run.
type ScaleRow struct {
	Nodes            int `json:"nodes"`
	EndpointsPerNode int `json:"endpoints-per-node"`
	// Convergence of every endpoint at every other node (ms), after the
	// ramp-up (Steady*) and over the whole run, ramp-up included (All*).
	SteadyP50MS float64 `json:"steady-p50-ms"`
	SteadyP99MS float64 `json:"steady-p99-ms"`
	SteadyMaxMS float64 `json:"steady-max-ms"`
	AllP50MS    float64 `json:"all-p50-ms"`
	AllP99MS    float64 `json:"all-p99-ms"`
	AllMaxMS    float64 `json:"all-max-ms"`
	// RemoteUpdatesPerSecond, ProcessCPUPerSecond and EtcdCPUPerSecond
	// (-1: not measured) are rates over the cost's window (MultiCost: the
	// first create until caught up); CatchUpSeconds is how long after the
	// churn the nodes caught up (CaughtUp: they did in the probe's wait).
	CaughtUp               bool       `json:"caught-up"`
	CatchUpSeconds         float64    `json:"catch-up-seconds"`
	RemoteUpdatesPerSecond float64    `json:"remote-updates-per-second"`
	ProcessCPUPerSecond    float64    `json:"process-cpu-per-second"`
	EtcdCPUPerSecond       float64    `json:"etcd-cpu-per-second"`
	Cost                   *MultiCost `json:"cost,omitempty"`
	Violations             int        `json:"violations"`
	Errors                 int        `json:"failed-requests"`
	TimedOut               int        `json:"timed-out-requests"`
	Refused                int        `json:"refused-requests"`
	MaxBehindSeconds       float64    `json:"max-behind-seconds"`
	MaxPending             int        `json:"max-pending"`
	Seconds                float64    `json:"run-seconds"`
	Load                   string     `json:"loadavg-after"`
}

// ScaleReport is the sweep: a row per node count and the slopes fitted
// across them.
type ScaleReport struct {
	TotalEndpoints int        `json:"total-endpoints"`
	ChurnRate      float64    `json:"churn-rate"`
	Duration       string     `json:"duration"`
	EtcdMode       string     `json:"etcd-mode"`
	StateFS        string     `json:"state-fs"`
	LoadBefore     string     `json:"loadavg-before"`
	LoadAfter      string     `json:"loadavg-after"`
	Rows           []ScaleRow `json:"rows"`
	// CPUPerRemoteUpdate fits the process's CPU (seconds) over the remote
	// updates, each run's from its first create until caught up: its
	// slope is the CPU seconds one more remote update costs (the marginal
	// cost; the intercept holds the local work, the same in every run,
	// and the idle agents' timers); HeapPerRemoteEndpoint fits the heap growth (bytes)
	// over the remote entries held; EtcdCPUPerNode fits etcd's CPU rate
	// over the node count (one more watcher, one more publisher);
	// ConvergenceP99PerNode fits the steady p99 (ms) over the node count.
	// The cost fits leave out the runs whose nodes did not catch up with
	// the churn within the probe's wait (their CPU is not all spent yet,
	// their heap holds the backlog).
	CPUPerRemoteUpdate    Fit `json:"fit-cpu-seconds-per-remote-update"`
	HeapPerRemoteEndpoint Fit `json:"fit-heap-bytes-per-remote-endpoint"`
	EtcdCPUPerNode        Fit `json:"fit-etcd-cpu-per-second-per-node"`
	ConvergenceP99PerNode Fit `json:"fit-steady-p99-ms-per-node"`
	// Runs are the full reports.
	Runs []*MultiReport `json:"runs"`
}

// RunScale runs the sweep; a run that fails to start ends it with the
// rows so far.
func RunScale(ctx context.Context, cfg ScaleConfig) (*ScaleReport, error) {
	if len(cfg.Nodes) == 0 || cfg.TotalEndpoints < 1 {
		return nil, fmt.Errorf("sweep: node counts %v, %d endpoints: want at least one count and one endpoint", cfg.Nodes, cfg.TotalEndpoints)
	}
	rep := &ScaleReport{TotalEndpoints: cfg.TotalEndpoints, ChurnRate: cfg.Base.ChurnRate, Duration: cfg.Base.Duration.String(),
		EtcdMode: "embedded", StateFS: fsType(cfg.Base.Dir), LoadBefore: loadAvg()}
	if cfg.Base.EtcdBin != "" {
		rep.EtcdMode = "process " + cfg.Base.EtcdBin
	}
	for _, n := range cfg.Nodes {
		if ctx.Err() != nil {
			break
		}
		mc := cfg.Base
		mc.Nodes, mc.EndpointsPerNode = n, max(1, cfg.TotalEndpoints/n)
		mc.ProbeWait = cmp.Or(mc.ProbeWait, 5*time.Minute)
		mc.Dir = filepath.Join(cfg.Base.Dir, fmt.Sprintf("nodes-%d", n))
		if err := os.MkdirAll(mc.Dir, 0o755); err != nil {
			return rep, fmt.Errorf("sweep: %w", err)
		}
		start := time.Now()
		r, err := RunMultiNode(ctx, mc)
		if err != nil {
			return rep, fmt.Errorf("sweep: %d nodes: %w", n, err)
		}
		row := scaleRow(r, time.Since(start))
		rep.Rows = append(rep.Rows, row)
		rep.Runs = append(rep.Runs, r)
		_ = os.RemoveAll(mc.Dir) // 100 nodes' state directories
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "%s\n", row.line())
		}
	}
	rep.LoadAfter = loadAvg()
	rep.fit()
	return rep, nil
}

// scaleRow summarises one run.
func scaleRow(r *MultiReport, took time.Duration) ScaleRow {
	row := ScaleRow{Nodes: r.Nodes, EndpointsPerNode: r.EndpointsPerNode, Cost: r.Cost, Violations: len(r.Violations), Errors: r.Errors,
		Seconds: took.Seconds(), Load: loadAvg(), EtcdCPUPerSecond: -1, TimedOut: r.TimedOut, Refused: r.Refused}
	if b := r.Backlog; b != nil {
		row.MaxBehindSeconds, row.MaxPending = b.MaxBehindSeconds, b.MaxPending
	}
	if c := r.Convergence; c != nil {
		row.SteadyP50MS, row.SteadyP99MS, row.SteadyMaxMS = c.SteadyEverywhere.P50, c.SteadyEverywhere.P99, c.SteadyEverywhere.Max
		row.AllP50MS, row.AllP99MS, row.AllMaxMS = c.Everywhere.P50, c.Everywhere.P99, c.Everywhere.Max
	}
	if c := r.Cost; c != nil {
		row.CaughtUp, row.CatchUpSeconds = c.CaughtUp, c.CatchUpSeconds
	}
	if c := r.Cost; c != nil && c.Seconds > 0 {
		row.RemoteUpdatesPerSecond = float64(c.RemoteUpdates) / c.Seconds
		row.ProcessCPUPerSecond = c.ProcessCPUSeconds / c.Seconds
		if c.EtcdCPUSeconds >= 0 {
			row.EtcdCPUPerSecond = c.EtcdCPUSeconds / c.Seconds
		}
	}
	return row
}

// fit fits the slopes: the costs over the runs that caught up with
// their churn, the p99 over every run.
func (r *ScaleReport) fit() {
	var upd, cpu, held, heap, nodes, etcd, enodes, p99 []float64
	for _, row := range r.Rows {
		nodes, p99 = append(nodes, float64(row.Nodes)), append(p99, row.SteadyP99MS)
		c := row.Cost
		if c == nil || !row.CaughtUp {
			continue // changes still to apply: the CPU not yet spent, a backlog in the heap
		}
		upd, cpu = append(upd, float64(c.RemoteUpdates)), append(cpu, c.ProcessCPUSeconds)
		held, heap = append(held, float64(c.RemoteHeld)), append(heap, float64(c.HeapBytes)-float64(c.HeapBaseBytes))
		if row.EtcdCPUPerSecond >= 0 {
			enodes, etcd = append(enodes, float64(row.Nodes)), append(etcd, row.EtcdCPUPerSecond)
		}
	}
	r.CPUPerRemoteUpdate, r.HeapPerRemoteEndpoint = fitXY(upd, cpu), fitXY(held, heap)
	r.EtcdCPUPerNode, r.ConvergenceP99PerNode = fitXY(enodes, etcd), fitXY(nodes, p99)
}

// line is the row as a line of the progress and the text table.
func (row ScaleRow) line() string {
	cpu, heap, etcd, sched := "-", "-", "-", "-"
	if c := row.Cost; c != nil {
		cpu, heap = fmt.Sprintf("%.0f", c.CPUPerRemoteUpdateUS), fmt.Sprintf("%.0f", c.HeapPerRemoteEndpoint)
		sched = fmt.Sprintf("%.1f", c.SchedLatencyP99US/1000)
	}
	if row.EtcdCPUPerSecond >= 0 {
		etcd = fmt.Sprintf("%.2f", row.EtcdCPUPerSecond)
	}
	caught := fmt.Sprintf("%.0f", row.CatchUpSeconds)
	if !row.CaughtUp {
		caught = ">" + caught
	}
	return fmt.Sprintf("%5d %6d %8.0f %8.0f %8.0f %8.0f %8.0f %8.0f %7.0f %7.2f %7s %6s %6s %6s %5s %5d %5d",
		row.Nodes, row.EndpointsPerNode, row.SteadyP50MS, row.SteadyP99MS, row.SteadyMaxMS, row.AllP50MS, row.AllP99MS, row.AllMaxMS,
		row.RemoteUpdatesPerSecond, row.ProcessCPUPerSecond, cpu, heap, etcd, sched, caught, row.Errors, row.Violations)
}

const scaleHeader = "nodes ep/nd  st-p50   st-p99   st-max  all-p50  all-p99  all-max  upd/s  cpu/s  µs/upd  B/rem etcd/s sch99ms  behind fail viol"

// WriteText writes the sweep's table and slopes.
func (r *ScaleReport) WriteText(w io.Writer) {
	fmt.Fprintf(w, "node-count sweep: %d endpoints over the cluster, churn %g lifecycles/s over the cluster for %s, etcd %s, state on %s; loadavg before %s, after %s\n",
		r.TotalEndpoints, r.ChurnRate, r.Duration, r.EtcdMode, r.StateFS, r.LoadBefore, r.LoadAfter)
	fmt.Fprintln(w, "convergence (ms) = creation answered -> every other node's ipcache holds it; st = after the ramp-up, all = ramp-up included;")
	fmt.Fprintln(w, "upd/s = remote updates per second, cpu/s = process CPU seconds per second (all agents), µs/upd = CPU per remote update (upper bound),")
	fmt.Fprintln(w, "B/rem = heap per remote endpoint held (upper bound), etcd/s = etcd's CPU seconds per second, sch99ms = goroutines' wait for a CPU, p99,")
	fmt.Fprintln(w, "behind = seconds after the churn until every node held every other node's probe (>: not within the wait); rates over the first create until then")
	fmt.Fprintln(w, scaleHeader)
	for _, row := range r.Rows {
		fmt.Fprintln(w, row.line())
	}
	fmt.Fprintf(w, "fitted across the runs: CPU %.1f µs per remote update (±%.1f) + %.1f CPU-s per run (local work, idle timers); heap %.0f B per remote endpoint (±%.0f); etcd %+.4f CPU-s/s per node (±%.4f); steady p99 %+.1f ms per node (±%.1f)\n",
		r.CPUPerRemoteUpdate.Slope*1e6, r.CPUPerRemoteUpdate.Stderr*1e6, r.CPUPerRemoteUpdate.Intercept,
		r.HeapPerRemoteEndpoint.Slope, r.HeapPerRemoteEndpoint.Stderr, r.EtcdCPUPerNode.Slope, r.EtcdCPUPerNode.Stderr,
		r.ConvergenceP99PerNode.Slope, r.ConvergenceP99PerNode.Stderr)
	for i, run := range r.Runs {
		for _, v := range run.Violations {
			fmt.Fprintf(w, "VIOLATION (%d nodes) %s\n", r.Rows[i].Nodes, v)
		}
	}
}

// WriteJSONFile writes the sweep as JSON.
func (r *ScaleReport) WriteJSONFile(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// WriteHTMLFile writes the sweep as one page: the table, the slopes and
// each run's convergence histogram.
func (r *ScaleReport) WriteHTMLFile(path string) error {
	var b strings.Builder
	esc := html.EscapeString
	b.WriteString(`<!DOCTYPE html><html><head><meta charset="utf-8"><title>membrane-sim node-count sweep</title><style>
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:1em 0}td,th{padding:2px 8px;text-align:right;border-bottom:1px solid #ddd}
.bad{color:#b00020}.ok{color:#1b7f3b}svg{background:#fff;border:1px solid #ddd;margin:6px 0}
</style></head><body><h1>membrane-sim: node-count sweep</h1><pre>`)
	var txt strings.Builder
	r.WriteText(&txt)
	b.WriteString(esc(txt.String()))
	b.WriteString("</pre><table><tr><th>nodes</th><th>endpoints per node</th><th>steady p50 / p99 / max (ms)</th><th>ramp-up included p50 / p99 / max (ms)</th>" +
		"<th>remote updates/s</th><th>CPU-s/s</th><th>CPU per remote update (µs)</th><th>heap per remote endpoint (B)</th><th>etcd CPU-s/s</th><th>sched wait p99 (ms)</th><th>caught up after the churn (s)</th><th>violations</th></tr>")
	for _, row := range r.Rows {
		cpu, heap, sched := "-", "-", "-"
		if c := row.Cost; c != nil {
			cpu, heap, sched = fmt.Sprintf("%.1f", c.CPUPerRemoteUpdateUS), fmt.Sprintf("%.0f", c.HeapPerRemoteEndpoint), fmt.Sprintf("%.1f", c.SchedLatencyP99US/1000)
		}
		etcd := "-"
		if row.EtcdCPUPerSecond >= 0 {
			etcd = fmt.Sprintf("%.2f", row.EtcdCPUPerSecond)
		}
		cls := "ok"
		if row.Violations > 0 {
			cls = "bad"
		}
		caught := fmt.Sprintf("%.1f", row.CatchUpSeconds)
		if !row.CaughtUp {
			caught = "not in " + caught
		}
		fmt.Fprintf(&b, "<tr><td>%d</td><td>%d</td><td>%.0f / %.0f / %.0f</td><td>%.0f / %.0f / %.0f</td><td>%.0f</td><td>%.2f</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td class=%q>%d</td></tr>",
			row.Nodes, row.EndpointsPerNode, row.SteadyP50MS, row.SteadyP99MS, row.SteadyMaxMS, row.AllP50MS, row.AllP99MS, row.AllMaxMS,
			row.RemoteUpdatesPerSecond, row.ProcessCPUPerSecond, cpu, heap, etcd, sched, caught, cls, row.Violations)
	}
	b.WriteString("</table>")
	for i, run := range r.Runs {
		if c := run.Convergence; c != nil {
			b.WriteString(histChart(fmt.Sprintf("%d nodes: after the ramp-up, arrival at every other node", r.Rows[i].Nodes), c.SteadyEverywhere))
		}
	}
	b.WriteString("</body></html>\n")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("write html report: %w", err)
	}
	return nil
}

// OK reports whether no run violated an invariant.
func (r *ScaleReport) OK() bool {
	for _, run := range r.Runs {
		if !run.OK() {
			return false
		}
	}
	return true
}

func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// RunDirBase is where a run without --dir makes its temporary directory:
// a tmpfs when there is one (a node's /run), else "" (the temp dir).
func RunDirBase() string { return tmpfsBase() }
