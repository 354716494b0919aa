// Command membrane-sim drives thousands of endpoints through a real
// membrane agent (actors, index, REST API on its unix socket, state
// directory) in one process, with faults and crash/restarts, checks
// invariants during and after the run, and reports throughput, latency,
// heap per endpoint and violations. It exits 1 if any invariant was
// violated, 2 on a bad flag or scenario. See sim/doc.go.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/membrane-cni/membrane/sim"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// config is what the flags say beyond the scenario.
type config struct {
	sc       sim.Scenario
	report   string
	html     string
	agentLog string
	logLevel slog.Level
	progress string
	dir      string
	cpuProf  string
	memProf  string
	cniBin   string
	// soak fails the run (exit 1) when a resource grew over the churn's
	// second half (sim.ResourceSlopes.Growing).
	soak bool
	// nodes > 0 is the multi-node run (kvstore mode, shared etcd).
	nodes, etcdRestarts int
	etcdBin             string
	leaseTTL            time.Duration // the nodes' kvstore lease (0: the simulator's 2 s)
	// sweepNodes is the node-count sweep (--sweep-nodes) over
	// sweepEndpoints endpoints in the cluster.
	sweepNodes     []int
	sweepEndpoints int
	perNodeSet     bool // --endpoints was given
	workersSet     bool // --workers was given
}

func run(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "membrane-sim: %v\n", err)
		return 2
	}
	opts, closeLog, err := options(cfg, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "membrane-sim: %v\n", err)
		return 2
	}
	defer closeLog()
	ctx, stop := interruptible(stderr)
	defer stop()
	if cfg.cpuProf != "" {
		stopProf, err := startCPUProfile(cfg.cpuProf)
		if err != nil {
			fmt.Fprintf(stderr, "membrane-sim: %v\n", err)
			return 2
		}
		defer stopProf()
	}
	if len(cfg.sweepNodes) > 0 {
		return runScale(ctx, cfg, opts, stdout, stderr)
	}
	if cfg.nodes > 0 {
		return runMulti(ctx, cfg, opts, stdout, stderr)
	}
	rep, err := sim.Run(ctx, cfg.sc, opts)
	if cfg.memProf != "" {
		if perr := writeAllocProfile(cfg.memProf); perr != nil {
			fmt.Fprintf(stderr, "membrane-sim: %v\n", perr)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "membrane-sim: %v\n", err)
		if errors.Is(err, sim.ErrInvalidScenario) || errors.Is(err, sim.ErrLinuxUnavailable) {
			return 2
		}
		return 1
	}
	return writeReport(rep, cfg, stdout, stderr)
}

// multiConfig is the multi-node configuration the flags give; cleanup
// removes the temporary directory made when --dir was not given.
func multiConfig(cfg config, opts sim.Options) (mc sim.MultiConfig, cleanup func(), err error) {
	mc = sim.MultiConfig{Nodes: cfg.nodes, EndpointsPerNode: cfg.sc.Endpoints, Duration: cfg.sc.Duration.D(),
		Crashes: cfg.sc.Crashes, EtcdRestarts: cfg.etcdRestarts, EtcdBin: cfg.etcdBin, Identities: cfg.sc.Identities, ChurnRate: cfg.sc.ChurnRate,
		Seed: uint64(cfg.sc.Seed), Dir: cfg.dir, LeaseTTL: cfg.leaseTTL}
	if !cfg.perNodeSet {
		mc.EndpointsPerNode = 100
	}
	if cfg.workersSet {
		mc.WorkersPerNode = cfg.sc.Workers
	}
	if opts.AgentLog != nil {
		mc.Log = slog.New(opts.AgentLog)
	}
	cleanup = func() {}
	if mc.Dir == "" {
		// On a tmpfs like a node's /run (the agents' default state
		// directory), as the single-node run.
		dir, err := os.MkdirTemp(sim.RunDirBase(), "membrane-sim-nodes-")
		if err != nil {
			return mc, cleanup, err
		}
		cleanup = func() { _ = os.RemoveAll(dir) }
		mc.Dir = dir
	}
	return mc, cleanup, nil
}

