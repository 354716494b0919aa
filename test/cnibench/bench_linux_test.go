package cnibench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/membrane-cni/membrane/pkg/clients/cni"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// refPluginDir is where Debian's containernetworking-plugins installs ptp
// and host-local.
const refPluginDir = "/usr/lib/cni"

// arm is one plugin set under test: its plugins run in host (the
// netns standing in for the host); agent is Membrane's, nil for ptp.
type arm struct {
	name  string
	cni   *libcni.CNIConfig
	conf  *libcni.NetworkConfigList
	host  *testutil.NS
	agent *agentProc
	exec  *timedExec // libcni's plugin executor, timed
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

func TestCNIBench(t *testing.T) {
	if os.Getenv("MEMBRANE_BENCH_CNI") == "" {
		t.Skip("set MEMBRANE_BENCH_CNI=1 (make bench-cni) to run the CNI benchmark")
	}
	testutil.RequireRoot(t)
	if _, err := os.Stat(filepath.Join(refPluginDir, "ptp")); err != nil {
		t.Fatalf("reference plugins missing (apt-get install containernetworking-plugins): %v", err)
	}
	n, conc := envInt("BENCH_N", 200), envInt("BENCH_CONC", 8)
	dual := false
	switch st := os.Getenv("BENCH_STACK"); st {
	case "", "ipv4":
	case "dual":
		dual = true
	default:
		t.Fatalf("BENCH_STACK %q: want ipv4 or dual", st)
	}
	dir := t.TempDir()
	host := testutil.NewNS(t, "mbb-host")
	phasesFile := filepath.Join(phasesDir(t, dir), "plugin-phases.jsonl")
	t.Setenv(cni.PhasesEnv, phasesFile) // libcni passes the environment on
	bin := buildPlugin(t, dir)
	agentBin := os.Getenv("BENCH_AGENT") // an A/B of the agent: a prebuilt membrane-agent
	if agentBin == "" {
		agentBin = buildAgent(t, dir)
	}
	// Both attach modes of the endpoint programs, each agent in a host
	// netns of its own: TCX (--bpf-attach tcx) and cls_bpf (the default,
	// --bpf-attach auto).
	var arms []*arm
	if os.Getenv("BENCH_TCX") != "0" {
		arms = append(arms, startMembrane(t, dir, bin, agentBin, host, "membrane", true, dual))
	}
	arms = append(arms, startMembrane(t, dir, bin, agentBin, testutil.NewNS(t, "mbb-htc"), "membrane-tc", false, dual))
	// BENCH_FLOWS=ab: the same agent with --flows=false (no flow reports),
	// tc attach, next to membrane-tc (flows on, the default).
	if os.Getenv("BENCH_FLOWS") == "ab" {
		arms = append(arms, startMembrane(t, dir, bin, agentBin, testutil.NewNS(t, "mbb-hnof"), "noflows-tc", false, dual, "--flows=false"))
	}
	// An A/B of the plugin alone: another plugin binary (say, one built
	// from main) against an agent of its own, tc attach, in the same
	// alternation as the others.
	if base := os.Getenv("BENCH_BASE_PLUGIN"); base != "" {
		baseBin := basePluginDir(t, dir, base)
		if os.Getenv("BENCH_TCX") != "0" {
			arms = append(arms, startMembrane(t, dir, baseBin, agentBin, testutil.NewNS(t, "mbb-hbtcx"), "base", true, dual))
		}
		arms = append(arms, startMembrane(t, dir, baseBin, agentBin, testutil.NewNS(t, "mbb-hbase"), "base-tc", false, dual))
	}
	arms = append(arms, ptpArm(t, dir, host, dual))
	if dual {
		fmt.Println("dual-stack: every arm gives every pod an IPv4 and an IPv6 address")
	}

	// The arms alternate, call by call and round by round, so that all
	// see the same machine (other work, the kernel's netns cleanups).
	// BENCH_ONLY=concurrent skips the sequential calls and the breakdown
	// (for profiles, and for A/Bs of CPU per ADD).
	only := os.Getenv("BENCH_ONLY") == "concurrent"
	warmUp(t, arms)
	load0 := loadAvg()
	var snaps [3]map[string]phaseSums
	var seq map[string][2]stats
	var calls calls
	if !only {
		snaps[0] = agentPhases(arms)
		seq, calls = sequential(t, arms, n, func() { snaps[1] = agentPhases(arms) })
		snaps[2] = agentPhases(arms)
	}
	// The concurrent rounds are not broken down: the plugins run without
	// their phase records (a file append and a /proc read per call,
	// which only Membrane's plugin makes).
	t.Setenv(cni.PhasesEnv, "")
	const rounds = 4
	res := map[string]*concResult{}
	for _, a := range arms {
		res[a.name] = &concResult{}
	}
	for r := range rounds {
		for _, a := range rotate(arms, r) {
			elapsed, used, lat := concurrentRound(t, a, n/rounds, conc)
			c := res[a.name]
			c.busy += elapsed
			for i := range c.cpu {
				c.cpu[i] += used[i]
			}
			c.machine += used[3]
			c.lat = append(c.lat, lat...)
		}
	}
	total := n / rounds * rounds
	var b strings.Builder
	fmt.Fprintf(&b, "\nCPU per concurrent ADD (user+sys: getrusage, the agent's /proc/<pid>/stat):\n")
	for _, a := range arms {
		c := res[a.name]
		per := func(d time.Duration) string { return ms(d / time.Duration(total)) }
		agentCPU := ""
		if a.agent != nil {
			agentCPU = ", agent process " + per(c.cpu[2])
		}
		fmt.Fprintf(&b, "  %-11s this process (libcni) %s, plugin processes %s%s\n", a.name, per(c.cpu[0]), per(c.cpu[1]), agentCPU)
		own := c.cpu[0] + c.cpu[1] + c.cpu[2]
		fmt.Fprintf(&b, "  %-11s the machine: %s busy per ADD (%s on no process's account), %.2f of %d CPUs busy\n",
			"", per(c.machine), per(c.machine-own), c.machine.Seconds()/c.busy.Seconds(), runtime.NumCPU())
	}
	if only {
		for _, a := range arms {
			c := res[a.name]
			fmt.Fprintf(&b, "  %-11s %.0f ADDs/s, ADD p50 %s\n", a.name, float64(total)/c.busy.Seconds(), ms(summarize(c.lat).p50))
		}
		fmt.Print(b.String())
		return
	}
	b.WriteString(report(n, conc, rounds, arms, seq, res, load0, loadAvg()))
	b.WriteString(headlines(arms, conc, seq, res))
	b.WriteString(breakdown(t, arms, calls, phasesFile, snaps))
	out := b.String()
	fmt.Print(out)
	if path := os.Getenv("BENCH_OUT"); path != "" {
		_ = os.WriteFile(path, []byte(out), 0o644)
	}
}

// phasesDir is where the plugin appends its phase records: a directory
// of its own on tmpfs (/dev/shm) where there is one, else dir. The
// plugin writes after its last phase, inside what the breakdown calls
// its exit, and only Membrane's arms write: on a disk other engineers
// fsync, the append could wait for the filesystem's journal.
func phasesDir(t *testing.T, dir string) string {
	var fs syscall.Statfs_t
	if syscall.Statfs("/dev/shm", &fs) != nil || fs.Type != tmpfsMagic {
		return dir
	}
	d, err := os.MkdirTemp("/dev/shm", "cnibench-")
	if err != nil {
		return dir
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// tmpfsMagic is statfs's f_type of tmpfs (TMPFS_MAGIC).
const tmpfsMagic = 0x01021994

// concResult is one arm's concurrent rounds: time spent, CPU (this
// process, the plugin processes) and every ADD's latency.
type concResult struct {
	busy time.Duration
	cpu  [3]time.Duration // this process, plugin processes, the agent process
	// machine is the CPU time the whole machine spent busy (every CPU:
	// wall time minus /proc/stat's idle, machineIdle) during the rounds:
	// with cpu it shows the kernel's work on nobody's account (netns
	// cleanups, RCU callbacks, softirqs) and how much of the processors
	// the arm left idle.
	machine time.Duration
	lat     []time.Duration
}

// rotate returns arms starting at index r (mod len).
func rotate(arms []*arm, r int) []*arm {
	k := r % len(arms)
	return append(append([]*arm(nil), arms[k:]...), arms[:k]...)
}

// loadAvg is /proc/loadavg's three load averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// report formats the results as a markdown table: every Membrane arm
// against ptp (the last arm), sequential ADD and DEL, and ADDs with conc
// workers.
func report(n, conc, rounds int, arms []*arm, seq map[string][2]stats, res map[string]*concResult, load0, load1 string) string {
	ref := arms[len(arms)-1]
	head := "| what |"
	sep := "|---|"
	for _, a := range arms {
		head += " " + a.name + " |"
		sep += "---|"
	}
	for _, a := range arms[:len(arms)-1] {
		head += " " + a.name + "/ptp |"
		sep += "---|"
	}
	total := n / rounds * rounds
	conc8 := map[string]stats{}
	for name, c := range res {
		conc8[name] = summarize(c.lat)
	}
	row := func(what string, get func(name string) time.Duration) string {
		r := "| " + what + " |"
		for _, a := range arms {
			r += " " + ms(get(a.name)) + " |"
		}
		for _, a := range arms[:len(arms)-1] {
			r += fmt.Sprintf(" %.2f |", ratio(get(a.name), get(ref.name)))
		}
		return r
	}
	rows := []string{
		row("ADD p50, 1 at a time", func(m string) time.Duration { return seq[m][0].p50 }),
		row("ADD p99, 1 at a time", func(m string) time.Duration { return seq[m][0].p99 }),
		row("ADD slowest, 1 at a time", func(m string) time.Duration { return seq[m][0].max }),
		row(fmt.Sprintf("ADD p50, %d concurrent", conc), func(m string) time.Duration { return conc8[m].p50 }),
		row(fmt.Sprintf("ADD p99, %d concurrent", conc), func(m string) time.Duration { return conc8[m].p99 }),
		row("DEL p50, 1 at a time", func(m string) time.Duration { return seq[m][1].p50 }),
		row("DEL p99, 1 at a time", func(m string) time.Duration { return seq[m][1].p99 }),
	}
	thr := "| ADDs/s, " + strconv.Itoa(conc) + " concurrent |"
	for _, a := range arms {
		thr += fmt.Sprintf(" %.0f |", float64(total)/res[a.name].busy.Seconds())
	}
	for _, a := range arms[:len(arms)-1] {
		thr += fmt.Sprintf(" %.2f |", res[ref.name].busy.Seconds()/res[a.name].busy.Seconds())
	}
	rows = append(rows, thr)
	return fmt.Sprintf("\n%d sequential ADDs then DELs per arm, %d concurrent ADDs per arm with %d workers "+
		"(%d rounds; arms alternating), kernel %s, %s, %s, load average %s at the start, %s at the end\n\n"+
		"%s\n%s\n%s\n",
		n, total, conc, rounds, kernel(), refVersion(), time.Now().UTC().Format("2006-01-02 15:04 UTC"), load0, load1,
		head, sep, strings.Join(rows, "\n"))
}

// headlines are the ratios scripts/bench-headline.sh collects, one
// "headline: what | value | target" line each.
func headlines(arms []*arm, conc int, seq map[string][2]stats, res map[string]*concResult) string {
	ref := arms[len(arms)-1].name
	var b strings.Builder
	b.WriteString("\n")
	for _, a := range arms[:len(arms)-1] {
		mode := map[string]string{"membrane": "TCX", "membrane-tc": "tc", "base": "TCX, BENCH_BASE_PLUGIN", "base-tc": "tc, BENCH_BASE_PLUGIN"}[a.name]
		c, p := summarize(res[a.name].lat), summarize(res[ref].lat)
		for _, h := range []struct {
			what   string
			r      float64
			target string
		}{
			{"CNI ADD p50 / ptp+host-local, 1 at a time", ratio(seq[a.name][0].p50, seq[ref][0].p50), "<= 0.4"},
			{"CNI ADD p99 / ptp+host-local, 1 at a time", ratio(seq[a.name][0].p99, seq[ref][0].p99), "<= 0.6"},
			{fmt.Sprintf("CNI ADD p50 / ptp+host-local, %d concurrent", conc), ratio(c.p50, p.p50), "<= 0.6"},
			{fmt.Sprintf("CNI ADD p99 / ptp+host-local, %d concurrent", conc), ratio(c.p99, p.p99), "<= 1.0"},
			{"CNI DEL p50 / ptp, 1 at a time", ratio(seq[a.name][1].p50, seq[ref][1].p50), "<= 0.5"},
		} {
			fmt.Fprintf(&b, "headline: %s (%s attach) | %.2f | %s\n", h.what, mode, h.r, h.target)
		}
	}
	return b.String()
}

// buildPlugin builds membrane-cni as `make build` does into dir/bin.
func buildPlugin(t *testing.T, dir string) string {
	t.Helper()
	if err := testutil.BuildBinaries(filepath.Join(dir, "build"), "membrane-cni"); err != nil {
		t.Fatal(err)
	}
	return installPlugin(t, filepath.Join(dir, "build", "membrane-cni"), filepath.Join(dir, "bin"))
}

// basePluginDir installs the plugin binary at path into a directory of
// its own under dir, as membrane-cni, and returns that directory.
func basePluginDir(t *testing.T, dir, path string) string {
	t.Helper()
	return installPlugin(t, path, filepath.Join(dir, "bin-base"))
}

// installPlugin copies the plugin binary at path into bin as
// membrane-cni, as a node installs it (make install, the DaemonSet's
// init container: a copy in /opt/cni/bin), and returns bin. The
// linker's output is not run in place: right after the link, its pages
// in the page cache made each exec about 0.2 ms slower than a copy's
// (BENCHMARKS.md, "CNI plugin and host path").
func installPlugin(t *testing.T, path, bin string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("plugin binary: %v", err)
	}
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "membrane-cni"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// armRanges are each Membrane arm's pod CIDRs.
var armRanges = map[string][2]string{
	"membrane":    {"10.245.0.0/16", "fd00:245::/112"},
	"membrane-tc": {"10.247.0.0/16", "fd00:247::/112"},
	"base":        {"10.249.0.0/16", "fd00:249::/112"},
	"base-tc":     {"10.248.0.0/16", "fd00:248::/112"},
	"noflows-tc":  {"10.252.0.0/16", "fd00:252::/112"},
}

// startMembrane starts an agent in host (dual: with an IPv6 range too;
// endpointTCX: endpoint programs attached with TCX, else with cls_bpf as
// by default) and returns its arm.
func startMembrane(t *testing.T, dir, bin, agentBin string, host *testutil.NS, name string, endpointTCX, dual bool, extra ...string) *arm {
	t.Helper()
	dir = filepath.Join(dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	attach := map[bool]string{true: "tcx", false: "auto"}[endpointTCX]
	args := []string{"--state-dir", filepath.Join(dir, "state"), "--ipv4-range", armRanges[name][0],
		"--datapath", "linux", "--bpffs", testutil.BPFFSDir(t), "--bpf-attach", attach,
		"--delete-queue-dir", filepath.Join(dir, "queue"), "--http-addr", "", "--enable-health=false", "--log-level", "warn"}
	if dual {
		args = append(args, "--ipv6-range", armRanges[name][1])
	}
	args = append(args, extra...)
	a := startAgent(t, host, agentBin, dir, args...)
	raw := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"membrane-bench","plugins":[{"type":"membrane-cni","socket":%q,"deleteQueueDir":%q,"mtu":1500}]}`,
		a.socket, filepath.Join(dir, "queue"))
	ar := newArm(t, name, host, []string{bin}, filepath.Join(dir, "cache"), raw)
	ar.agent = a
	return ar
}

// ptpArm is ptp with host-local (dual: a range of each family).
func ptpArm(t *testing.T, dir string, host *testutil.NS, dual bool) *arm {
	ranges := `[[{"subnet":"10.246.0.0/16"}]]`
	if dual {
		ranges = `[[{"subnet":"10.246.0.0/16"}],[{"subnet":"fd00:246::/112"}]]`
	}
	raw := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"ptp-bench","plugins":[{"type":"ptp","ipMasq":false,"mtu":1500,
		"ipam":{"type":"host-local","ranges":%s,"dataDir":%q}}]}`, ranges, filepath.Join(dir, "host-local"))
	return newArm(t, "ptp", host, []string{refPluginDir}, filepath.Join(dir, "cache-ptp"), raw)
}

func newArm(t *testing.T, name string, host *testutil.NS, path []string, cache, raw string) *arm {
	t.Helper()
	conf, err := libcni.NetworkConfFromBytes([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	ex := newTimedExec()
	return &arm{name: name, cni: libcni.NewCNIConfigWithCacheDir(path, cache, ex), conf: conf, host: host, exec: ex}
}

// sandbox is one pod: its netns and runtime config.
type sandbox struct {
	ns *testutil.NS
	rt *libcni.RuntimeConf
}

func newSandboxes(t *testing.T, n int, prefix string) []*sandbox {
	t.Helper()
	out := make([]*sandbox, n)
	for i := range out {
		ns, err := testutil.CreateNS(fmt.Sprintf("%s-%s-%d", prefix, testutil.RandomSuffix(6), i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ns.Remove() })
		id := "bench" + testutil.RandomSuffix(20)
		out[i] = &sandbox{ns: ns, rt: &libcni.RuntimeConf{ContainerID: id, NetNS: ns.Path, IfName: "eth0",
			Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "bench"}, {"K8S_POD_NAME", "pod-" + strconv.Itoa(i)},
				{"K8S_POD_INFRA_CONTAINER_ID", id}, {"K8S_POD_UID", "uid-" + strconv.Itoa(i)}}}}
	}
	return out
}

// timed runs op in the host netns (where plugins are exec'd) and returns
// when it started and ended.
func timed(t *testing.T, host *testutil.NS, what string, op func(ctx context.Context) error) call {
	t.Helper()
	var c call
	err := host.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		c.start = time.Now()
		err := op(ctx)
		c.end = time.Now()
		return err
	})
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return c
}

