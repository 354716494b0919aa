package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// remoteWriterEnv makes the test binary the "other node" of
// BenchmarkRemoteUpdateCost: a process of its own, so that what it costs
// to write to etcd is not counted as the agent's CPU.
const remoteWriterEnv = "MEMBRANE_SIM_REMOTE_WRITER"

func TestMain(m *testing.M) {
	if spec := os.Getenv(remoteWriterEnv); spec != "" {
		os.Exit(remoteWriterMain(spec))
	}
	os.Exit(m.Run())
}

// writerSpec is what the writer process does: lifecycles times, delete
// the endpoint key DeleteFrom+i and put the key NewFrom+i (node heap-b's
// records, as its publisher writes them, one change per request), Rate
// changes per second (0: as fast as etcd answers), then put the key
// NewFrom+Lifecycles (the sentinel: once the agent has it, it has
// applied every change before it).
type writerSpec struct {
	Endpoint   string  `json:"endpoint"`
	DeleteFrom int     `json:"delete-from"`
	NewFrom    int     `json:"new-from"`
	Lifecycles int     `json:"lifecycles"`
	Rate       float64 `json:"rate"`
}

func remoteWriterMain(spec string) int {
	var s writerSpec
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		fmt.Fprintln(os.Stderr, "writer:", err)
		return 2
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "writer:", err)
		return 1
	}
	defer cli.Close()
	var pace time.Duration
	if s.Rate > 0 {
		pace = time.Duration(float64(time.Second) / s.Rate)
	}
	next := time.Now()
	do := func(op clientv3.Op) error {
		if pace > 0 {
			next = next.Add(pace)
			time.Sleep(time.Until(next))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := cli.Do(ctx, op)
		return err
	}
	for i := range s.Lifecycles {
		if err := do(clientv3.OpDelete(remoteKey(s.DeleteFrom + i))); err != nil {
			fmt.Fprintln(os.Stderr, "writer:", err)
			return 1
		}
		if err := do(clientv3.OpPut(remoteKey(s.NewFrom+i), remoteRecord(s.NewFrom+i))); err != nil {
			fmt.Fprintln(os.Stderr, "writer:", err)
			return 1
		}
	}
	if err := do(clientv3.OpPut(remoteKey(s.NewFrom+s.Lifecycles), remoteRecord(s.NewFrom+s.Lifecycles))); err != nil {
		fmt.Fprintln(os.Stderr, "writer:", err)
		return 1
	}
	return 0
}

// remoteKey and remoteRecord are heap-b's endpoint i (address
// remoteIP(i)), in pkg/agent/kvstore's record format.
func remoteKey(i int) string { return fmt.Sprintf("%sstate/endpoints/v1/heap-b/%d", simPrefix, i+1) }

func remoteRecord(i int) string {
	return fmt.Sprintf(`{"ips":[%q],"identity":%d,"node":"heap-b","nodeIP":"192.168.221.2"}`, remoteIP(i), 256+i%500)
}

// remoteIP is the i-th address of 10.64.0.0/10 (heap-b's pod CIDR).
func remoteIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(64 + i>>16), byte(i >> 8), byte(i)})
}

// arrivals tells when an address arrived in the agent's ipcache (its
// kvstore mirror's call to the front door returned:
// agent.Config.KvstoreObserver).
type arrivals struct {
	mu   sync.Mutex
	want netip.Addr
	got  chan struct{}
}

func (a *arrivals) observe(eps []endpoint.Remote) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.got == nil {
		return
	}
	for _, r := range eps {
		for _, ip := range r.IPs {
			if ip == a.want {
				close(a.got)
				a.got = nil
				return
			}
		}
	}
}

// expect arms the wait for ip; the channel is closed once it arrived.
func (a *arrivals) expect(ip netip.Addr) <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.want, a.got = ip, make(chan struct{})
	return a.got
}

// remoteCostPoint is one endpoint count's measurement.
type remoteCostPoint struct {
	n                int     // remote endpoints held
	heap             float64 // live heap after GC, bytes
	cpuPerChangeUS   float64 // agent CPU per remote change applied, µs
	changesPerSecond float64 // achieved
}

