package agent_test

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// BenchmarkRestore measures an agent restart with 1,000 endpoints on the
// fake datapath: from Start until every endpoint is ready again. "intact"
// keeps the datapath (the Fake) across the restart, as the kernel keeps
// it across an agent restart: endpoints resume without regenerating.
// "regenerate" starts with a fresh Fake that remembers no revision, so
// every restored endpoint regenerates (state write + realize): the
// restore storm of datapaths that cannot report what they realised.
func BenchmarkRestore(b *testing.B) {
	const n = 1000
	for _, intact := range []bool{true, false} {
		name := map[bool]string{true: "intact", false: "regenerate"}[intact]
		b.Run(fmt.Sprintf("%s/endpoints=%d", name, n), func(b *testing.B) {
			env := newRestoreEnv(b)
			env.cfg.IPv4Range, env.cfg.IPv6Range = netip.MustParsePrefix("10.234.0.0/20"), netip.MustParsePrefix("fd00:234::/116")
			fake := datapath.NewFake(7)
			a, _ := env.start(b, fake)
			createMany(b, env, n)
			stop(b, a)
			var toReady, leases time.Duration
			b.ResetTimer()
			for range b.N {
				if !intact {
					fake = datapath.NewFake(7)
				}
				start := time.Now()
				cfg := env.cfg
				cfg.Fake = fake
				a, err := agent.Start(cfg, env.log)
				if err != nil {
					b.Fatal(err)
				}
				waitAllReady(b, a, n)
				toReady += time.Since(start)
				leases += a.RestoreStats().Leases
				b.StopTimer()
				stop(b, a)
				b.StartTimer()
			}
			b.ReportMetric(float64(toReady.Microseconds())/1000/float64(b.N), "ms-to-ready")
			b.ReportMetric(float64(leases.Microseconds())/1000/float64(b.N), "ms-to-api-ready")
		})
	}
}

// createMany creates n endpoints (allocate + sync PUT) from 32 clients.
func createMany(b *testing.B, env *restoreEnv, n int) {
	b.Helper()
	c := client.New(env.cfg.Socket)
	defer c.Close()
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				name := fmt.Sprintf("r%d", i)
				ipr, err := c.IPAMAllocate(ctx, "", "bench/"+name)
				if err == nil {
					_, err = c.EndpointCreate(ctx, "container-id:"+name, &models.EndpointChangeRequest{
						K8sNamespace: "bench", K8sPodName: name, Addressing: ipr.Address, SyncBuild: true,
						Labels: []string{"k8s:app=bench", fmt.Sprintf("k8s:shard=%d", i%16)},
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

// waitAllReady polls the index until n endpoints are ready.
func waitAllReady(tb testing.TB, a *agent.Agent, n int) {
	tb.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		total, by := a.Index.CountEndpoints()
		if total == n && by[endpoint.StateReady] == n {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("not all ready: %d endpoints, by state %v", total, by)
		}
		time.Sleep(time.Millisecond)
	}
}