// call is one timed CNI call: when libcni was asked and when it answered.
type call struct {
	arm        string
	start, end time.Time
}

// calls are the sequential ADDs and DELs by container ID.
type calls struct{ add, del map[string]call }

// sequential runs n ADDs per arm, calls addsDone, then n DELs per arm, each DEL followed
// (unmeasured) by the runtime's next step, removing the netns. Arms
// alternate call by call, the first of each turn rotating too.
func sequential(t *testing.T, arms []*arm, n int, addsDone func()) (map[string][2]stats, calls) {
	pods := map[string][]*sandbox{}
	adds, dels := map[string][]time.Duration{}, map[string][]time.Duration{}
	cs := calls{add: map[string]call{}, del: map[string]call{}}
	for _, a := range arms {
		pods[a.name] = newSandboxes(t, n, "mbb-"+a.name)
	}
	time.Sleep(time.Second) // the kernel's work after creating the namespaces
	for i := range n {
		for _, a := range rotate(arms, i) {
			p := pods[a.name][i]
			c := timed(t, a.host, a.name+" ADD", func(ctx context.Context) error {
				_, err := a.cni.AddNetworkList(ctx, a.conf, p.rt)
				return err
			})
			c.arm = a.name
			cs.add[p.rt.ContainerID] = c
			adds[a.name] = append(adds[a.name], c.end.Sub(c.start))
		}
	}
	addsDone()
	for i := range n {
		for _, a := range rotate(arms, i) {
			p := pods[a.name][i]
			c := timed(t, a.host, a.name+" DEL", func(ctx context.Context) error {
				return a.cni.DelNetworkList(ctx, a.conf, p.rt)
			})
			c.arm = a.name
			cs.del[p.rt.ContainerID] = c
			dels[a.name] = append(dels[a.name], c.end.Sub(c.start))
			if err := p.ns.Remove(); err != nil {
				t.Fatal(err)
			}
		}
	}
	out := map[string][2]stats{}
	for _, a := range arms {
		out[a.name] = [2]stats{summarize(adds[a.name]), summarize(dels[a.name])}
	}
	return out, cs
}