// BenchmarkRemoteUpdateCost: what another node's endpoint changes cost
// one agent in kvstore mode (fake datapath; its map write is
// datapath's BenchmarkIPCacheWrite). For each count N in
// MEMBRANE_REMOTE_NS (default "1000 4000 16000"), etcd (etcd-embed, its
// own process) holds N endpoints of node heap-b; the agent's live heap is
// read after GC; then a writer process (this binary again, so its CPU is
// not the agent's) replaces MEMBRANE_REMOTE_LIFECYCLES of them (default
// 1,000: a delete and a create each, one change per etcd request) at
// MEMBRANE_REMOTE_RATE changes per second (default 200, what one node
// sees of 100 lifecycles/s over a cluster; 0: unpaced), and the agent's
// CPU (getrusage, less its idle rate measured before) over the changes
// it applied is the CPU per change: the watch's decode, the mirror, the
// front door, the ipcache actor, the index writer. Reported: the
// slopes over N of the heap (bytes per remote endpoint) and of the CPU
// per change (flat if a change costs the same at any size), and each
// point in the log. MEMBRANE_REMOTE_CPUPROFILE=file profiles the
// changes at the largest count. Run with -benchtime 1x.
//
//	go test -run '^$' -bench RemoteUpdateCost -benchtime 1x ./sim/
func BenchmarkRemoteUpdateCost(b *testing.B) {
	ns := envInts(b, "MEMBRANE_REMOTE_NS", []int{1000, 4000, 16000})
	lifecycles := envInts(b, "MEMBRANE_REMOTE_LIFECYCLES", []int{1000})[0]
	rate := 200.0
	if s := os.Getenv("MEMBRANE_REMOTE_RATE"); s != "" {
		var err error
		if rate, err = strconv.ParseFloat(s, 64); err != nil || rate < 0 {
			b.Fatalf("MEMBRANE_REMOTE_RATE=%q: want changes per second, 0 for unpaced", s)
		}
	}
	bin := etcdBinary(b)
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	for range b.N {
		dir := b.TempDir()
		etcd, err := startSimEtcd(dir, bin)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(etcd.stop)
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.endpoint()}, DialTimeout: 5 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cli.Close() })
		arr := &arrivals{}
		a, err := agent.Start(agent.Config{Socket: filepath.Join(dir, "run", "a.sock"), StateDir: filepath.Join(dir, "state"),
			IPv4Range: podRange(0), Datapath: "fake", GCInterval: -1, GCPercent: agent.DefaultGCPercent, Fake: datapath.NewFake(1),
			Kvstore:         &kvstore.Config{Endpoints: []string{etcd.endpoint()}, NodeName: "heap-a", Prefix: simPrefix},
			NodeAddrs:       []netip.Addr{netip.AddrFrom4([4]byte{192, 168, 221, 1})},
			KvstoreObserver: arr.observe}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = a.Stop(context.Background()) })
		putNode(b, cli)
		var prof *os.File
		if p := os.Getenv("MEMBRANE_REMOTE_CPUPROFILE"); p != "" {
			if prof, err = os.Create(p); err != nil {
				b.Fatal(err)
			}
			defer prof.Close()
		}
		b.Logf("loadavg at start: %s", loadavg())
		var pts []remoteCostPoint
		lo, hi := 0, 0 // heap-b's live endpoints are lo..hi-1
		for _, n := range ns {
			if n <= hi-lo {
				b.Fatalf("MEMBRANE_REMOTE_NS: want increasing counts, got %v", ns)
			}
			got := arr.expect(remoteIP(lo + n - 1))
			putRange(b, cli, hi, lo+n)
			hi = lo + n
			waitArrival(b, got)
			pt := remoteCostPoint{n: n, heap: float64(liveHeap())}
			idle := idleCPURate(2 * time.Second)
			spec, _ := json.Marshal(writerSpec{Endpoint: etcd.endpoint(), DeleteFrom: lo, NewFrom: hi, Lifecycles: lifecycles, Rate: rate})
			cmd := exec.Command(exe, "-test.run=^$")
			cmd.Env = append(os.Environ(), remoteWriterEnv+"="+string(spec))
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			got = arr.expect(remoteIP(hi + lifecycles))
			profiling := prof != nil && n == ns[len(ns)-1] // the largest count
			if profiling {
				if err := pprof.StartCPUProfile(prof); err != nil {
					b.Fatal(err)
				}
			}
			start, cpu0 := time.Now(), processCPU()
			if err := cmd.Run(); err != nil {
				b.Fatalf("writer: %v", err)
			}
			waitArrival(b, got)
			el, cpu := time.Since(start), processCPU()-cpu0
			if profiling {
				pprof.StopCPUProfile()
			}
			changes := 2*lifecycles + 1
			agentCPU := cpu - time.Duration(idle*float64(el))
			pt.cpuPerChangeUS = float64(agentCPU.Microseconds()) / float64(changes)
			pt.changesPerSecond = float64(changes) / el.Seconds()
			lo, hi = lo+lifecycles, hi+lifecycles+1
			// The sentinel stays: heap-b holds lo..hi-1, n+1 endpoints;
			// drop the extra one so the next count starts from n.
			if _, err := cli.Delete(context.Background(), remoteKey(lo)); err != nil {
				b.Fatal(err)
			}
			lo++
			pts = append(pts, pt)
			b.Logf("N %d: heap %.1f MiB; %d changes in %v (%.0f/s): process CPU %v, idle %.1f ms/s, agent %.1f µs per change; loadavg %s",
				n, pt.heap/(1<<20), changes, el.Round(time.Millisecond), pt.changesPerSecond, cpu.Round(time.Millisecond), idle*1000,
				pt.cpuPerChangeUS, loadavg())
		}
		xs, heaps, cpus := make([]float64, len(pts)), make([]float64, len(pts)), make([]float64, len(pts))
		for i, p := range pts {
			xs[i], heaps[i], cpus[i] = float64(p.n), p.heap, p.cpuPerChangeUS
		}
		hf, cf := fitXY(xs, heaps), fitXY(xs, cpus)
		b.ReportMetric(hf.Slope, "heap-B/remote-endpoint")
		b.ReportMetric(mean(cpus), "cpu-µs/remote-change")
		b.ReportMetric(cf.Slope*1000, "cpu-µs/change-per-1000-endpoints")
		b.Logf("heap: %.0f B per remote endpoint (±%.0f), %.1f MiB at 0; CPU per change: %.1f µs mean, slope %+.3f µs per 1,000 endpoints held (±%.3f); rate %g changes/s; loadavg at end %s",
			hf.Slope, hf.Stderr, hf.Intercept/(1<<20), mean(cpus), cf.Slope*1000, cf.Stderr*1000, rate, loadavg())
	}
}

