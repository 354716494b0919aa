package actors_test

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
)

// BenchmarkFrontDoorLifecycle runs the simulator's endpoint lifecycle
// through the front door, without HTTP: allocate an address, create the
// endpoint (sync build), regenerate it, delete it (fake datapath, no
// state store). allocs/op is the actor side's allocations per lifecycle;
// cpu-ns/op the process's CPU per lifecycle. "clients=64" runs 64 at once.
func BenchmarkFrontDoorLifecycle(b *testing.B) {
	for _, clients := range []int{1, 64} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			h := startSystem(b, func(c *actors.Config) { c.IPAM.IPv4 = benchIPv4 })
			labels := mustLabels(b, "k8s:app=bench", "k8s:tier=front")
			var n atomic.Int64
			lifecycle := func() error {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				cid := fmt.Sprintf("life-%d", n.Add(1))
				a, err := h.sys.AllocateIP(ctx, ipam.IPv4, "bench/"+cid)
				if err != nil {
					return err
				}
				ep, err := h.sys.CreateEndpoint(ctx, &endpoint.Endpoint{ContainerID: cid, ContainerInterfaceName: "eth0",
					Namespace: "bench", PodName: cid, Labels: labels, IPv4: a.IPv4}, true)
				if err != nil {
					return err
				}
				if _, err := h.sys.Regenerate(ctx, ep.ID, "bench"); err != nil {
					return err
				}
				_, err = h.sys.DeleteEndpoint(ctx, ep.ID, endpoint.DeleteOptions{})
				return err
			}
			b.ReportAllocs()
			cpu0 := processCPU()
			if clients == 1 {
				for b.Loop() {
					if err := lifecycle(); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				b.SetParallelism((clients + 1) / 2) // GOMAXPROCS 2 on the benchmark machine
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := lifecycle(); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

// benchIPv4 holds more addresses than 64 clients keep at once.
var benchIPv4 = netip.MustParsePrefix("10.201.0.0/16")

// processCPU is the process's user + system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
