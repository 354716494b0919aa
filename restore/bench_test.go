package restore

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// benchEndpoint is a typical endpoint record (pod names, labels, IPv4).
func benchEndpoint(tb testing.TB, id endpoint.ID) *endpoint.Endpoint {
	tb.Helper()
	ls, err := labels.ParseSet([]string{"k8s:app=bench", fmt.Sprintf("k8s:shard=%d", id%16)})
	if err != nil {
		tb.Fatal(err)
	}
	return &endpoint.Endpoint{
		ID: id, ContainerID: fmt.Sprintf("bench-container-%d", id), Namespace: "bench",
		PodName: fmt.Sprintf("pod-%d", id), Labels: ls, IPv4: netip.AddrFrom4([4]byte{10, 210, byte(id >> 8), byte(id)}),
		IfName: fmt.Sprintf("lxc%d", id), IfIndex: int(id) + 10, Identity: 256 + 5, DesiredRevision: 1,
		Created: time.Now(),
	}
}

// BenchmarkStoreLifecycle: `clients` goroutines each write an endpoint's
// state twice (create, regenerate) and remove it, as one endpoint
// lifecycle does, each step waiting until it is durable. Reports durable
// operations per second, their p50/p99 and the mean group size.
func BenchmarkStoreLifecycle(b *testing.B) {
	for _, clients := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			s, err := Open(b.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			eps := make([]*endpoint.Endpoint, clients)
			for i := range eps {
				eps[i] = benchEndpoint(b, endpoint.ID(i+1))
			}
			lat := make([][]time.Duration, clients)
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			cpu0 := cpuTime()
			start := time.Now()
			for w := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					done := make(chan error, 1)
					cb := func(err error) { done <- err }
					for next.Add(1) <= int64(b.N) {
						for step := range 3 {
							t := time.Now()
							if step < 2 {
								s.Write(eps[w], cb)
							} else {
								s.Remove(eps[w].ID, cb)
							}
							if err := <-done; err != nil {
								b.Error(err)
								return
							}
							lat[w] = append(lat[w], time.Since(t))
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			cpu := cpuTime() - cpu0
			b.StopTimer()
			all := slices.Concat(lat...)
			slices.Sort(all)
			if len(all) == 0 {
				return
			}
			q := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))].Microseconds()) / 1000 }
			st := s.Stats()
			b.ReportMetric(float64(len(all))/elapsed.Seconds(), "ops/s")
			b.ReportMetric(q(0.5), "p50-ms")
			b.ReportMetric(q(0.99), "p99-ms")
			b.ReportMetric(float64(st.Requests)/float64(max(st.Groups, 1)), "reqs/group")
			b.ReportMetric(float64(st.Syncing.Microseconds())/1000/float64(max(st.Syncs, 1)), "fdatasync-ms")
			b.ReportMetric(float64(st.Applied)/float64(max(st.Checkpoints, 1)), "recs/checkpoint")
			b.ReportMetric(float64(cpu.Microseconds())/float64(len(all)), "cpu-µs/op")
		})
	}
}

// BenchmarkStoreRequest measures what one durable request costs the
// process: 64 clients run lifecycles (write, write, remove) as in
// BenchmarkStoreLifecycle, on tmpfs (the syscalls without a disk, as the
// simulator's state dir under /dev/shm) and on the default temp dir.
// One op is one lifecycle; cpu-µs/req and allocs/req are per request.
func BenchmarkStoreRequest(b *testing.B) {
	for _, fs := range []struct{ name, parent string }{{"tmpfs", "/dev/shm"}, {"tempdir", ""}} {
		b.Run("fs="+fs.name, func(b *testing.B) {
			dir := b.TempDir()
			if fs.parent != "" {
				d, err := os.MkdirTemp(fs.parent, "restore-bench-")
				if err != nil {
					b.Skipf("no %s: %v", fs.parent, err)
				}
				b.Cleanup(func() { os.RemoveAll(d) })
				dir = d
			}
			s, err := Open(dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			const clients = 64
			eps := make([]*endpoint.Endpoint, clients)
			for i := range eps {
				eps[i] = benchEndpoint(b, endpoint.ID(i+1))
			}
			var next atomic.Int64
			var wg sync.WaitGroup
			var m0, m1 runtime.MemStats
			b.ReportAllocs()
			b.ResetTimer()
			runtime.ReadMemStats(&m0)
			cpu0 := cpuTime()
			for w := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					done := make(chan error, 1)
					cb := func(err error) { done <- err }
					for next.Add(1) <= int64(b.N) {
						for step := range 3 {
							if step < 2 {
								s.Write(eps[w], cb)
							} else {
								s.Remove(eps[w].ID, cb)
							}
							if err := <-done; err != nil {
								b.Error(err)
								return
							}
						}
					}
				}()
			}
			wg.Wait()
			cpu := cpuTime() - cpu0
			runtime.ReadMemStats(&m1)
			b.StopTimer()
			reqs := float64(3 * b.N)
			b.ReportMetric(float64(cpu.Nanoseconds())/1000/reqs, "cpu-µs/req")
			b.ReportMetric(float64(m1.Mallocs-m0.Mallocs)/reqs, "allocs/req")
			b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/reqs, "B/req")
			st := s.Stats()
			b.ReportMetric(float64(st.Requests)/float64(max(st.Groups, 1)), "reqs/group")
		})
	}
}

// BenchmarkEncode is the CPU Write spends before queueing: ep.json and
// ep_config.h of a typical endpoint.
func BenchmarkEncode(b *testing.B) {
	ep := benchEndpoint(b, 42)
	s := &Store{}
	b.ReportAllocs()
	for b.Loop() {
		r, err := s.encode(ep)
		if err != nil || len(r.data) == 0 || len(r.header) == 0 {
			b.Fatal("empty encoding")
		}
		r.release()
	}
}

// cpuTime is the process's user + system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
