package cnibench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// refPluginDir is where Debian's containernetworking-plugins installs ptp
// and host-local.
const refPluginDir = "/usr/lib/cni"

// arm is one plugin set under test.
type arm struct {
	name string
	cni  *libcni.CNIConfig
	conf *libcni.NetworkConfigList
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
	membrane := startMembrane(t, dir, host, dual)
	ptp := ptpArm(t, dir, dual)
	if dual {
		fmt.Println("dual-stack: both arms give every pod an IPv4 and an IPv6 address")
	}

	if os.Getenv("BENCH_ONLY") == "concurrent" { // for profiling
		for _, a := range []*arm{membrane, ptp} {
			fmt.Printf("%s: %.0f ADDs/s\n", a.name, concurrent(t, host, a, n, conc))
		}
		return
	}
	// The arms alternate, call by call and round by round, so that both
	// see the same machine (other work, the kernel's netns cleanups).
	seq := sequential(t, host, []*arm{membrane, ptp}, n)
	thr := map[string]float64{}
	const rounds = 4
	busy := map[string]time.Duration{}
	cpu := map[string][2]time.Duration{} // this process (libcni, agent), the plugin processes
	for r := range rounds {
		order := []*arm{membrane, ptp}
		if r%2 == 1 {
			order[0], order[1] = ptp, membrane
		}
		for _, a := range order {
			elapsed, used := concurrentRound(t, host, a, n/rounds, conc)
			busy[a.name] += elapsed
			c := cpu[a.name]
			c[0], c[1] = c[0]+used[0], c[1]+used[1]
			cpu[a.name] = c
		}
	}
	for name, d := range busy {
		thr[name] = float64(n/rounds*rounds) / d.Seconds()
	}
	fmt.Printf("\nCPU per concurrent ADD (user+sys, from getrusage):\n")
	for _, name := range []string{"membrane", "ptp"} {
		c := cpu[name]
		fmt.Printf("  %-8s this process (libcni%s) %s, plugin processes %s\n", name,
			map[string]string{"membrane": " and the agent", "ptp": ""}[name],
			ms(c[0]/time.Duration(n/rounds*rounds)), ms(c[1]/time.Duration(n/rounds*rounds)))
	}
	m, p := seq["membrane"], seq["ptp"]
	out := report(n, conc, rounds, m, p, thr)
	fmt.Print(out)
	if path := os.Getenv("BENCH_OUT"); path != "" {
		_ = os.WriteFile(path, []byte(out), 0o644)
	}
	if m[0].p50 > p[0].p50 || m[1].p50 > p[1].p50 || thr["membrane"] < 1.5*thr["ptp"] {
		t.Logf("a target was missed (ADD p50 <= ptp, DEL p50 <= ptp, throughput >= 1.5x ptp)")
	}
}

// report formats the results as a markdown table; m and p are the
// sequential ADD and DEL stats of Membrane and ptp.
func report(n, conc, rounds int, m, p [2]stats, thr map[string]float64) string {
	rows := []string{
		fmt.Sprintf("| ADD p50 | %s | %s | %.2f |", ms(m[0].p50), ms(p[0].p50), ratio(m[0].p50, p[0].p50)),
		fmt.Sprintf("| ADD p99 | %s | %s | %.2f |", ms(m[0].p99), ms(p[0].p99), ratio(m[0].p99, p[0].p99)),
		fmt.Sprintf("| DEL p50 | %s | %s | %.2f |", ms(m[1].p50), ms(p[1].p50), ratio(m[1].p50, p[1].p50)),
		fmt.Sprintf("| DEL p99 | %s | %s | %.2f |", ms(m[1].p99), ms(p[1].p99), ratio(m[1].p99, p[1].p99)),
		fmt.Sprintf("| ADDs/s, %d concurrent (%d rounds of %d) | %.0f | %.0f | %.2f |", conc, rounds, n/rounds,
			thr["membrane"], thr["ptp"], thr["membrane"]/thr["ptp"]),
	}
	return fmt.Sprintf("\n%d sequential ADDs then DELs per plugin (arms alternating), kernel %s, %s\n\n"+
		"| what | membrane-cni | ptp + host-local | membrane/ptp |\n|---|---|---|---|\n%s\n",
		n, kernel(), refVersion(), strings.Join(rows, "\n"))
}

