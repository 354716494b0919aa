package api_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/restore"
)

// startBenchAgent starts an in-process agent with the fake datapath on a
// socket in a temp dir; the ranges are large enough for 10,000 endpoints.
// With MEMBRANE_BENCH_EXT4 set the state is on ext4 for certain (a
// loop-mounted image when the temp dir is elsewhere: testutil.Ext4Dir).
func startBenchAgent(tb testing.TB) (*agent.Agent, *client.Client) {
	tb.Helper()
	dir := tb.TempDir()
	if os.Getenv("MEMBRANE_BENCH_EXT4") != "" {
		dir = testutil.Ext4Dir(tb)
	}
	cfg := agent.Config{
		Socket:    filepath.Join(dir, "membrane.sock"),
		StateDir:  filepath.Join(dir, "state"),
		IPv4Range: netip.MustParsePrefix("10.210.0.0/16"),
		Datapath:  "fake",
		Fake:      datapath.NewFake(1),
	}
	a, err := agent.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		tb.Fatal(err)
	}
	c := client.New(cfg.Socket)
	tb.Cleanup(func() {
		c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = a.Stop(ctx)
	})
	return a, c
}

// lifecycle is one PUT(sync)+DELETE of an endpoint named by container ID.
func lifecycle(ctx context.Context, c *client.Client, n int64) (put, del time.Duration, err error) {
	cid := fmt.Sprintf("bench-%d", n)
	t0 := time.Now()
	_, err = c.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{
		ContainerID: cid, K8sNamespace: "bench", K8sPodName: cid,
		Labels: []string{"k8s:app=bench", fmt.Sprintf("k8s:shard=%d", n%16)}, SyncBuild: true,
	})
	if err != nil {
		return 0, 0, err
	}
	t1 := time.Now()
	if err = c.EndpointDelete(ctx, "container-id:"+cid); err != nil {
		return 0, 0, err
	}
	return t1.Sub(t0), time.Since(t1), nil
}

// runLifecycles runs b.N lifecycles from `clients` closed-loop clients and
// reports p50/p99 of the sync PUT and the DELETE and cycles per second.
func runLifecycles(b *testing.B, clients int) {
	a, c := startBenchAgent(b)
	before := takePhases(b, a)
	ctx := context.Background()
	var next atomic.Int64
	puts := make([][]time.Duration, clients)
	dels := make([][]time.Duration, clients)
	var wg sync.WaitGroup
	var failed atomic.Value
	b.ResetTimer()
	cpu0 := cpuTime()
	start := time.Now()
	for w := 0; w < clients; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for {
				n := next.Add(1)
				if n > int64(b.N) {
					return
				}
				p, d, err := lifecycle(ctx, c, n)
				if err != nil {
					failed.Store(err)
					return
				}
				puts[w], dels[w] = append(puts[w], p), append(dels[w], d)
			}
		}(w)
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	b.StopTimer()
	if err, ok := failed.Load().(error); ok {
		b.Fatal(err)
	}
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/cycle")
	allPuts := slices.Concat(puts...)
	report(b, "put", allPuts)
	report(b, "delete", slices.Concat(dels...))
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "cycles/s")
	reportPhases(b, before, takePhases(b, a), allPuts)
}

func report(b *testing.B, name string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	q := func(p float64) float64 { return float64(ds[int(p*float64(len(ds)-1))].Microseconds()) / 1000 }
	b.ReportMetric(q(0.50), name+"-p50-ms")
	b.ReportMetric(q(0.99), name+"-p99-ms")
}

// BenchmarkLifecycle: PUT(sync)+DELETE through the real unix-socket API
// with the fake datapath; 1 client (service time), 8 clients (the sync
// PUT p99 target) and 64 clients (throughput under queueing).
func BenchmarkLifecycle(b *testing.B) {
	for _, clients := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) { runLifecycles(b, clients) })
	}
}