// runScale runs membrane-sim --sweep-nodes and prints its report.
func runScale(ctx context.Context, cfg config, opts sim.Options, stdout, stderr io.Writer) int {
	mc, cleanup, err := multiConfig(cfg, opts)
	if err != nil {
		fmt.Fprintf(stderr, "membrane-sim: %v\n", err)
		return 1
	}
	defer cleanup()
	fmt.Fprintln(stderr, "one run per node count, as each ends:")
	rep, err := sim.RunScale(ctx, sim.ScaleConfig{Nodes: cfg.sweepNodes, TotalEndpoints: cfg.sweepEndpoints, Base: mc, Progress: stderr})
	if err != nil {
		fmt.Fprintf(stderr, "membrane-sim: %v\n", err)
		if rep == nil || len(rep.Rows) == 0 {
			return 1
		}
	}
	if code := writeReport(rep, cfg, stdout, stderr); err == nil { // the rows so far are written either way
		return code
	}
	return 1
}

// runMulti runs membrane-sim --nodes N and prints its report.
func runMulti(ctx context.Context, cfg config, opts sim.Options, stdout, stderr io.Writer) int {
	mc, cleanup, err := multiConfig(cfg, opts)
	if err != nil {
		fmt.Fprintf(stderr, "membrane-sim: %v\n", err)
		return 1
	}
	defer cleanup()
	rep, err := sim.RunMultiNode(ctx, mc)
	if err != nil {
		fmt.Fprintf(stderr, "membrane-sim: %v\n", err)
		return 1
	}
	return writeReport(rep, cfg, stdout, stderr)
}

// report is what both runs report (sim.Report, sim.MultiReport).
type report interface {
	WriteText(io.Writer)
	WriteJSONFile(string) error
	WriteHTMLFile(string) error
	OK() bool
}

// writeReport prints rep, writes the files --report and --html name, and
// returns the exit code: 1 when a file cannot be written or the run
// failed its checks.
func writeReport(rep report, cfg config, stdout, stderr io.Writer) int {
	rep.WriteText(stdout)
	for path, write := range map[string]func(string) error{cfg.report: rep.WriteJSONFile, cfg.html: rep.WriteHTMLFile} {
		if path == "" {
			continue
		}
		if err := write(path); err != nil {
			fmt.Fprintf(stderr, "membrane-sim: %v\n", err)
			return 1
		}
	}
	if !rep.OK() {
		return 1
	}
	if r, ok := rep.(*sim.Report); ok && cfg.soak {
		if r.Resources == nil {
			fmt.Fprintln(stderr, "membrane-sim: --soak: the churn phase was too short to fit the resources (want at least 30 s)")
			return 1
		}
		if len(r.Resources.Growing) > 0 {
			fmt.Fprintf(stderr, "membrane-sim: --soak: growing: %s\n", strings.Join(r.Resources.Growing, "; "))
			return 1
		}
	}
	return 0
}