// putNode writes heap-b's node record: its pod CIDR holds the records'
// addresses (heap-a believes no claim outside it).
func putNode(b *testing.B, cli *clientv3.Client) {
	b.Helper()
	if _, err := cli.Put(context.Background(), simPrefix+"state/nodes/v1/heap-b",
		`{"name":"heap-b","addrs":["192.168.221.2"],"podCIDRs":["10.64.0.0/10"]}`); err != nil {
		b.Fatal(err)
	}
}

// putRange writes heap-b's endpoints from..to-1, 100 per transaction.
func putRange(b *testing.B, cli *clientv3.Client, from, to int) {
	b.Helper()
	var ops []clientv3.Op
	flush := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			b.Fatal(err)
		}
		ops = ops[:0]
	}
	for i := from; i < to; i++ {
		ops = append(ops, clientv3.OpPut(remoteKey(i), remoteRecord(i)))
		if len(ops) == 100 {
			flush()
		}
	}
	if len(ops) > 0 {
		flush()
	}
}

func waitArrival(b *testing.B, got <-chan struct{}) {
	b.Helper()
	select {
	case <-got:
	case <-time.After(5 * time.Minute):
		b.Fatal("remote endpoints not in the ipcache after 5 minutes")
	}
}

// idleCPURate is the process's CPU seconds per second over d, doing
// nothing (the agent's timers, leases, the runtime).
func idleCPURate(d time.Duration) float64 {
	start, cpu0 := time.Now(), processCPU()
	time.Sleep(d)
	return (processCPU() - cpu0).Seconds() / time.Since(start).Seconds()
}

// envInts reads a space-separated list of positive integers from env
// (def when unset).
func envInts(b testing.TB, env string, def []int) []int {
	s := os.Getenv(env)
	if s == "" {
		return def
	}
	var out []int
	for _, f := range strings.Fields(s) {
		v, err := strconv.Atoi(f)
		if err != nil || v < 1 {
			b.Fatalf("%s=%q: want positive integers", env, s)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		b.Fatalf("%s=%q: want positive integers", env, s)
	}
	return out
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	var s float64
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}
