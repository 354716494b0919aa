package sim

import (
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"sort"
	"strings"
)

// The HTML report is one self-contained page: a summary, the violations,
// and plots drawn as inline SVG (no scripts, no external resources).

// WriteHTMLFile writes the HTML report.
func (r *Report) WriteHTMLFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write html report: %w", err)
	}
	r.WriteHTML(f)
	if err := f.Close(); err != nil {
		return fmt.Errorf("write html report: %w", err)
	}
	return nil
}

// WriteHTML writes the HTML report to w.
func (r *Report) WriteHTML(w io.Writer) {
	var b strings.Builder
	esc := html.EscapeString
	fmt.Fprintf(&b, `<!DOCTYPE html><html><head><meta charset="utf-8"><title>membrane-sim: %s</title><style>
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:1100px}
table{border-collapse:collapse;margin:1em 0}td,th{padding:2px 10px;text-align:right;border-bottom:1px solid #ddd}
th:first-child,td:first-child{text-align:left}.bad{color:#b00020}.ok{color:#1b7f3b}pre{background:#f6f6f6;padding:6px;overflow-x:auto}
svg{background:#fff;border:1px solid #ddd;margin:6px 0}h2{margin-top:1.6em}
</style></head><body>`, esc(r.Scenario.Name))
	fmt.Fprintf(&b, "<h1>membrane-sim: %s</h1><p>%s</p>", esc(r.Scenario.Name), esc(r.Scenario.Description))
	r.htmlSummary(&b)
	r.htmlViolations(&b)
	b.WriteString("<h2>Over time</h2>")
	markers := r.crashMarkers()
	b.WriteString(lineChart("live endpoints", r.timelineSeries(func(s Sample) float64 { return float64(s.Live) }, "harness: live pods", "#1f77b4"),
		r.timelineSeries(func(s Sample) float64 { return float64(s.Endpoints) }, "agent: endpoints in the index", "#ff7f0e"),
		r.timelineSeries(func(s Sample) float64 { return float64(s.Ready) }, "agent: ready", "#2ca02c"), markers))
	b.WriteString(lineChart("throughput (per second)", r.timelineSeries(func(s Sample) float64 { return s.OpsPerS }, "API calls/s", "#1f77b4"),
		r.timelineSeries(func(s Sample) float64 { return s.LifecyclesPerS }, "lifecycles/s", "#d62728"), series{}, markers))
	b.WriteString(lineChart("p99 latency per second (ms)", r.timelineSeries(func(s Sample) float64 { return s.PutP99 }, "endpoint_put", "#9467bd"),
		r.timelineSeries(func(s Sample) float64 { return s.DeleteP99 }, "endpoint_delete", "#8c564b"), series{}, markers))
	b.WriteString("<p>Red vertical lines: agent crashes.</p><h2>Latency histograms (successful calls)</h2>")
	for _, name := range sortedOps(r.LatencyMS) {
		b.WriteString(histChart(name, r.LatencyMS[name]))
	}
	b.WriteString("</body></html>\n")
	_, _ = io.WriteString(w, b.String())
}

func (r *Report) htmlSummary(b *strings.Builder) {
	sc, f := r.Scenario, r.Scenario.Faults
	rows := [][2]string{
		{"endpoints / workers / seed", fmt.Sprintf("%d / %d / %d", sc.Endpoints, sc.Workers, sc.Seed)},
		{"phases", fmt.Sprintf("ramp-up %.1fs, churn %.1fs, total %.1fs", r.RampS, r.ChurnS, r.WallS)},
		{"faults", fmt.Sprintf("datapath errors %.3g, slow %.3g, proxy acks %d lost %.3g, client timeouts %.3g", f.DatapathErrorRate,
			f.SlowDatapathRate, f.ProxyAcks, f.ProxyAckDropRate, f.ClientTimeoutRate)},
		{"lifecycles/s (churn)", fmt.Sprintf("%.0f (slowest 5s %.0f), %d lifecycles, %d failed ADDs", r.LifecyclesPerSecond,
			r.LifecyclesPerSecondMin, r.Lifecycles, r.FailedAdds)},
		{"API calls/s (churn)", fmt.Sprintf("%.0f", r.OpsPerSecond)},
		{"live endpoints peak", fmt.Sprintf("%d (index %d)", r.LiveEndpointsPeak, r.IndexEndpointsPeak)},
		{"heap per live endpoint", fmt.Sprintf("%.0f B (%d live)", r.HeapBytesPerLiveEndpoint, r.HeapLiveEndpoints)},
		{"regenerations", fmt.Sprintf("%d requested, %d run, %d coalesced, %d failed", r.Regenerations.Requested,
			r.Regenerations.Run, r.Regenerations.Coalesced, r.Regenerations.Failed)},
		{"restarts", fmt.Sprintf("%d of %d crashes", r.Restarts, sc.Crashes)},
		{"host", fmt.Sprintf("%s, GOMAXPROCS %d", r.Host.GoVersion, r.Host.GOMAXPROCS)},
	}
	b.WriteString("<table>")
	for _, row := range rows {
		fmt.Fprintf(b, "<tr><td>%s</td><td>%s</td></tr>", html.EscapeString(row[0]), html.EscapeString(row[1]))
	}
	b.WriteString("</table><table><tr><th>latency (ms)</th><th>count</th><th>p50</th><th>p90</th><th>p99</th><th>p99.9</th><th>max</th><th>errors</th></tr>")
	for _, name := range sortedOps(r.LatencyMS) {
		s := r.LatencyMS[name]
		fmt.Fprintf(b, "<tr><td>%s</td><td>%d</td><td>%.2f</td><td>%.2f</td><td>%.2f</td><td>%.2f</td><td>%.2f</td><td>%s</td></tr>",
			name, s.Count, s.P50, s.P90, s.P99, s.P999, s.Max, html.EscapeString(errorsLine(s.Errors)))
	}
	b.WriteString("</table>")
	for _, n := range append(r.Notes, policyNote(r)...) {
		fmt.Fprintf(b, "<p>Note: %s</p>", html.EscapeString(n))
	}
}

