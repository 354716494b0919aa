package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
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

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// kvAgent starts an agent in kvstore mode against etcd.
func kvAgent(t *testing.T, endpoint, name string, i int) (*agent.Agent, *client.Client) {
	t.Helper()
	return kvAgentPrefix(t, endpoint, name, i, "agent-test/")
}

func kvAgentPrefix(t *testing.T, endpoint, name string, i int, prefix string) (*agent.Agent, *client.Client) {
	t.Helper()
	cfg := agentConfig(filepath.Join(t.TempDir(), name))
	cfg.IPv4Range = netip.MustParsePrefix(fmt.Sprintf("10.204.%d.0/24", i))
	cfg.Kvstore = &kvstore.Config{Endpoints: []string{endpoint}, NodeName: name, Prefix: prefix, LeaseTTL: 2 * time.Second}
	cfg.NodeAddrs = []netip.Addr{netip.AddrFrom4([4]byte{192, 168, 90, byte(i)})}
	a, c, _ := startAgentT(t, cfg)
	return a, c
}

// TestKvstoreMode: two agents on one etcd. An endpoint created on one is
// published (IP, identity, node) and reaches the other's ipcache (origin
// kvstore, tunnel endpoint the first node's address) and status; deleting
// it withdraws it from both; both report etcd healthy with a lease.
func TestKvstoreMode(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	_, ca := kvAgent(t, srv.Endpoint, "agent-a", 1)
	b, cb := kvAgent(t, srv.Endpoint, "agent-b", 2)
	ctx := ctx10(t)
	ip, err := ca.IPAMAllocate(ctx, "ipv4", "default/pod-a")
	if err != nil {
		t.Fatal(err)
	}
	ep, err := ca.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{ContainerID: "kv-c1", K8sNamespace: "default", K8sPodName: "pod-a", Labels: []string{"k8s:app=kv"},
		Addressing: &models.AddressPair{IPv4: ip.Address.IPv4}, SyncBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	key := fmt.Sprintf("agent-test/state/endpoints/v1/agent-a/%d", ep.ID)
	waitKey(t, etcd, key, func(v []byte) bool {
		var rec struct {
			IPs      []string `json:"ips"`
			Identity int64    `json:"identity"`
			Node     string   `json:"node"`
			NodeIP   string   `json:"nodeIP"`
		}
		return json.Unmarshal(v, &rec) == nil && len(rec.IPs) == 1 && rec.IPs[0] == ip.Address.IPv4 &&
			rec.Identity == ep.Identity.ID && rec.Node == "agent-a" && rec.NodeIP == "192.168.90.1"
	})
	waitStatus(t, cb, func(k *models.KvstoreStatus) bool {
		return k.Healthy && k.Lease != 0 && k.Synced && k.RemoteEndpoints == 1 && k.RemoteNodes == 1
	})
	// The same label set gets the same cluster identity on B.
	ipb, err := cb.IPAMAllocate(ctx, "ipv4", "default/pod-b1")
	if err != nil {
		t.Fatal(err)
	}
	epb, err := cb.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{ContainerID: "kv-b1", K8sNamespace: "default", K8sPodName: "pod-b1",
		Labels: []string{"k8s:app=kv"}, Addressing: &models.AddressPair{IPv4: ipb.Address.IPv4}, SyncBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	if epb.Identity.ID != ep.Identity.ID || ep.Identity.ID < 256 {
		t.Fatalf("k8s:app=kv is identity %d on agent-a and %d on agent-b", ep.Identity.ID, epb.Identity.ID)
	}
	if err := cb.EndpointDelete(ctx, fmt.Sprint(epb.ID)); err != nil {
		t.Fatal(err)
	}
	// B routes to A: A's node from the kvstore is in B's nodes table.
	testutil.Eventually(t, "agent-a in agent-b's nodes", func() bool {
		for _, n := range b.Index.Nodes() {
			if n.Source == kvstore.Source && n.Name == "agent-a" && slices.Contains(n.Addrs, netip.MustParseAddr("192.168.90.1")) &&
				slices.Contains(n.PodCIDRs, netip.MustParsePrefix("10.204.1.0/24")) {
				return true
			}
		}
		return false
	})
	// B's ipcache holds A's pod with A's identity, tunnelled to A.
	podIP := netip.MustParseAddr(ip.Address.IPv4)
	waitIPCache(t, b, podIP, func(e *index.IPCacheEntry) bool {
		return e != nil && e.Identity == identity.NumericIdentity(ep.Identity.ID) && len(e.Claims) == 1 &&
			e.Claims[0].Origin == kvstore.Source && e.TunnelEndpoint == netip.MustParseAddr("192.168.90.1")
	})
	if err := ca.EndpointDelete(ctx, fmt.Sprint(ep.ID)); err != nil {
		t.Fatal(err)
	}
	waitKey(t, etcd, key, nil)
	waitStatus(t, cb, func(k *models.KvstoreStatus) bool { return k.RemoteEndpoints == 0 && k.RemoteNodes == 1 })
	waitIPCache(t, b, podIP, func(e *index.IPCacheEntry) bool { return e == nil })
	waitStatus(t, ca, func(k *models.KvstoreStatus) bool { return k.Healthy && k.Node == "agent-a" && k.Published == 1 })

	// etcd goes away: the status says so, the agent keeps serving (an
	// endpoint of a label set it holds is created from its cache), an
	// endpoint of a new label set waits, and both are published once etcd
	// is back (the same data directory: nothing of before is lost).
	create := func(ctx context.Context, pod, label string) (*models.Endpoint, error) {
		ipx, err := ca.IPAMAllocate(ctx, "ipv4", "default/"+pod)
		if err != nil {
			return nil, err
		}
		return ca.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{ContainerID: "kv-" + pod, K8sNamespace: "default", K8sPodName: pod,
			Labels: []string{label}, Addressing: &models.AddressPair{IPv4: ipx.Address.IPv4}, SyncBuild: true})
	}
	if _, err := create(ctx, "keep", "k8s:app=keep"); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	waitStatus(t, ca, func(k *models.KvstoreStatus) bool { return !k.Healthy && k.LastError != "" })
	ep2, err := create(ctx, "pod-b", "k8s:app=keep")
	if err != nil {
		t.Fatalf("create of a held label set while etcd is down: %v", err)
	}
	ip2 := &models.IPAMResponse{Address: ep2.Addressing}
	waiting := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_, err := create(wctx, "pod-new", "k8s:app=new-during-outage")
		waiting <- err
	}()
	srv.Restart()
	waitKey(t, etcd, fmt.Sprintf("agent-test/state/endpoints/v1/agent-a/%d", ep2.ID), func([]byte) bool { return true })
	waitStatus(t, cb, func(k *models.KvstoreStatus) bool { return k.Healthy && k.RemoteEndpoints >= 2 && k.RemoteNodes == 1 })
	waitIPCache(t, b, netip.MustParseAddr(ip2.Address.IPv4), func(e *index.IPCacheEntry) bool {
		return e != nil && e.Identity == identity.NumericIdentity(ep2.Identity.ID)
	})
	if err := <-waiting; err != nil {
		t.Fatalf("create of a new label set across the outage: %v", err)
	}
}

