package sim

import (
	"cmp"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"os"
	"strings"
	"time"
)

// WriteText writes the multi-node report as text.
func (r *MultiReport) WriteText(w io.Writer) {
	fmt.Fprintf(w, "nodes %d, %d endpoints per node: %d creates, %d deletes (%d drained), %d failed requests, %d agent crashes, %d etcd restarts (%s)\n",
		r.Nodes, r.EndpointsPerNode, r.Creates, r.Deletes, r.Drained, r.Errors, r.Crashes, r.EtcdRestarts, r.EtcdMode)
	fmt.Fprintf(w, "  failed requests: %d timed out (the client's 10 s passed without an answer), %d refused (503/429: busy, retry), %d other\n",
		r.TimedOut, r.Refused, r.Errors-r.TimedOut-r.Refused)
	if r.FirstError != "" {
		fmt.Fprintf(w, "  first failed request: %s\n", r.FirstError)
	}
	if b := r.Backlog; b != nil {
		fmt.Fprintf(w, "remote backlog (other nodes' endpoint changes queued before the ipcache took them): max %.1f s behind (%s), max %d addresses pending on a node; %d changes applied, %d merged into a later one while queued\n",
			b.MaxBehindSeconds, cmp.Or(b.MaxBehindNode, "-"), b.MaxPending, b.Applied, b.Coalesced)
	}
	for _, k := range sortedKeys(r.ErrorKinds) {
		fmt.Fprintf(w, "  failed: %d x %s\n", r.ErrorKinds[k], k)
	}
	if c := r.Convergence; c != nil {
		fmt.Fprintln(w, "convergence (creation answered -> the other nodes' ipcaches hold it with its identity):")
		fmt.Fprintf(w, "  at each other node: %d pairs, p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", c.ToNode.Count, c.ToNode.P50, c.ToNode.P99, c.ToNode.Max)
		fmt.Fprintf(w, "  at every other node: %d endpoints, p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
			c.Everywhere.Count, c.Everywhere.P50, c.Everywhere.P99, c.Everywhere.Max)
		fmt.Fprintf(w, "  after the ramp-up, at each other node: %d pairs, p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
			c.SteadyToNode.Count, c.SteadyToNode.P50, c.SteadyToNode.P99, c.SteadyToNode.Max)
		fmt.Fprintf(w, "  after the ramp-up, at every other node: %d endpoints, p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
			c.SteadyEverywhere.Count, c.SteadyEverywhere.P50, c.SteadyEverywhere.P99, c.SteadyEverywhere.Max)
		fmt.Fprintf(w, "  not timed: %d pairs (deleted or a node crashed first), %d still pending at the end\n", c.Abandoned, c.Pending)
		c.Phases.writeText(w)
	}
	r.Cost.writeText(w, r.StateFS)
	for _, n := range r.PerNode {
		fmt.Fprintf(w, "  %s: %d endpoints, %d published in etcd, %d remote entries in its ipcache, convergence p99 %.1f ms, %d requests (%d creates, %d deletes, %d failed: %d timed out, %d refused), max %.1f s behind, max %d pending\n",
			n.Name, n.Endpoints, n.Published, n.RemoteEntries, n.ConvergenceP99MS, n.Requests, n.Creates, n.Deletes, n.Failures, n.TimedOut, n.Refused,
			n.MaxBehindSeconds, n.MaxPending)
	}
	fmt.Fprintf(w, "settled %s after the drain; %d identities in etcd; identity agreement: %s\n",
		r.Settle.Round(time.Millisecond), r.EtcdIdentities, r.IdentityAgreement)
	for _, v := range r.Violations {
		fmt.Fprintf(w, "VIOLATION %s\n", v)
	}
}