func policyNote(r *Report) []string {
	if r.PolicyChurn == "" {
		return nil
	}
	return []string{"policy churn: " + r.PolicyChurn}
}

func (r *Report) htmlViolations(b *strings.Builder) {
	if r.ViolationsTotal == 0 {
		b.WriteString(`<h2 class="ok">Invariants: all held</h2>`)
		return
	}
	fmt.Fprintf(b, `<h2 class="bad">Violations: %d</h2><ul>`, r.ViolationsTotal)
	for _, k := range sortedKeys(r.ViolationsByInvariant) {
		fmt.Fprintf(b, "<li>%s: %d</li>", html.EscapeString(k), r.ViolationsByInvariant[k])
	}
	b.WriteString("</ul>")
	for i, v := range r.Violations {
		if i == 50 {
			b.WriteString("<p>… more in the JSON report</p>")
			break
		}
		fmt.Fprintf(b, "<p><b>[%s]</b> at %.2fs (%s): %s</p>", html.EscapeString(v.Invariant), v.AtS, html.EscapeString(v.Phase),
			html.EscapeString(v.Message))
		if len(v.History) > 0 {
			fmt.Fprintf(b, "<pre>%s</pre>", html.EscapeString(strings.Join(v.History, "\n")))
		}
	}
}

func (r *Report) crashMarkers() []float64 {
	var out []float64
	for _, ev := range r.Events {
		if ev.Kind == "crash" {
			out = append(out, ev.AtS)
		}
	}
	return out
}

// series is one line of a chart.
type series struct {
	name  string
	color string
	xs    []float64
	ys    []float64
}

func (r *Report) timelineSeries(y func(Sample) float64, name, color string) series {
	s := series{name: name, color: color}
	for _, smp := range r.Timeline {
		if v := y(smp); v >= 0 {
			s.xs, s.ys = append(s.xs, smp.T), append(s.ys, v)
		}
	}
	return s
}

// Chart geometry.
const (
	chartW, chartH             = 1000, 260
	padL, padR, padT, padB     = 70, 20, 30, 40
	plotW, plotH               = chartW - padL - padR, chartH - padT - padB
	histW, histH               = 1000, 200
	histPadL, histPadB, histPT = 70, 40, 30
)

