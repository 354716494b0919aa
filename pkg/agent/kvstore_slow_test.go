package agent_test

import (
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"path/filepath"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/etcdtest"
)

// TestSlowEtcd puts a proxy adding slowDelay each way between agent-a
// and etcd (issue 38's slow control plane; agent-b talks to etcd
// directly) with the default lease TTL and request timeout, then, while
// it is slow: agent-a creates endpoints of a held and of a new label set
// (the new one needs a cluster identity from etcd: it completes, late),
// agent-b publishes an endpoint that must reach agent-a's ipcache, and
// every connection is cut so agent-a's watches resume through the delay.
// agent-a's lease is never lost (its endpoints stay published), its
// goroutines and heap stay bounded and flat, and once the delay is gone
// both agents agree.
func TestSlowEtcd(t *testing.T) {
	const slowDelay = 1500 * time.Millisecond
	srv := etcdtest.Start(t, etcdtest.Options{})
	u, err := url.Parse(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := testutil.NewDelayProxy(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	start := func(name string, i int, endpoint string) *kvNode {
		cfg := agentConfig(filepath.Join(t.TempDir(), name))
		cfg.IPv4Range = netip.MustParsePrefix(fmt.Sprintf("10.204.%d.0/24", i))
		cfg.Kvstore = &kvstore.Config{Endpoints: []string{endpoint}, NodeName: name, Prefix: "slow-test/"}
		cfg.NodeAddrs = []netip.Addr{netip.AddrFrom4([4]byte{192, 168, 91, byte(i)})}
		a, c, _ := startAgentT(t, cfg)
		return &kvNode{t: t, a: a, c: c}
	}
	a := start("agent-a", 1, "http://"+proxy.Addr())
	b := start("agent-b", 2, srv.Endpoint)
	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	first := a.create("pod-1", "k8s:app=held")
	waitStatus(t, b.c, func(k *models.KvstoreStatus) bool { return k.Healthy && k.RemoteEndpoints == 1 })
	lease0 := a.kv().Lease
	g0, h0 := testutil.GoroutinesAndHeap()

	proxy.SetDelay(slowDelay)
	t.Logf("etcd %s away each way from agent-a; baseline %d goroutines, %d MiB heap", slowDelay, g0, h0>>20)
	held := a.create("pod-2", "k8s:app=held")     // the identity is held: no etcd round trip on the ADD
	fresh := a.create("pod-3", "k8s:app=fresh")   // a new label set: a cluster identity from etcd, late
	remote := b.create("pod-b1", "k8s:app=other") // reaches agent-a through the slow watch
	proxy.CutAll()
	var samples []int
	var heaps []uint64
	for range 10 {
		time.Sleep(time.Second)
		g, h := testutil.GoroutinesAndHeap()
		samples, heaps = append(samples, g), append(heaps, h)
	}
	t.Logf("while slow: goroutines %v, heap MiB %v, proxy %d open / %d accepted; agent-a %+v",
		samples, testutil.MiB(heaps), proxy.Open(), proxy.Accepted.Load(), a.kv())
	if peak := slices.Max(samples); peak > g0+400 {
		t.Errorf("goroutines while slow: peak %d, baseline %d: unbounded", peak, g0)
	}
	if f, l := testutil.Mean(samples[:4]), testutil.Mean(samples[6:]); l > f+50 {
		t.Errorf("goroutines grow while slow: %.0f -> %.0f", f, l)
	}
	if peak := slices.Max(heaps); peak > h0+128<<20 {
		t.Errorf("heap while slow: peak %d MiB, baseline %d MiB", peak>>20, h0>>20)
	}
	// Still slow: agent-b's endpoint reaches agent-a, agent-a's reach etcd.
	waitIPCache(t, a.a, netip.MustParseAddr(remote.Addressing.IPv4), func(e *index.IPCacheEntry) bool {
		return e != nil && e.Identity == identity.NumericIdentity(remote.Identity.ID)
	})
	for _, ep := range []*models.Endpoint{first, held, fresh} {
		waitKey(t, etcd, fmt.Sprintf("slow-test/state/endpoints/v1/agent-a/%d", ep.ID), func([]byte) bool { return true })
	}
	waitStatus(t, b.c, func(k *models.KvstoreStatus) bool { return k.RemoteEndpoints == 3 })

	proxy.SetDelay(0)
	waitStatus(t, a.c, func(k *models.KvstoreStatus) bool { return k.Healthy && k.Synced && k.RemoteEndpoints == 1 })
	if k := a.kv(); k.Lease != lease0 || k.LeaseRegrants != 0 {
		t.Errorf("agent-a's lease: %x (%d regrants), before the delay %x: a slow etcd cost it its lease", k.Lease, k.LeaseRegrants, lease0)
	}
	if fresh.Identity == nil || fresh.Identity.ID < 256 || fresh.Identity.ID == first.Identity.ID {
		t.Errorf("endpoint of a new label set created while slow: identity %+v", fresh.Identity)
	}
}

// kvNode is one kvstore-mode agent of TestSlowEtcd.
type kvNode struct {
	t *testing.T
	a *agent.Agent
	c *client.Client
}

// create makes a pod's endpoint with an address, as the plugin does
// (each call bounded by a minute: while etcd is slow a new label set's
// identity takes several round trips).
func (n *kvNode) create(pod, label string) *models.Endpoint {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ip, err := n.c.IPAMAllocate(ctx, "ipv4", "default/"+pod)
	if err != nil {
		n.t.Fatal(err)
	}
	ep, err := n.c.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{ContainerID: "slow-" + pod, K8sNamespace: "default", K8sPodName: pod,
		Labels: []string{label}, Addressing: &models.AddressPair{IPv4: ip.Address.IPv4}, SyncBuild: true})
	if err != nil {
		n.t.Fatalf("create %s (%s): %v", pod, label, err)
	}
	return ep
}

func (n *kvNode) kv() *models.KvstoreStatus {
	n.t.Helper()
	st, err := n.c.Status(context.Background())
	if err != nil || st.Kvstore == nil {
		n.t.Fatalf("status: %v %+v", err, st)
	}
	return st.Kvstore
}
