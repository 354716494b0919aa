package api_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/testutil"
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
	_, c := startBenchAgent(b)
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
	report(b, "put", slices.Concat(puts...))
	report(b, "delete", slices.Concat(dels...))
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "cycles/s")
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
