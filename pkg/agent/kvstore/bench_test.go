package kvstore_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// BenchmarkClusterAllocate: 8 nodes (8 clients of one embedded etcd)
// allocate label sets. same=true: every node acquires every label set
// (all race for each); same=false: each node its own label sets. The
// metrics are Acquire calls per second over all nodes and new identities
// per second.
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
			start := time.Now()
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
			el := time.Since(start).Seconds()
			b.StopTimer()
			distinct := b.N
			if !same {
				distinct *= len(nodes)
			}
			b.ReportMetric(float64(b.N*len(nodes))/el, "acquires/s")
			b.ReportMetric(float64(distinct)/el, "identities/s")
		})
	}
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
	waitFor(b, "mirror holds every endpoint", func() bool { ips, _ := sub.sink.view(); return len(ips) == b.N })
	el := time.Since(start)
	b.StopTimer()
	keys, bytes := countKeys(b, pub.c.Etcd(), prefixOf(b)+"state/endpoints/v1/")
	b.ReportMetric(float64(keys)/float64(b.N), "keys/endpoint")
	b.ReportMetric(float64(bytes)/float64(b.N), "bytes/endpoint")
	b.ReportMetric(el.Seconds()*1000, "ms-to-mirror-all")
}

// BenchmarkConvergence: 10 nodes each publish 1,000 endpoints at once
// (from their index through the Publisher); every node's mirror hands the
// others' to its agent (an in-memory sink). Reported: the time from an
// endpoint's creation in its node's index to its arrival at each other
// node's agent, p50/p99/max over all (endpoint, node) pairs. Only the
// kvstore path: the actor system's ipcache write is not included.
//
//	go test -run '^$' -bench Convergence -benchtime 1x ./pkg/agent/kvstore/
func BenchmarkConvergence(b *testing.B) {
	const nodesN, perNode = 10, 1000
	srv := startEtcd(b)
	var nodes []*agentNode
	for i := range nodesN {
		nodes = append(nodes, startAgentNode(b, srv.Endpoint, fmt.Sprintf("conv-%d", i), i))
	}
	for _, n := range nodes {
		n.sink.stamp()
	}
	created := map[netip.Addr]time.Time{}
	b.ResetTimer()
	for i, n := range nodes {
		for p := range perNode {
			ip := netip.AddrFrom4([4]byte{10, byte(i + 1), byte(p >> 8), byte(p)})
			created[ip] = time.Now()
			n.src.set(endpoint.ID(p+1), ip, identity.NumericIdentity(256+p%100), endpoint.StateReady)
		}
	}
	for _, n := range nodes {
		waitFor(b, n.name+" converged", func() bool { ips, _ := n.sink.view(); return len(ips) == (nodesN-1)*perNode })
	}
	b.StopTimer()
	var lat []time.Duration
	for _, n := range nodes {
		for ip, at := range n.sink.firstSeen() {
			lat = append(lat, at.Sub(created[ip]))
		}
	}
	slices.Sort(lat)
	q := func(f float64) float64 { return float64(lat[int(f*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(q(1), "max-ms")
}