// interruptible ends the load at the first SIGINT/SIGTERM (the run still
// settles, drains and reports) and exits at the second.
func interruptible(stderr io.Writer) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		if _, ok := <-ch; !ok {
			return
		}
		fmt.Fprintln(stderr, "\nmembrane-sim: interrupted; settling, draining and reporting (interrupt again to abort)")
		cancel()
		if _, ok := <-ch; ok {
			sim.AbortCleanup() // --datapath linux: network namespaces, bpffs mount
			os.Exit(130)
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		close(ch)
		cancel()
	}
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("membrane-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	d := sim.Defaults()
	var cfg config
	var scenarioFile, level string
	var duration, downtime time.Duration
	var faultRate float64
	fs.StringVar(&scenarioFile, "scenario", "", "scenario file (JSON, see sim/scenarios/); flags given as well override it")
	fs.IntVar(&d.Endpoints, "endpoints", d.Endpoints, "live endpoints to ramp up to and hold")
	fs.DurationVar(&duration, "duration", d.Duration.D(), "length of the churn phase (after the ramp-up)")
	fs.Uint64Var(&d.Seed, "seed", d.Seed, "seed of every random choice")
	fs.IntVar(&d.Crashes, "crashes", d.Crashes, "agent crash/restarts at random moments of the churn phase")
	fs.DurationVar(&downtime, "crash-downtime", d.CrashDowntime.D(), "longest downtime per crash")
	fs.Float64Var(&faultRate, "fault-rate", 0, "turn every fault on at this rate: datapath errors, slow datapath, lost proxy acks, client timeouts")
	fs.StringVar(&d.Datapath, "datapath", d.Datapath, "datapath: fake, or linux (root: the real plugin and BPF, a netns per pod; at most 500 endpoints without --force)")
	fs.IntVar(&d.Workers, "workers", d.Workers, "concurrent kubelet-like clients")
	fs.Float64Var(&d.ArrivalRate, "arrival-rate", d.ArrivalRate, "pod creations per second during the ramp-up (0: as fast as possible)")
	fs.Float64Var(&d.ChurnRate, "churn-rate", d.ChurnRate, "lifecycles per second during churn (0: as fast as possible)")
	fs.IntVar(&d.Regenerations, "regenerations", d.Regenerations, "regenerations per new pod")
	fs.Float64Var(&d.LabelChurn, "label-churn", d.LabelChurn, "probability per lifecycle of relabelling a random live pod")
	fs.Float64Var(&d.PolicyChurn, "policy-churn", d.PolicyChurn, "probability per lifecycle of a policy change (CNP or NetworkPolicy imported, replaced or deleted)")
	fs.StringVar(&cfg.report, "report", "", "write the report as JSON to this file")
	fs.StringVar(&cfg.html, "html", "", "write a self-contained HTML report with plots to this file")
	fs.StringVar(&cfg.agentLog, "agent-log", "", "write the agent's log to this file (default: discarded)")
	fs.StringVar(&level, "log-level", "warn", "level of the agent's log: debug, info, warn, error")
	fs.StringVar(&cfg.progress, "progress", "auto", "progress line: auto (on a terminal), always, never")
	fs.StringVar(&cfg.dir, "dir", "", "directory for the agent's socket and state (default: a temporary one, removed)")
	fs.StringVar(&cfg.cniBin, "cni-bin", "", "directory holding membrane-cni for --datapath linux (default: next to membrane-sim, ./bin, PATH)")
	fs.BoolVar(&cfg.soak, "soak", false, "exit 1 when the agent's heap, goroutines, fds, state directory or pins grew over the churn phase's second half (the report's resource slopes)")
	fs.BoolVar(&d.ForceLinux, "force", false, "let --datapath linux run more than 500 endpoints")
	fs.StringVar(&cfg.cpuProf, "cpuprofile", "", "write a CPU profile of the whole run (harness and agent) to this file")
	fs.StringVar(&cfg.memProf, "memprofile", "", "write an allocation profile of the whole run (harness and agent) to this file at the end")
	fs.IntVar(&cfg.nodes, "nodes", 0, "multi-node run: this many in-process agents (fake datapath, kvstore mode) sharing one embedded etcd; --endpoints is then per node (default 100), --workers too (default 4), --churn-rate paces the replacements once the nodes are full (over all nodes), --crashes crashes agents")
	fs.IntVar(&cfg.etcdRestarts, "etcd-restarts", 0, "multi-node run: etcd stops and restarts on its data directory during the churn")
	fs.StringVar(&cfg.etcdBin, "etcd-bin", "", "multi-node run: run etcd as a child process from this binary (etcd-embed from scripts/kube-bin.sh, or etcd); --etcd-restarts then SIGKILL it (default: embedded, stopped gracefully)")
	fs.DurationVar(&cfg.leaseTTL, "lease-ttl", 0, "multi-node run: the nodes' kvstore lease TTL (default 2s; an agent's default is 15s): a node that cannot renew it within the TTL loses its keys on the other nodes until it writes them again")
	var sweep string
	fs.StringVar(&sweep, "sweep-nodes", "", `node-count sweep: one multi-node run per count, e.g. "10 30 50 100", with --sweep-endpoints over the cluster and --churn-rate over the cluster; one table (convergence, CPU per remote update, heap per remote endpoint, etcd CPU) and the slopes fitted across the runs`)
	fs.IntVar(&cfg.sweepEndpoints, "sweep-endpoints", 2000, "node-count sweep: live endpoints over the whole cluster (per node: this divided by the node count)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	for _, f := range strings.Fields(sweep) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 2 || n > 200 {
			return cfg, fmt.Errorf("--sweep-nodes: %q: want node counts 2..200", f)
		}
		cfg.sweepNodes = append(cfg.sweepNodes, n)
	}
	fs.Visit(func(f *flag.Flag) {
		cfg.perNodeSet = cfg.perNodeSet || f.Name == "endpoints"
		cfg.workersSet = cfg.workersSet || f.Name == "workers"
	})
	if len(cfg.sweepNodes) > 0 && (cfg.nodes > 0 || cfg.perNodeSet || cfg.sweepEndpoints < 1) {
		return cfg, errors.New("--sweep-nodes: the counts replace --nodes, and --sweep-endpoints (at least 1) --endpoints")
	}
	if cfg.nodes == 0 && len(cfg.sweepNodes) == 0 && (cfg.etcdRestarts != 0 || cfg.etcdBin != "" || cfg.leaseTTL != 0) {
		return cfg, errors.New("--etcd-restarts, --etcd-bin and --lease-ttl need --nodes or --sweep-nodes")
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	d.Duration, d.CrashDowntime = sim.Duration(duration), sim.Duration(downtime)
	sc, err := scenarioFrom(fs, scenarioFile, d, faultRate)
	if err != nil {
		return cfg, err
	}
	if err := cfg.logLevel.UnmarshalText([]byte(level)); err != nil {
		return cfg, fmt.Errorf("--log-level: %q: want debug, info, warn or error", level)
	}
	if cfg.progress != "auto" && cfg.progress != "always" && cfg.progress != "never" {
		return cfg, fmt.Errorf("--progress: %q: want auto, always or never", cfg.progress)
	}
	cfg.sc = sc
	return cfg, sc.Validate()
}