// startMembrane starts the agent (dual: with an IPv6 range too) and
// returns its arm.
func startMembrane(t *testing.T, dir string, host *testutil.NS, dual bool) *arm {
	t.Helper()
	bin := filepath.Join(dir, "bin")
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(bin, "membrane-cni"), "github.com/membrane-cni/membrane/cmd/membrane-cni")
	build.Env = append(os.Environ(), "CGO_ENABLED=0") // as `make build` builds it
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build membrane-cni: %v\n%s", err, out)
	}
	sock := filepath.Join(dir, "agent.sock")
	cfg := agent.Config{
		Socket: sock, StateDir: filepath.Join(dir, "state"), IPv4Range: netip.MustParsePrefix("10.245.0.0/16"),
		Datapath: "linux", Linux: datapath.LinuxConfig{HostNetns: host.Path, BPFFS: testutil.BPFFSDir(t)}, DeleteQueueDir: filepath.Join(dir, "queue"),
	}
	if dual {
		cfg.IPv6Range = netip.MustParsePrefix("fd00:245::/112")
	}
	a, err := agent.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_ = a.Stop(ctx)
	})
	raw := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"membrane-bench","plugins":[{"type":"membrane-cni","socket":%q,"deleteQueueDir":%q,"mtu":1500}]}`,
		sock, filepath.Join(dir, "queue"))
	return newArm(t, "membrane", []string{bin}, filepath.Join(dir, "cache-membrane"), raw)
}

// ptpArm is ptp with host-local (dual: a range of each family).
func ptpArm(t *testing.T, dir string, dual bool) *arm {
	ranges := `[[{"subnet":"10.246.0.0/16"}]]`
	if dual {
		ranges = `[[{"subnet":"10.246.0.0/16"}],[{"subnet":"fd00:246::/112"}]]`
	}
	raw := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"ptp-bench","plugins":[{"type":"ptp","ipMasq":false,"mtu":1500,
		"ipam":{"type":"host-local","ranges":%s,"dataDir":%q}}]}`, ranges, filepath.Join(dir, "host-local"))
	return newArm(t, "ptp", []string{refPluginDir}, filepath.Join(dir, "cache-ptp"), raw)
}

func newArm(t *testing.T, name string, path []string, cache, raw string) *arm {
	t.Helper()
	conf, err := libcni.NetworkConfFromBytes([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	return &arm{name: name, cni: libcni.NewCNIConfigWithCacheDir(path, cache, nil), conf: conf}
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
// how long it took.
func timed(t *testing.T, host *testutil.NS, what string, op func(ctx context.Context) error) time.Duration {
	t.Helper()
	var d time.Duration
	err := host.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		start := time.Now()
		err := op(ctx)
		d = time.Since(start)
		return err
	})
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return d
}

// sequential runs n ADDs per arm, then n DELs per arm, each DEL followed
// (unmeasured) by the runtime's next step, removing the netns. Arms
// alternate call by call, the first of each pair alternating too.
func sequential(t *testing.T, host *testutil.NS, arms []*arm, n int) map[string][2]stats {
	pods := map[string][]*sandbox{}
	adds, dels := map[string][]time.Duration{}, map[string][]time.Duration{}
	for _, a := range arms {
		pods[a.name] = newSandboxes(t, n, "mbb-"+a.name)
	}
	order := func(i int) []*arm {
		if i%2 == 0 {
			return arms
		}
		return []*arm{arms[1], arms[0]}
	}
	for i := range n {
		for _, a := range order(i) {
			p := pods[a.name][i]
			adds[a.name] = append(adds[a.name], timed(t, host, a.name+" ADD", func(ctx context.Context) error {
				_, err := a.cni.AddNetworkList(ctx, a.conf, p.rt)
				return err
			}))
		}
	}
	for i := range n {
		for _, a := range order(i) {
			p := pods[a.name][i]
			dels[a.name] = append(dels[a.name], timed(t, host, a.name+" DEL", func(ctx context.Context) error {
				return a.cni.DelNetworkList(ctx, a.conf, p.rt)
			}))
			if err := p.ns.Remove(); err != nil {
				t.Fatal(err)
			}
		}
	}
	out := map[string][2]stats{}
	for _, a := range arms {
		out[a.name] = [2]stats{summarize(adds[a.name]), summarize(dels[a.name])}
	}
	return out
}

// concurrent runs n ADDs with conc workers and returns ADDs per second.
func concurrent(t *testing.T, host *testutil.NS, a *arm, n, conc int) float64 {
	elapsed, _ := concurrentRound(t, host, a, n, conc)
	return float64(n) / elapsed.Seconds()
}

// concurrentRound runs n ADDs with conc workers and returns how long they
// took and the CPU time this process (libcni, and the agent for
// Membrane) and the plugin processes used; the pods are deleted
// afterwards, unmeasured.
func concurrentRound(t *testing.T, host *testutil.NS, a *arm, n, conc int) (time.Duration, [2]time.Duration) {
	pods := newSandboxes(t, n, "mbc-"+a.name)
	work := make(chan *sandbox)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	self0, kids0 := cpuTime(syscall.RUSAGE_SELF), cpuTime(syscall.RUSAGE_CHILDREN)
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range work {
				err := host.Do(func() error {
					ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
					defer cancel()
					_, err := a.cni.AddNetworkList(ctx, a.conf, p.rt)
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
	used := [2]time.Duration{cpuTime(syscall.RUSAGE_SELF) - self0, cpuTime(syscall.RUSAGE_CHILDREN) - kids0}
	close(errs)
	for err := range errs {
		t.Fatalf("%s concurrent ADD: %v", a.name, err)
	}
	for _, p := range pods {
		timed(t, host, a.name+" DEL", func(ctx context.Context) error { return a.cni.DelNetworkList(ctx, a.conf, p.rt) })
		_ = p.ns.Remove()
	}
	return elapsed, used
}

// cpuTime is the user+sys time of this process or its reaped children.
func cpuTime(who int) time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(who, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type stats struct{ p50, p99 time.Duration }

func summarize(ds []time.Duration) stats {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return stats{p50: at(0.50), p99: at(0.99)}
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
