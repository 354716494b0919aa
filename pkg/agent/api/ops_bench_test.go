package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// populate creates n live endpoints through the API from 64 clients: 4
// namespaces, app=web|db, tier=front|back|cache, one IPv4 each.
func populate(b *testing.B, c *client.Client, n int) {
	b.Helper()
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				ns, pod := fmt.Sprintf("ns-%d", i%4), fmt.Sprintf("p-%d", i)
				ipr, err := c.IPAMAllocate(ctx, "ipv4", ns+"/"+pod)
				if err == nil {
					_, err = c.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{
						ContainerID: fmt.Sprintf("ops-%d", i), K8sNamespace: ns, K8sPodName: pod,
						Labels:     []string{"k8s:app=" + []string{"web", "db"}[i%2], "k8s:tier=" + []string{"front", "back", "cache"}[i%3]},
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
}

// BenchmarkOperatorQueries10k measures the operator reads against 10,000
// live endpoints (10,005 actors): the whole actor tree, a filtered actor
// query, and filtered endpoint lists (whole and paginated), each a full
// HTTP round trip over the unix socket with the body read and, once,
// decoded to check its size. Targets (issue 7): GET /v1/actors < 50 ms,
// filtered GET /v1/endpoint < 20 ms.
func BenchmarkOperatorQueries10k(b *testing.B) {
	const live = 10000
	a, c := startBenchAgent(b)
	populate(b, c, live)
	if total, _ := a.Index.CountEndpoints(); total != live {
		b.Fatalf("index holds %d endpoints, want %d", total, live)
	}
	hc := unixHTTPClient(a.Socket())
	hc.Timeout = time.Minute
	one, _ := c.EndpointGet(context.Background(), "1")
	queries := []struct {
		name, path string
		want       int // answer length (actors or endpoints), -1: unchecked
	}{
		{"actors", "/v1/actors", live + 8}, // the root, datapath, ipam, ipcache, policy, identity, gc, endpoints
		{"actors-kind-endpoint", "/v1/actors?kind=endpoint", live},
		{"actors-stuck-1s", "/v1/actors?stuck=1s", 0},
		{"endpoint-ns-selector", "/v1/endpoint?namespace=ns-1&selector=app%3Ddb,tier!%3Dback", -1},
		{"endpoint-ns-selector-page100", "/v1/endpoint?namespace=ns-1&selector=app%3Ddb,tier!%3Dback&limit=100", 100},
		{"endpoint-selector-all-ns", "/v1/endpoint?selector=app%3Ddb,tier%3Dcache", -1},
		{"endpoint-ip", "/v1/endpoint?ip=" + one.Addressing.IPv4, 1},
		{"endpoint-all-page100", "/v1/endpoint?limit=100", 100},
	}
	for _, q := range queries {
		b.Run(q.name, func(b *testing.B) {
			body := get(b, hc, q.path)
			var arr []json.RawMessage
			if err := json.Unmarshal(body, &arr); err != nil {
				b.Fatal(err)
			}
			if q.want >= 0 && len(arr) != q.want {
				b.Fatalf("%s answered %d items, want %d", q.path, len(arr), q.want)
			}
			ds := make([]time.Duration, 0, b.N)
			cpu0 := cpuTime()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				drain(b, hc, q.path)
				ds = append(ds, time.Since(t0))
			}
			b.StopTimer()
			b.ReportMetric(float64(len(arr)), "items")
			b.ReportMetric(float64(len(body))/1024, "KiB")
			// Process CPU (agent and client share it) per request: a
			// figure less sensitive to the shared machine's load.
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
			slices.Sort(ds)
			b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(ds[(len(ds)-1)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}

func get(b *testing.B, hc *http.Client, path string) []byte {
	resp, err := hc.Get("http://membrane" + path)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		b.Fatalf("GET %s: %d %v", path, resp.StatusCode, err)
	}
	return body
}

// drain reads an answer without keeping it, as a streaming client would.
func drain(b *testing.B, hc *http.Client, path string) {
	resp, err := hc.Get("http://membrane" + path)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != 200 {
		b.Fatalf("GET %s: %d %v", path, resp.StatusCode, err)
	}
}