// waitKey waits until key holds a value ok accepts (ok nil: until the
// key is gone).
func waitKey(t *testing.T, etcd *clientv3.Client, key string, ok func([]byte) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := etcd.Get(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if (ok == nil && len(resp.Kvs) == 0) || (ok != nil && len(resp.Kvs) == 1 && ok(resp.Kvs[0].Value)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %s: %v", key, resp.Kvs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitIPCache waits until ok accepts ip's /32 ipcache entry in a's index
// (nil: none).
func waitIPCache(t *testing.T, a *agent.Agent, ip netip.Addr, ok func(*index.IPCacheEntry) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var found *index.IPCacheEntry
		for _, e := range a.Index.IPCache() {
			if e.Prefix == netip.PrefixFrom(ip, ip.BitLen()) {
				found = e
			}
		}
		if ok(found) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ipcache entry of %s: %+v", ip, found)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitStatus(t *testing.T, c *client.Client, ok func(*models.KvstoreStatus) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := c.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st.Kvstore != nil && ok(st.Kvstore) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvstore status: %+v", st.Kvstore)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestKvstoreAgentCrash: an agent killed (simulated SIGKILL) withdraws
// nothing; once its lease expires the other agent drops its endpoint from
// the ipcache; restarted on the same state, it restores the endpoint and
// publishes it again.
func TestKvstoreAgentCrash(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	cfg := agentConfig(filepath.Join(t.TempDir(), "crash-a"))
	cfg.IPv4Range = netip.MustParsePrefix("10.204.7.0/24")
	cfg.Kvstore = &kvstore.Config{Endpoints: []string{srv.Endpoint}, NodeName: "crash-a", Prefix: "agent-crash/", LeaseTTL: 2 * time.Second}
	cfg.NodeAddrs = []netip.Addr{netip.MustParseAddr("192.168.91.1")}
	a, err := agent.Start(cfg, quietLog)
	if err != nil {
		t.Fatal(err)
	}
	ca := client.New(cfg.Socket)
	defer ca.Close()
	b, _ := kvAgentPrefix(t, srv.Endpoint, "crash-b", 8, "agent-crash/")
	ctx := ctx10(t)
	ip, err := ca.IPAMAllocate(ctx, "ipv4", "default/pod-c")
	if err != nil {
		t.Fatal(err)
	}
	ep, err := ca.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{ContainerID: "crash-c1", K8sNamespace: "default", K8sPodName: "pod-c",
		Labels: []string{"k8s:app=crash"}, Addressing: &models.AddressPair{IPv4: ip.Address.IPv4}, SyncBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	podIP := netip.MustParseAddr(ip.Address.IPv4)
	has := func(e *index.IPCacheEntry) bool {
		return e != nil && e.Identity == identity.NumericIdentity(ep.Identity.ID)
	}
	waitIPCache(t, b, podIP, has)
	a.Crash()
	waitIPCache(t, b, podIP, func(e *index.IPCacheEntry) bool { return e == nil })
	a2, err := agent.Start(cfg, quietLog)
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	t.Cleanup(func() { _ = a2.Stop(context.Background()) })
	waitIPCache(t, b, podIP, has)
}