// BenchmarkHeapPerEndpoint creates 10,000 live endpoints (sync PUT, 64
// clients) and reports the live heap they add, per endpoint, after GC:
// actors, mailboxes, index rows (endpoints, ipam, identity leases),
// IPAM and identity bookkeeping.
func BenchmarkHeapPerEndpoint(b *testing.B) {
	const live = 10000
	for i := 0; i < b.N; i++ {
		a, c := startBenchAgent(b)
		before := heapInUse()
		ctx := context.Background()
		var next atomic.Int64
		var wg sync.WaitGroup
		var failed atomic.Value
		for w := 0; w < 64; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := next.Add(1); n <= live; n = next.Add(1) {
					ipr, err := c.IPAMAllocate(ctx, "ipv4", fmt.Sprintf("heap/p-%d", n))
					if err == nil {
						_, err = c.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{
							ContainerID: fmt.Sprintf("heap-%d", n), K8sNamespace: "heap", K8sPodName: fmt.Sprintf("p-%d", n),
							Labels:     []string{"k8s:app=heap", fmt.Sprintf("k8s:shard=%d", n%64)},
							Addressing: &models.AddressPair{IPv4: ipr.Address.IPv4}, SyncBuild: true,
						})
					}
					if err != nil {
						failed.Store(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if err, ok := failed.Load().(error); ok {
			b.Fatal(err)
		}
		c.Close()
		after := heapInUse()
		writeHeapProfile(b, os.Getenv("MEMBRANE_HEAP_PROFILE"))
		if total, _ := a.Index.CountEndpoints(); total != live {
			b.Fatalf("index holds %d endpoints, want %d", total, live)
		}
		b.ReportMetric(float64(after-before)/live, "heap-B/endpoint")
		runtime.KeepAlive(a)
	}
}

// writeHeapProfile writes the live heap to path (if set), at the point
// the benchmark measures; read it with go tool pprof -sample_index=inuse_space
// (run with -test.memprofilerate 512 for a finer sample).
func writeHeapProfile(b *testing.B, path string) {
	if path == "" {
		return
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatalf("heap profile: %v", err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		b.Fatalf("heap profile: %v", err)
	}
}

func heapInUse() uint64 {
	var ms runtime.MemStats
	for i := 0; i < 3; i++ {
		runtime.GC()
	}
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// cpuTime is the process's user + system CPU time so far (client and
// agent: they share the process).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// phases is a snapshot of the agent's own timers: the regeneration phase
// and API latency histograms (sums and counts), the state store's
// counters and the index writer's.
type phases struct {
	sum, count map[string]float64 // by phase; "api-put" is the server's PUT
	buckets    map[string][]bucket
	state      restore.Stats
	indexTxns  uint64
	indexTime  time.Duration
}

func takePhases(b *testing.B, a *agent.Agent) phases {
	p := phases{sum: map[string]float64{}, count: map[string]float64{}, buckets: map[string][]bucket{}, state: a.StateStats()}
	ctr := a.System.Counters()
	p.indexTxns, p.indexTime = ctr.IndexTransactions, ctr.IndexCommitTime
	mfs, err := a.Metrics().Gatherer().Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			if h == nil {
				continue
			}
			lbl := map[string]string{}
			for _, l := range m.GetLabel() {
				lbl[l.GetName()] = l.GetValue()
			}
			key := ""
			switch {
			case mf.GetName() == "membrane_endpoint_regeneration_duration_seconds":
				key = lbl["phase"]
			case mf.GetName() == "membrane_api_request_duration_seconds" && lbl["method"] == "PUT" &&
				strings.HasPrefix(lbl["route"], "PUT /v1/endpoint/"):
				key = "api-put"
			}
			if key != "" {
				p.sum[key] += h.GetSampleSum()
				p.count[key] += float64(h.GetSampleCount())
				bs := p.buckets[key]
				for i, hb := range h.GetBucket() {
					if i == len(bs) {
						bs = append(bs, bucket{le: hb.GetUpperBound()})
					}
					bs[i].n += float64(hb.GetCumulativeCount())
				}
				p.buckets[key] = bs
			}
		}
	}
	return p
}

// bucket is a histogram bucket: cumulative count n of samples <= le.
type bucket struct{ le, n float64 }

// p99 is the bucket bound (ms) holding the 99th percentile of what key's
// histogram counted between two snapshots.
func p99(p0, p1 phases, key string) float64 {
	b0, b1 := p0.buckets[key], p1.buckets[key]
	if len(b1) == 0 {
		return 0
	}
	total := p1.count[key] - p0.count[key]
	for i, b := range b1 {
		n := b.n
		if i < len(b0) {
			n -= b0[i].n
		}
		if n >= 0.99*total {
			return b.le * 1000
		}
	}
	return math.Inf(1)
}

// reportPhases prints where a sync PUT spent its time, from the agent's
// timers over the run (means, ms), and reports the durable write's group
// size and fdatasync time as metrics.
func reportPhases(b *testing.B, p0, p1 phases, puts []time.Duration) {
	mean := func(k string) float64 {
		n := p1.count[k] - p0.count[k]
		if n == 0 {
			return 0
		}
		return (p1.sum[k] - p0.sum[k]) / n * 1000
	}
	var client float64
	for _, d := range puts {
		client += float64(d.Microseconds()) / 1000
	}
	client /= float64(max(len(puts), 1))
	s0, s1 := p0.state, p1.state
	per := func(d1, d0 time.Duration, n1, n0 uint64) float64 {
		if n1 == n0 {
			return 0
		}
		return float64((d1 - d0).Microseconds()) / 1000 / float64(n1-n0)
	}
	groups, reqs := s1.Groups-s0.Groups, s1.Requests-s0.Requests
	group := float64(reqs) / float64(max(groups, 1))
	queue := per(s1.Waiting, s0.Waiting, s1.Requests, s0.Requests)
	appendMs := per(s1.Appending, s0.Appending, s1.Groups, s0.Groups)
	syncMs := per(s1.Syncing, s0.Syncing, s1.Syncs, s0.Syncs)
	answer := per(s1.Answering, s0.Answering, s1.Groups, s0.Groups)
	api, accept, policy := mean("api-put"), mean(actors.PhaseAccept), mean(actors.PhaseComputePolicy)
	write, realize, total := mean(actors.PhaseWriteState), mean(actors.PhaseRealize), mean(actors.PhaseTotal)
	inStore := per(s1.Latency, s0.Latency, s1.Requests, s0.Requests)
	syncH, overH := s1.SyncHist.Sub(s0.SyncHist), s1.SyncHistOverlap.Sub(s0.SyncHistOverlap)
	count := func(h restore.Hist) (n uint64) {
		for _, c := range h {
			n += c
		}
		return n
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	idx := per(p1.indexTime, p0.indexTime, p1.indexTxns, p0.indexTxns)
	if len(puts) < 10 {
		return // the benchmark's probing run
	}
	// Printed, not logged: the testing package cuts a benchmark's log to
	// ten lines.
	fmt.Printf("%s: sync PUT phases (means, ms; %d PUTs):\n"+
		"  client, whole PUT                              %7.3f\n"+
		"  - HTTP client, transport (client - server)     %7.3f\n"+
		"  - server: PUT handler (p99 <= %.0f)              %7.3f\n"+
		"    - accept: manager, spawn, identity           %7.3f\n"+
		"    - regeneration (p99 <= %.1f)                  %7.3f\n"+
		"      - compute policy (policy actor hop)        %7.3f\n"+
		"      - durable write (write-state - policy; write-state p99 <= %.1f)  %7.3f\n"+
		"        - in the store, submit to answer (per request; p99 %.2f)  %7.3f\n"+
		"        - journal queue (per request)            %7.3f\n"+
		"        - record append (per group)              %7.3f\n"+
		"        - fdatasync (per sync; %.1f requests/group)  %7.3f\n"+
		"        - answer callbacks (per group)           %7.3f\n"+
		"        - hop back to the endpoint actor (rest)  %7.3f\n"+
		"        (fdatasync p50 %.2f, p99 %.2f, max bucket %.2f ms; %d of %d during a checkpoint's syncfs: p50 %.2f, p99 %.2f)\n"+
		"      - realize (fake datapath)                  %7.3f\n"+
		"    - answer: index commit, reply, HTTP (rest)   %7.3f\n"+
		"      (index writer: %.3f ms per commit)\n"+
		"  checkpoints: %d, %.0f records each, %.2f ms each (syncfs mean %.2f, p99 %.2f ms); stalls %d (%.1f ms)\n",
		b.Name(), len(puts), client, client-api, p99(p0, p1, "api-put"), api, accept, p99(p0, p1, actors.PhaseTotal), total, policy,
		p99(p0, p1, actors.PhaseWriteState), write-policy,
		ms(s1.LatencyHist.Sub(s0.LatencyHist).Quantile(0.99)), inStore,
		queue, appendMs, group, syncMs, answer, write-policy-inStore,
		ms(syncH.Quantile(0.5)), ms(syncH.Quantile(0.99)), ms(syncH.Quantile(1)), count(overH), count(syncH),
		ms(overH.Quantile(0.5)), ms(overH.Quantile(0.99)),
		realize, api-accept-total, idx,
		s1.Checkpoints-s0.Checkpoints, float64(s1.Applied-s0.Applied)/float64(max(s1.Checkpoints-s0.Checkpoints, 1)),
		per(s1.Checkpointing, s0.Checkpointing, s1.Checkpoints, s0.Checkpoints),
		per(s1.Flushing, s0.Flushing, s1.Flushes, s0.Flushes), ms(s1.FlushHist.Sub(s0.FlushHist).Quantile(0.99)), s1.Stalls-s0.Stalls,
		float64((s1.Stalled-s0.Stalled).Microseconds())/1000)
	b.ReportMetric(group, "journal-reqs/group")
	b.ReportMetric(syncMs, "fdatasync-ms")
}
