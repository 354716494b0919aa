package kvstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// BenchmarkClusterAllocate: 8 nodes (8 clients of one embedded etcd)
// allocate label sets. same=true: every node acquires every label set
// (all race for each); same=false: each node its own label sets. The
// metrics are Acquire calls per second over all nodes, new identities
// per second, and the CPU per Acquire of clients and server together.
//
//	go test -run '^$' -bench ClusterAllocate -benchtime 4000x ./pkg/agent/kvstore/
func BenchmarkClusterAllocate(b *testing.B) {
	for _, same := range []bool{true, false} {
		b.Run(fmt.Sprintf("nodes=8/same=%v", same), func(b *testing.B) {
			srv := startEtcd(b)
			var nodes []*node
			for i := range 8 {
				nodes = append(nodes, newNode(b, srv.Endpoint, fmt.Sprintf("bench-%d", i)))
			}
			sets := make([][]labels.Labels, len(nodes))
			for i := range nodes {
				for j := range b.N {
					owner := i
					if same {
						owner = 0
					}
					sets[i] = append(sets[i], labelSet(b, "k8s:app=bench", fmt.Sprintf("k8s:n=%d", owner), fmt.Sprintf("k8s:i=%d", j)))
				}
			}
			b.ResetTimer()
			start, cpu0 := time.Now(), cpuTime(b)
			var wg sync.WaitGroup
			for i, nd := range nodes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for _, ls := range sets[i] {
						if _, _, err := nd.id.Acquire(context.Background(), ls); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			el, cpu := time.Since(start).Seconds(), cpuTime(b)-cpu0
			b.StopTimer()
			distinct := b.N
			if !same {
				distinct *= len(nodes)
			}
			b.ReportMetric(float64(b.N*len(nodes))/el, "acquires/s")
			b.ReportMetric(float64(distinct)/el, "identities/s")
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*len(nodes)), "cpu-µs/acquire")
		})
	}
}

// cpuTime is the process's user+system CPU time: the clients and the
// embedded etcd server together.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkEndpointFootprint publishes b.N endpoints from one node and
// reports etcd keys and bytes (key + value) per endpoint, and how long
// until a second node's mirror holds them all.
//
//	go test -run '^$' -bench EndpointFootprint -benchtime 1000x ./pkg/agent/kvstore/
func BenchmarkEndpointFootprint(b *testing.B) {
	srv := startEtcd(b)
	pub := startAgentNode(b, srv.Endpoint, "foot-a", 0)
	sub := startAgentNode(b, srv.Endpoint, "foot-b", 1)
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		ip := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		pub.src.set(endpoint.ID(i+1), ip, identity.NumericIdentity(256+i%1000), endpoint.StateReady)
	}
	testutil.Eventually(b, "mirror holds every endpoint", func() bool { ips, _ := sub.sink.view(); return len(ips) == b.N })
	el := time.Since(start)
	b.StopTimer()
	keys, bytes := countKeys(b, pub.c.Etcd(), prefixOf(b)+"state/endpoints/v1/")
	b.ReportMetric(float64(keys)/float64(b.N), "keys/endpoint")
	b.ReportMetric(float64(bytes)/float64(b.N), "bytes/endpoint")
	b.ReportMetric(el.Seconds()*1000, "ms-to-mirror-all")
	_, nodeBytes := countKeys(b, pub.c.Etcd(), prefixOf(b)+"state/nodes/v1/foot-a")
	b.ReportMetric(float64(nodeBytes), "bytes/node")
	ids := kvstore.NewIdentityBackend(pub.c)
	defer ids.Close()
	ls := labelSet(b, "k8s:app=web", "k8s:io.kubernetes.pod.namespace=default")
	if _, _, err := ids.Acquire(context.Background(), ls); err != nil {
		b.Fatal(err)
	}
	_, idBytes := countKeys(b, pub.c.Etcd(), prefixOf(b)+"state/identities/v1/")
	b.ReportMetric(float64(idBytes), "bytes/identity-1-node")
}

// BenchmarkConvergence: 10 nodes each publish 1,000 endpoints (from
// their index through the Publisher) and every node's mirror hands the
// others' to its agent (an in-memory sink). Once all hold the 9,000
// others, 200 more endpoints are created on random nodes, one every 10 ms;
// reported is the time from an endpoint's creation in its node's index to
// its arrival at each other node's agent, p50/p99/max over all
// (endpoint, node) pairs, and the time the initial 10,000 took. Only the
// kvstore path: the actor system's ipcache write is not included.
//
//	go test -run '^$' -bench Convergence -benchtime 1x ./pkg/agent/kvstore/
func BenchmarkConvergence(b *testing.B) {
	const nodesN, perNode, extra = 10, 1000, 200
	srv := startEtcd(b)
	var nodes []*agentNode
	for i := range nodesN {
		nodes = append(nodes, startAgentNode(b, srv.Endpoint, fmt.Sprintf("conv-%d", i), i))
	}
	b.ResetTimer()
	fill := time.Now()
	for i, n := range nodes {
		for p := range perNode {
			n.src.set(endpoint.ID(p+1), netip.AddrFrom4([4]byte{10, byte(i + 1), byte(p >> 8), byte(p)}), identity.NumericIdentity(256+p%100), endpoint.StateReady)
		}
	}
	converged := func(total int) {
		for _, n := range nodes {
			testutil.Eventually(b, n.name+" converged", func() bool { ips, _ := n.sink.view(); return len(ips) >= total-perNode })
		}
	}
	converged(nodesN * perNode)
	fillTime := time.Since(fill)
	for _, n := range nodes {
		n.sink.stamp()
	}
	created, owner := map[netip.Addr]time.Time{}, map[netip.Addr]int{}
	for k := range extra {
		i := rand.IntN(nodesN)
		ip := netip.AddrFrom4([4]byte{10, byte(i + 1), 100 + byte(k>>8), byte(k)})
		created[ip], owner[ip] = time.Now(), i
		nodes[i].src.set(endpoint.ID(perNode+k+1), ip, 300, endpoint.StateReady)
		time.Sleep(10 * time.Millisecond)
	}
	var lat []time.Duration
	for i, n := range nodes {
		testutil.Eventually(b, n.name+" has every new endpoint", func() bool {
			seen := n.sink.firstSeen()
			for ip := range created {
				if _, ok := seen[ip]; !ok && owner[ip] != i {
					return false
				}
			}
			return true
		})
		seen := n.sink.firstSeen()
		for ip, at := range created {
			if owner[ip] != i {
				lat = append(lat, seen[ip].Sub(at))
			}
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	q := func(f float64) float64 { return float64(lat[int(f*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(q(1), "max-ms")
	b.ReportMetric(fillTime.Seconds()*1000, "fill-10k-ms")
}