// writeText writes the steady window's cost (nothing when unmeasured).
func (c *MultiCost) writeText(w io.Writer, stateFS string) {
	if c == nil {
		fmt.Fprintln(w, "cost: not measured (the run was cancelled)")
		return
	}
	caught := fmt.Sprintf("every node caught up %.1f s after the churn", c.CatchUpSeconds)
	if !c.CaughtUp {
		caught = fmt.Sprintf("NOT caught up %.1f s after the churn (changes still to apply)", c.CatchUpSeconds)
	}
	fmt.Fprintf(w, "cost from the first create until caught up (%.1f s, %s; state on %s): %d changes, %d remote updates; process CPU %.2f s: %.2f ms per change, %.1f µs per remote update (upper bound: local work included); GC %.0f%% of the runtime's CPU; goroutines waited for a CPU p50 %.0f µs, p99 %.0f µs\n",
		c.Seconds, caught, stateFS, c.Changes, c.RemoteUpdates, c.ProcessCPUSeconds, c.CPUPerChangeMS, c.CPUPerRemoteUpdateUS, 100*c.GCFraction, c.SchedLatencyP50US, c.SchedLatencyP99US)
	etcd := "etcd CPU not measured (embedded: in the process CPU; or restarted)"
	if c.EtcdCPUSeconds >= 0 {
		etcd = fmt.Sprintf("etcd CPU %.2f s (%.0f µs per change)", c.EtcdCPUSeconds, c.EtcdCPUPerChangeUS)
	}
	fmt.Fprintf(w, "  %s; heap %.1f MiB with no endpoint, %.1f MiB holding %d local and %d remote: %.0f B per remote endpoint (upper bound: local endpoints included)\n",
		etcd, float64(c.HeapBaseBytes)/(1<<20), float64(c.HeapBytes)/(1<<20), c.LocalHeld, c.RemoteHeld, c.HeapPerRemoteEndpoint)
}

// WriteJSONFile writes the multi-node report as JSON.
func (r *MultiReport) WriteJSONFile(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// WriteHTMLFile writes the multi-node report as one self-contained page:
// the summary, the per-node table, the convergence histograms and the
// violations.
func (r *MultiReport) WriteHTMLFile(path string) error {
	var b strings.Builder
	esc := html.EscapeString
	b.WriteString(`<!DOCTYPE html><html><head><meta charset="utf-8"><title>membrane-sim --nodes</title><style>
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:1100px}
table{border-collapse:collapse;margin:1em 0}td,th{padding:2px 10px;text-align:right;border-bottom:1px solid #ddd}
th:first-child,td:first-child{text-align:left}.bad{color:#b00020}.ok{color:#1b7f3b}svg{background:#fff;border:1px solid #ddd;margin:6px 0}
</style></head><body>`)
	fmt.Fprintf(&b, "<h1>membrane-sim: %d nodes in kvstore mode</h1><pre>", r.Nodes)
	var txt strings.Builder
	r.WriteText(&txt)
	b.WriteString(esc(txt.String()))
	b.WriteString("</pre>")
	if len(r.Violations) == 0 {
		b.WriteString(`<p class="ok">No violations.</p>`)
	} else {
		fmt.Fprintf(&b, `<p class="bad">%d violations.</p>`, len(r.Violations))
	}
	b.WriteString("<table><tr><th>node</th><th>endpoints</th><th>published</th><th>remote entries</th><th>convergence p99 (ms)</th><th>requests</th><th>creates</th><th>deletes</th><th>failures</th></tr>")
	for _, n := range r.PerNode {
		fmt.Fprintf(&b, "<tr><td>%s</td><td>%d</td><td>%d</td><td>%d</td><td>%.1f</td><td>%d</td><td>%d</td><td>%d</td><td>%d</td></tr>", esc(n.Name),
			n.Endpoints, n.Published, n.RemoteEntries, n.ConvergenceP99MS, n.Requests, n.Creates, n.Deletes, n.Failures)
	}
	b.WriteString("</table>")
	if c := r.Convergence; c != nil {
		b.WriteString("<h2>Convergence</h2>")
		b.WriteString(histChart("arrival at each other node", c.ToNode))
		b.WriteString(histChart("arrival at every other node", c.Everywhere))
		b.WriteString(histChart("after the ramp-up: arrival at every other node", c.SteadyEverywhere))
	}
	b.WriteString("</body></html>\n")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("write html report: %w", err)
	}
	return nil
}

// OK reports whether no invariant was violated.
func (r *MultiReport) OK() bool { return len(r.Violations) == 0 }

// writeText writes the per-phase clock (nothing when unmeasured).
func (p *PhaseReport) writeText(w io.Writer) {
	if p == nil {
		return
	}
	fmt.Fprintf(w, "  phases (one address in %d; ms from the creation's answer; p50 / p99 / max):\n", p.Sample)
	fmt.Fprintf(w, "    %-10s %-26s %-26s %-26s %s\n", "phase", "after ramp-up, each node", "after ramp-up, last node", "all, each node", "all, last node")
	f := func(s *OpStats) string { return fmt.Sprintf("%.0f / %.0f / %.0f (%d)", s.P50, s.P99, s.Max, s.Count) }
	for _, k := range convPhaseNames {
		fmt.Fprintf(w, "    %-10s %-26s %-26s %-26s %s\n", k, f(p.SteadyPair[k]), f(p.SteadyLast[k]), f(p.Pair[k]), f(p.Last[k]))
	}
}
