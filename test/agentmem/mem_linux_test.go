package agentmem

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

func TestMain(m *testing.M) {
	if os.Getenv("MEMBRANE_BENCH_MEM") == "" {
		os.Exit(m.Run())
	}
	os.Exit(nodeharness.Main(m, "membrane-agent"))
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n >= 0 {
		return n
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return d
	}
	return def
}

func requireBench(t *testing.T) {
	t.Helper()
	if os.Getenv("MEMBRANE_BENCH_MEM") == "" {
		t.Skip("set MEMBRANE_BENCH_MEM=1 (make bench-mem) to measure the agent's memory")
	}
	testutil.RequireRoot(t)
}

// daemonSetArgs are the DaemonSet's flags (deploy/kubernetes/membrane.yaml
// and its ConfigMap) that change what the agent runs, after the node
// harness's own (later flags win): info logs in JSON, the health
// endpoint and node probes, garbage collection every minute,
// masquerading, tunnel routing. No --pprof, as in the DaemonSet: with it
// the runtime samples heap allocations, which costs memory; it is added
// with $MEM_HEAPPROFILE_DIR (agentProc).
var daemonSetArgs = []string{"--log-level", "info", "--log-format", "json", "--enable-health=true", "--gc-interval", "1m",
	"--masquerade=true", "--routing", "tunnel", "--tunnel-mtu", "1450", "--tunnel-port", "8472"}

// agentProc prepares the node's agent process with the DaemonSet's
// flags, extra ones and $MEM_AGENT_ARGS (space-separated, last: an A/B
// of a flag such as --gc-percent), running $MEM_AGENT_BIN when set (an
// A/B of two builds; default the harness's build of this tree).
func agentProc(n *nodeharness.Node, extra ...string) *nodeharness.Proc {
	args := append(append([]string{}, daemonSetArgs...), extra...)
	if os.Getenv("MEM_HEAPPROFILE_DIR") != "" {
		args = append(args, "--pprof")
	}
	args = append(args, strings.Fields(os.Getenv("MEM_AGENT_ARGS"))...)
	p := n.Process(args...)
	p.Path = os.Getenv("MEM_AGENT_BIN")
	return p
}

// sample is one reading of the agent process's memory.
type sample struct {
	what                                string
	collected                           bool   // the Go figures after a forced GC (else from /metrics)
	majFlt                              uint64 // page faults read from disk since start
	vmRSS, rssAnon, rssFile, pss        uint64 // bytes
	pssAnon, pssFile                    uint64
	heapLive, heapSys, heapReleased     uint64 // Go runtime, after a forced GC
	stackSys, gcSys, otherSys, totalSys uint64
	// cpu is the process's user + system CPU time since start; gcs the
	// collections since start; memLimit the Go runtime's memory limit
	// (--memory-limit-mib as the agent set it; 0: none).
	cpu, gcCPU    time.Duration // gcCPU: the runtime's estimate of its collector's share
	gcs, memLimit uint64
	lastLive      uint64 // the live heap of the last collection (go_gc_heap_live_bytes)
	res           *Resident
}