// scenarioFrom starts from the defaults or the scenario file and applies
// the flags that were given (flagged holds their values).
func scenarioFrom(fs *flag.FlagSet, file string, flagged sim.Scenario, faultRate float64) (sim.Scenario, error) {
	sc := sim.Defaults()
	if file != "" {
		var err error
		if sc, err = sim.LoadScenario(file); err != nil {
			return sc, err
		}
	}
	var bad error
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "endpoints":
			sc.Endpoints = flagged.Endpoints
		case "duration":
			sc.Duration = flagged.Duration
		case "seed":
			sc.Seed = flagged.Seed
		case "crashes":
			sc.Crashes = flagged.Crashes
		case "crash-downtime":
			sc.CrashDowntime = flagged.CrashDowntime
		case "fault-rate":
			if faultRate < 0 || faultRate > 1 {
				bad = fmt.Errorf("--fault-rate: %g outside 0..1", faultRate)
			}
			sc.SetFaultRate(faultRate)
		case "datapath":
			sc.Datapath = flagged.Datapath
		case "workers":
			sc.Workers = flagged.Workers
		case "arrival-rate":
			sc.ArrivalRate = flagged.ArrivalRate
		case "churn-rate":
			sc.ChurnRate = flagged.ChurnRate
		case "regenerations":
			sc.Regenerations = flagged.Regenerations
		case "label-churn":
			sc.LabelChurn = flagged.LabelChurn
		case "policy-churn":
			sc.PolicyChurn = flagged.PolicyChurn
		case "force":
			sc.ForceLinux = flagged.ForceLinux
		}
	})
	return sc, bad
}

func options(cfg config, stderr io.Writer) (sim.Options, func(), error) {
	opts := sim.Options{Dir: cfg.dir, Log: slog.New(slog.DiscardHandler), CNIBinDir: cfg.cniBin}
	closeLog := func() {}
	if cfg.agentLog != "" {
		f, err := os.Create(cfg.agentLog)
		if err != nil {
			return opts, closeLog, fmt.Errorf("--agent-log: %w", err)
		}
		opts.AgentLog = slog.NewTextHandler(f, &slog.HandlerOptions{Level: cfg.logLevel})
		opts.Log = slog.New(opts.AgentLog).With("component", "membrane-sim")
		closeLog = func() { _ = f.Close() }
	}
	tty := isTerminal(stderr)
	if cfg.progress == "always" || (cfg.progress == "auto" && tty) {
		opts.Progress, opts.ProgressTTY = stderr, tty
	}
	return opts, closeLog, nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// writeAllocProfile writes the allocations made so far (go tool pprof
// -sample_index=alloc_space shows where the garbage collector's work comes from).
func writeAllocProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--memprofile: %w", err)
	}
	err = pprof.Lookup("allocs").WriteTo(f, 0)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("--memprofile: %w", err)
	}
	return nil
}

// startCPUProfile profiles the process (agent and harness) until stop.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}