// lineChart draws up to three series against time, with vertical markers.
func lineChart(title string, a, b, c series, markers []float64) string {
	all := []series{}
	for _, s := range []series{a, b, c} {
		if len(s.xs) > 0 {
			all = append(all, s)
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg width="%d" height="%d" viewBox="0 0 %d %d" xmlns="http://www.w3.org/2000/svg" font-size="12">`, chartW, chartH, chartW, chartH)
	fmt.Fprintf(&sb, `<text x="%d" y="18" font-weight="bold">%s</text>`, padL, html.EscapeString(title))
	if len(all) == 0 {
		sb.WriteString(`<text x="400" y="130">no data</text></svg>`)
		return sb.String()
	}
	xmax, ymax := 1.0, 1.0
	for _, s := range all {
		for i := range s.xs {
			xmax, ymax = math.Max(xmax, s.xs[i]), math.Max(ymax, s.ys[i])
		}
	}
	ticks := niceTicks(ymax, 5)
	ymax = ticks[len(ticks)-1]
	px := func(x float64) float64 { return padL + x/xmax*plotW }
	py := func(y float64) float64 { return padT + plotH - y/ymax*plotH }
	for _, t := range ticks {
		fmt.Fprintf(&sb, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#eee"/><text x="%d" y="%.1f" text-anchor="end">%s</text>`,
			padL, padL+plotW, py(t), py(t), padL-6, py(t)+4, fmtNum(t))
	}
	for _, t := range niceTicks(xmax, 10) {
		if t <= xmax {
			fmt.Fprintf(&sb, `<text x="%.1f" y="%d" text-anchor="middle">%ss</text>`, px(t), padT+plotH+16, fmtNum(t))
		}
	}
	for _, m := range markers {
		fmt.Fprintf(&sb, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#d62728" stroke-dasharray="3,3"/>`, px(m), px(m), padT, padT+plotH)
	}
	for i, s := range all {
		pts := make([]string, len(s.xs))
		for j := range s.xs {
			pts[j] = fmt.Sprintf("%.1f,%.1f", px(s.xs[j]), py(s.ys[j]))
		}
		fmt.Fprintf(&sb, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`, s.color, strings.Join(pts, " "))
		fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d">%s</text>`,
			padL+10+i*260, chartH-14, s.color, padL+24+i*260, chartH-5, html.EscapeString(s.name))
	}
	fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/></svg>`, padL, padT, plotW, plotH)
	return sb.String()
}

// histChart draws a latency histogram on a logarithmic time axis.
func histChart(name string, s *OpStats) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg width="%d" height="%d" viewBox="0 0 %d %d" xmlns="http://www.w3.org/2000/svg" font-size="12">`, histW, histH, histW, histH)
	fmt.Fprintf(&sb, `<text x="%d" y="18" font-weight="bold">%s: %d calls, p50 %.2f ms, p99 %.2f ms, max %.2f ms</text>`,
		histPadL, html.EscapeString(name), s.Count, s.P50, s.P99, s.Max)
	if len(s.Histogram) == 0 {
		sb.WriteString(`<text x="400" y="100">no successful calls</text></svg>`)
		return sb.String()
	}
	lo := math.Log10(math.Max(s.Histogram[0].LowMS, 0.001))
	hi := math.Log10(math.Max(s.Max, s.Histogram[len(s.Histogram)-1].LowMS) * 1.15)
	lo, hi = math.Floor(lo), math.Max(math.Ceil(hi), math.Floor(lo)+1)
	var cmax uint64
	for _, h := range s.Histogram {
		cmax = max(cmax, h.Count)
	}
	w, h := float64(histW-histPadL-50), float64(histH-histPT-histPadB)
	px := func(ms float64) float64 { return histPadL + (math.Log10(math.Max(ms, 0.001))-lo)/(hi-lo)*w }
	for i, bk := range s.Histogram {
		next := bk.LowMS * 1.125
		if i+1 < len(s.Histogram) && s.Histogram[i+1].LowMS < next {
			next = s.Histogram[i+1].LowMS
		}
		bh := float64(bk.Count) / float64(cmax) * h
		fmt.Fprintf(&sb, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#4c78a8"><title>%s ms: %d</title></rect>`,
			px(bk.LowMS), float64(histPT)+h-bh, math.Max(px(next)-px(bk.LowMS), 1), bh, fmtNum(bk.LowMS), bk.Count)
	}
	for d := lo; d <= hi; d++ {
		v := math.Pow(10, d)
		fmt.Fprintf(&sb, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%.1f" stroke="#bbb"/><text x="%.1f" y="%.1f" text-anchor="middle">%s ms</text>`,
			px(v), px(v), histPT, float64(histPT)+h, px(v), float64(histPT)+h+16, fmtNum(v))
	}
	fmt.Fprintf(&sb, `<text x="%d" y="%.1f" text-anchor="end">%d</text>`, histPadL-6, float64(histPT)+10, cmax)
	sb.WriteString(`</svg>`)
	return sb.String()
}

// niceTicks returns about n round tick values from 0 to at least top.
func niceTicks(top float64, n int) []float64 {
	if top <= 0 {
		top = 1
	}
	raw := top / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var out []float64
	for v := 0.0; ; v += step {
		out = append(out, v)
		if v >= top {
			return out
		}
	}
}

func fmtNum(v float64) string {
	switch {
	case v == math.Trunc(v) && math.Abs(v) < 1e9:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 1:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