// measure reads the process's memory: /proc first (the idle state), then
// the Go runtime's numbers from GET /metrics (what a Prometheus scrape
// costs the agent: no symbolised stacks; the live heap is the last
// collection's). With $MEM_HEAPPROFILE_DIR (and so --pprof) the last
// reading takes them through the heap profile with gc=1 instead (which
// collects first) and saves the profile. The heap profile symbolises
// every sampled stack, reading much of the binary's pclntab, and the
// agent releases its start-up pages (--release-startup-pages): a
// profile before a reading would count the profiler's pages in it.
func measure(t *testing.T, what string, pid int, socket string, last bool) *sample {
	t.Helper()
	s := &sample{what: what, collected: last}
	st := procFields(t, fmt.Sprintf("/proc/%d/status", pid))
	s.vmRSS, s.rssAnon, s.rssFile = st["VmRSS"], st["RssAnon"], st["RssFile"]
	roll := procFields(t, fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	s.pss, s.pssAnon, s.pssFile = roll["Pss"], roll["Pss_Anon"], roll["Pss_File"]
	s.majFlt, s.cpu = majorFaults(t, pid)
	res, err := ReadResident(pid)
	if err != nil {
		t.Fatal(err)
	}
	s.res = res
	// /metrics first: it symbolises nothing, and the heap profile's
	// collection would count in its figures.
	ms := metricsStats(t, socket)
	s.gcs, s.memLimit, s.gcCPU = ms["NumGC"], ms["MemLimit"], time.Duration(ms["GCCPUms"])*time.Millisecond
	if s.memLimit >= math.MaxInt64 { // none (a float in /metrics)
		s.memLimit = 0
	}
	if last && os.Getenv("MEM_HEAPPROFILE_DIR") != "" {
		ms = heapStats(t, socket, what)
	} else {
		s.collected = false
	}
	s.heapLive, s.heapSys, s.heapReleased = ms["HeapAlloc"], ms["HeapSys"], ms["HeapReleased"]
	s.lastLive = ms["HeapLive"] // /metrics only
	s.stackSys, s.gcSys, s.otherSys, s.totalSys = ms["Stack"], ms["GCSys"], ms["OtherSys"]+ms["MSpan"]+ms["MCache"]+ms["BuckHashSys"], ms["Sys"]
	return s
}

// majorFaults is the process's count of page faults that read from disk
// (/proc/<pid>/stat field 12): what the release of start-up pages costs
// when a page is used again; and its CPU time, user and system (fields 14
// and 15, in clock ticks of 1/100 s).
func majorFaults(t *testing.T, pid int) (uint64, time.Duration) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name, which is in parentheses.
	i := strings.LastIndexByte(string(b), ')')
	fs := strings.Fields(string(b[i+1:]))
	if len(fs) < 10 {
		t.Fatalf("short /proc/%d/stat: %q", pid, b)
	}
	n, err := strconv.ParseUint(fs[9], 10, 64) // majflt is field 12; fs[0] is field 3
	if err != nil {
		t.Fatal(err)
	}
	utime, err1 := strconv.ParseUint(fs[11], 10, 64)
	stime, err2 := strconv.ParseUint(fs[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: utime %q, stime %q", pid, fs[11], fs[12])
	}
	return n, time.Duration(utime+stime) * 10 * time.Millisecond
}

// metricsStats reads the Go runtime's memory figures from GET /metrics
// (client_golang's Go collector), keyed as heapStats keys them.
func metricsStats(t *testing.T, socket string) map[string]uint64 {
	t.Helper()
	resp, err := unixClient(socket).Get("http://agent/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("metrics: %v %s", err, resp.Status)
	}
	names := map[string]string{"go_gc_heap_live_bytes": "HeapLive", "go_memstats_heap_alloc_bytes": "HeapAlloc", "go_memstats_heap_sys_bytes": "HeapSys",
		"go_memstats_heap_released_bytes": "HeapReleased", "go_memstats_stack_sys_bytes": "Stack", "go_memstats_gc_sys_bytes": "GCSys",
		"go_memstats_other_sys_bytes": "OtherSys", "go_memstats_mspan_sys_bytes": "MSpan", "go_memstats_mcache_sys_bytes": "MCache",
		"go_memstats_buck_hash_sys_bytes": "BuckHashSys", "go_memstats_sys_bytes": "Sys",
		"go_gc_duration_seconds_count": "NumGC", "go_gc_gomemlimit_bytes": "MemLimit", "go_cpu_classes_gc_total_cpu_seconds_total": "GCCPUms"}
	out := map[string]uint64{}
	for line := range strings.SplitSeq(string(body), "\n") {
		name, v, ok := strings.Cut(line, " ")
		if key, want := names[name]; ok && want {
			if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
				if key == "GCCPUms" {
					f *= 1000
				}
				out[key] = uint64(f)
			}
		}
	}
	if _, ok := out["HeapAlloc"]; !ok {
		t.Fatalf("metrics without go_memstats_heap_alloc_bytes:\n%.2000s", body)
	}
	return out
}

// unixClient is an HTTP client over the agent's socket.
func unixClient(socket string) *http.Client {
	return &http.Client{Timeout: time.Minute, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
}

// procFields parses "Key: <n> kB" lines into bytes.
func procFields(t *testing.T, path string) map[string]uint64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		fs := strings.Fields(v)
		if !ok || len(fs) != 2 || fs[1] != "kB" {
			continue
		}
		if n, err := strconv.ParseUint(fs[0], 10, 64); err == nil {
			out[k] = n << 10
		}
	}
	return out
}

// heapStats fetches /debug/pprof/heap?gc=1&debug=1 over the agent's
// socket (--pprof) and parses its runtime.MemStats lines ("# Name = n",
// "# Stack = inuse / sys": the sys part).
//
// With $MEM_HEAPPROFILE_DIR set it also saves the heap profile there
// (go tool pprof -sample_index=inuse_space), named after what.
func heapStats(t *testing.T, socket, what string) map[string]uint64 {
	t.Helper()
	hc := unixClient(socket)
	if dir := os.Getenv("MEM_HEAPPROFILE_DIR"); dir != "" {
		saveProfile(t, hc, filepath.Join(dir, strings.NewReplacer(" ", "-", ",", "").Replace(what)+".pb.gz"))
	}
	resp, err := hc.Get("http://agent/debug/pprof/heap?gc=1&debug=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("heap profile: %v %s", err, resp.Status)
	}
	out := map[string]uint64{}
	for line := range strings.SplitSeq(string(body), "\n") {
		k, v, ok := strings.Cut(strings.TrimPrefix(line, "# "), " = ")
		if !ok || !strings.HasPrefix(line, "# ") {
			continue
		}
		if _, sys, ok := strings.Cut(v, " / "); ok {
			v = sys
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			out[k] = n
		}
	}
	if _, ok := out["HeapAlloc"]; !ok {
		t.Fatalf("heap profile without runtime.MemStats:\n%.2000s", body)
	}
	return out
}

