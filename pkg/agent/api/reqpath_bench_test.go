package api_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// BenchmarkRequestPath measures the cost of the HTTP request path (client,
// transport, server, handlers, JSON) per operation, one client, over the
// unix socket against an agent on the fake datapath; allocs/op and B/op
// count both sides (they share the process), and so does cpu-ns/op (the
// process's user + system CPU time per operation: less noisy than ns/op
// on a shared machine, but it includes the agent's actors and GC).
//
//   - get: GET /v1/endpoint/{id} of a live endpoint: the request path
//     alone (the handler reads the index; no actor is involved).
//   - ipam: POST /v1/ipam then DELETE /v1/ipam/{ip}: two mutating calls
//     whose actor work (the IPAM actor) is small.
//   - sim-lifecycle: the simulator's endpoint lifecycle, 4 calls: POST
//     /v1/ipam, PUT /v1/endpoint (sync), POST .../regenerate, DELETE.
func BenchmarkRequestPath(b *testing.B) {
	b.Run("get", func(b *testing.B) {
		_, c := startBenchAgent(b)
		ctx := context.Background()
		ep, err := c.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{
			ContainerID: "get-1", K8sNamespace: "bench", K8sPodName: "get-1",
			Labels: []string{"k8s:app=bench"}, SyncBuild: true,
		})
		if err != nil {
			b.Fatal(err)
		}
		ref := fmt.Sprint(ep.ID)
		b.ReportAllocs()
		b.ResetTimer()
		cpu0 := cpuTime()
		for b.Loop() {
			if _, err := c.EndpointGet(ctx, ref); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
	})
	b.Run("ipam", func(b *testing.B) {
		_, c := startBenchAgent(b)
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		cpu0 := cpuTime()
		for b.Loop() {
			ipr, err := c.IPAMAllocate(ctx, "ipv4", "bench/ipam")
			if err != nil {
				b.Fatal(err)
			}
			if err := c.IPAMRelease(ctx, ipr.Address.IPv4); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
	})
	b.Run("sim-lifecycle", func(b *testing.B) {
		_, c := startBenchAgent(b)
		ctx := context.Background()
		labels := []string{"k8s:app=bench", "k8s:tier=front"}
		b.ReportAllocs()
		b.ResetTimer()
		cpu0 := cpuTime()
		n := 0
		for b.Loop() {
			n++
			cid := fmt.Sprintf("life-%d", n)
			ipr, err := c.IPAMAllocate(ctx, "ipv4", "bench/"+cid)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := c.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{
				ContainerID: cid, ContainerInterfaceName: "eth0", K8sNamespace: "bench", K8sPodName: cid,
				Labels: labels, Addressing: &models.AddressPair{IPv4: ipr.Address.IPv4}, SyncBuild: true,
			}); err != nil {
				b.Fatal(err)
			}
			if _, err := c.EndpointRegenerate(ctx, "container-id:"+cid); err != nil {
				b.Fatal(err)
			}
			if err := c.EndpointDelete(ctx, "container-id:"+cid); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
	})
}