// warmUp makes a few unmeasured ADDs per arm, deleted when the test
// ends, and lets the machine settle: a node's agent runs long before its
// pods, so the first measured ADDs must not meet the agents' start (the
// spare policy map slots being filled) or a plugin binary not yet read.
func warmUp(t *testing.T, arms []*arm) {
	const n = 3
	for _, a := range arms {
		for _, p := range newSandboxes(t, n, "mbw-"+a.name) {
			timed(t, a.host, a.name+" warm-up ADD", func(ctx context.Context) error {
				_, err := a.cni.AddNetworkList(ctx, a.conf, p.rt)
				return err
			})
			t.Cleanup(func() {
				_ = a.host.Do(func() error {
					ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
					defer cancel()
					return a.cni.DelNetworkList(ctx, a.conf, p.rt)
				})
			})
		}
	}
	time.Sleep(time.Second)
}

// concurrentRound runs n ADDs with conc workers and returns how long they
// took, the CPU time this process (libcni, and the agents) and the
// plugin processes used, and each ADD's latency; the pods are deleted
// afterwards, unmeasured.
func concurrentRound(t *testing.T, a *arm, n, conc int) (time.Duration, [4]time.Duration, []time.Duration) {
	pods := newSandboxes(t, n, "mbc-"+a.name)
	work := make(chan *sandbox)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	lat := make(chan time.Duration, n)
	self0, kids0, agent0 := cpuTime(syscall.RUSAGE_SELF), cpuTime(syscall.RUSAGE_CHILDREN), a.agentCPU()
	idle0 := machineIdle(t)
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range work {
				err := a.host.Do(func() error {
					ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
					defer cancel()
					t0 := time.Now()
					_, err := a.cni.AddNetworkList(ctx, a.conf, p.rt)
					lat <- time.Since(t0)
					return err
				})
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	for _, p := range pods {
		work <- p
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(start)
	idle := machineIdle(t) - idle0
	used := [4]time.Duration{cpuTime(syscall.RUSAGE_SELF) - self0, cpuTime(syscall.RUSAGE_CHILDREN) - kids0, a.agentCPU() - agent0,
		max(0, elapsed*time.Duration(runtime.NumCPU())-idle)}
	close(errs)
	close(lat)
	for err := range errs {
		t.Fatalf("%s concurrent ADD: %v", a.name, err)
	}
	var ls []time.Duration
	for d := range lat {
		ls = append(ls, d)
	}
	for _, p := range pods {
		timed(t, a.host, a.name+" DEL", func(ctx context.Context) error { return a.cni.DelNetworkList(ctx, a.conf, p.rt) })
		_ = p.ns.Remove()
	}
	return elapsed, used, ls
}

// agentCPU is the arm's agent process's CPU time so far (0 for ptp).
func (a *arm) agentCPU() time.Duration {
	if a.agent == nil {
		return 0
	}
	return a.agent.cpu()
}

// machineIdle is the time every CPU together spent idle or waiting for
// I/O (/proc/stat, USER_HZ ticks of 10 ms). The kernel keeps idle time
// exactly (from the moments a CPU goes idle and wakes); its user and
// system fields are sampled at the tick and miss short bursts (here they
// saw a quarter of a veth benchmark's CPU), so busy time is wall time
// times CPUs minus this.
func machineIdle(t *testing.T) time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait ...
	if len(f) < 6 || f[0] != "cpu" {
		t.Fatalf("/proc/stat: first line %q", line)
	}
	var idle int64
	for _, v := range f[4:6] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("/proc/stat: %q: %v", line, err)
		}
		idle += n
	}
	return time.Duration(idle) * 10 * time.Millisecond
}

// cpuTime is the user+sys time of this process or its reaped children.
func cpuTime(who int) time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(who, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type stats struct{ p50, p99, max time.Duration }

// summarize returns the nearest-rank quantiles of ds (the q-quantile of
// n values is the ceil(q*n)-th smallest: of 100 calls, the p99 is the
// 99th, not the slowest; of 200, the 198th) and the slowest.
func summarize(ds []time.Duration) stats {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	at := func(pct int) time.Duration { // rank ceil(pct*n/100), in integers
		return s[max(1, (pct*len(s)+99)/100)-1]
	}
	return stats{p50: at(50), p99: at(99), max: s[len(s)-1]}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func kernel() string {
	out, _ := exec.Command("uname", "-r").Output()
	return strings.TrimSpace(string(out))
}

func refVersion() string {
	out, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", "containernetworking-plugins").Output()
	if err != nil {
		return "containernetworking-plugins (version unknown)"
	}
	return "containernetworking-plugins " + strings.TrimSpace(string(out))
}