func saveProfile(t *testing.T, hc *http.Client, path string) {
	t.Helper()
	resp, err := hc.Get("http://agent/debug/pprof/heap?gc=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := io.Copy(f, resp.Body); err != nil {
		t.Fatal(err)
	}
	t.Logf("heap profile %s", path)
}

func mib(b uint64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }

// report logs s and prints its headline lines (scripts/bench-headline.sh
// reads "headline: what | value | target").
func report(t *testing.T, s *sample, target string) {
	t.Helper()
	heap := fmt.Sprintf("heap allocated %s MiB (not collected first; live at the last collection %s)", mib(s.heapLive), mib(s.lastLive))
	if s.collected {
		heap = fmt.Sprintf("live heap %s MiB", mib(s.heapLive))
	}
	fmt.Printf("memory: %s: VmRSS %s MiB (RssAnon %s, RssFile %s), Pss %s MiB (anon %s, file %s); "+
		"Go: %s, heap from the OS %s (released %s), stacks %s, GC metadata %s, other %s, total %s MiB; "+
		"executable resident %s MiB file-backed, %s MiB copied; %d page faults read from disk since start; "+
		"CPU since start %.2f s, %d collections, their CPU %.2f s, memory limit %s MiB\n",
		s.what, mib(s.vmRSS), mib(s.rssAnon), mib(s.rssFile), mib(s.pss), mib(s.pssAnon), mib(s.pssFile),
		heap, mib(s.heapSys), mib(s.heapReleased), mib(s.stackSys), mib(s.gcSys), mib(s.otherSys), mib(s.totalSys),
		mib(s.res.File), mib(s.res.COW), s.majFlt, s.cpu.Seconds(), s.gcs, s.gcCPU.Seconds(), mib(s.memLimit))
	fmt.Printf("memory: %s: executable by section (MiB):%s\n", s.what, top(s.res.Sections, 6))
	fmt.Printf("memory: %s: executable by package (MiB, .text/.rodata/data by symbol):%s\n", s.what, top(s.res.Packages, envInt("MEM_TOP", 25)))
	fmt.Printf("headline: agent VmRSS, %s (MiB; RssAnon + RssFile) | %s (%s + %s) | %s\n", s.what, mib(s.vmRSS), mib(s.rssAnon), mib(s.rssFile), target)
}

func top(m map[string]uint64, n int) string {
	type kv struct {
		k string
		v uint64
	}
	var l []kv
	for k, v := range m {
		l = append(l, kv{k, v})
	}
	sort.Slice(l, func(i, j int) bool { return l[i].v > l[j].v })
	var b strings.Builder
	for i, e := range l {
		if i == n {
			break
		}
		fmt.Fprintf(&b, " %s %.2f;", e.k, float64(e.v)/(1<<20))
	}
	return b.String()
}

// TestMemStandalone: the agent process on the Linux datapath in a netns
// of its own, idle, then with MEM_PODS (default 110) pods added by the
// real membrane-cni, each measured after MEM_SETTLE (default 15s); then
// the CPU over MEM_IDLE.
func TestMemStandalone(t *testing.T) {
	requireBench(t)
	pods, settle := envInt("MEM_PODS", 110), envDuration("MEM_SETTLE", 15*time.Second)
	n := nodeharness.New(t, nodeharness.Options{Prefix: "mbm-node", IPv4Range: "10.231.0.0/20"})
	p := agentProc(n)
	p.Start()
	time.Sleep(settle)
	report(t, measure(t, "standalone, idle", p.Pid(), n.Socket, false), "")
	for i := range pods {
		n.AddPod(fmt.Sprintf("mem-%d", i))
	}
	time.Sleep(settle)
	report(t, measure(t, fmt.Sprintf("standalone, %d endpoints", pods), p.Pid(), n.Socket, true), "<= 48")
	idle(t, "standalone", p.Pid(), n.Socket)
}

// idle waits MEM_IDLE (default 30s) with the agent left alone and prints
// its CPU time and collections over that window: what the memory limit
// costs at steady state.
func idle(t *testing.T, what string, pid int, socket string) {
	t.Helper()
	d := envDuration("MEM_IDLE", 30*time.Second)
	if d <= 0 {
		return
	}
	_, cpu0 := majorFaults(t, pid)
	ms0 := metricsStats(t, socket)
	time.Sleep(d)
	_, cpu1 := majorFaults(t, pid)
	ms1 := metricsStats(t, socket)
	fmt.Printf("memory: %s: idle %s: CPU %.2f s, %d collections, their CPU %.3f s; live heap at the last collection %s MiB\n",
		what, d, (cpu1 - cpu0).Seconds(), ms1["NumGC"]-ms0["NumGC"], float64(ms1["GCCPUms"]-ms0["GCCPUms"])/1000, mib(ms1["HeapLive"]))
}
