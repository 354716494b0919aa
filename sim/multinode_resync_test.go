package sim

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/etcdtest"
)

// TestProvisionalIdentityRecreated forces the sequence behind
// TestMultiNode's "identity N held by a node's endpoints is not in etcd":
// a node knows identity N of a label set from its watch, no node uses it;
// etcd becomes unreachable for the node, which binds a new endpoint of the
// label set to N meanwhile (provisionally); another node's GC collects N;
// etcd comes back. The node's endpoint still holds N, so once the node is
// done with the store, id/N must be back in etcd with the node's
// reference (as Cilium's allocator re-creates the master key of an
// identity a node still uses), not the label set under another number
// that the node then drops.
func TestProvisionalIdentityRecreated(t *testing.T) {
	if testing.Short() {
		t.Skip("agent against a real etcd")
	}
	srv := etcdtest.Start(t, etcdtest.Options{})
	proxy := etcdtest.NewProxy(t, srv.Endpoint[len("http://"):])
	a, c := startResyncAgent(t, "http://"+proxy.Addr)
	gc, cli := startGCNode(t, srv.Endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const label = "k8s:app=resync"

	first := createResyncEndpoint(ctx, t, c, "first", label)
	n := identity.NumericIdentity(first.Identity.ID)
	lk := waitIdentity(t, cli, n)
	if err := c.EndpointDelete(ctx, strconv.FormatInt(first.ID, 10)); err != nil {
		t.Fatalf("delete the first endpoint: %v", err)
	}
	resyncWait(t, "the node's release of identity "+fmt.Sprint(n), func() bool {
		st, err := readEtcdIdentities(ctx, cli)
		row, ok := a.Index.Identity(n)
		return err == nil && len(st.refs[refHash(lk)]) == 0 && ok && row.Cluster && row.RefCount == 0
	})

	proxy.Cut()
	second := createResyncEndpoint(ctx, t, c, "second", label)
	if got := identity.NumericIdentity(second.Identity.ID); got != n {
		t.Fatalf("endpoint created while etcd is unreachable got identity %d, want the known %d", got, n)
	}
	if st, _ := a.System.ClusterIdentities(); st.Waiting != 1 {
		t.Fatalf("cluster identities while etcd is unreachable: %+v, want the label set waiting for confirmation", st)
	}
	gc.collect(ctx, t, cli, n)

	proxy.Restore()
	resyncWait(t, "the node done with the store", func() bool {
		st, _ := a.System.ClusterIdentities()
		return st.Waiting == 0
	})
	st, err := readEtcdIdentities(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	if st.ids[n] != lk || st.labels[lk] != n.String() || !slices.Contains(st.refs[refHash(lk)], "resync-node") {
		t.Fatalf("the node's endpoint holds identity %d (%s): id/%d is %q, labels/ says %q, references %v; want it back with the node's reference",
			n, lk, n, st.ids[n], st.labels[lk], st.refs[refHash(lk)])
	}
	if row, ok := a.Index.Identity(n); !ok || !row.Cluster || row.RefCount != 1 {
		t.Fatalf("identity %d on the node: %+v %v, want confirmed by the store with one reference", n, row, ok)
	}
}

// startResyncAgent starts one agent (fake datapath) in kvstore mode on
// endpoint, stopped at cleanup.
func startResyncAgent(t *testing.T, endpoint string) (*agent.Agent, *client.Client) {
	t.Helper()
	dir := t.TempDir()
	ac := agent.Config{Socket: filepath.Join(dir, "a.sock"), StateDir: filepath.Join(dir, "state"),
		IPv4Range: podRange(0), Datapath: "fake", GCInterval: -1, GCPercent: agent.DefaultGCPercent, Fake: datapath.NewFake(1),
		Kvstore: &kvstore.Config{Endpoints: []string{endpoint}, NodeName: "resync-node", Prefix: simPrefix, LeaseTTL: 2 * time.Second,
			GCInterval: -1, RequestTimeout: time.Second, DialTimeout: time.Second},
		NodeAddrs: resyncNodeAddrs}
	var logs testutil.LogBuffer
	a, err := agent.Start(ac, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatalf("start agent: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", logs.String())
		}
	})
	c := client.New(ac.Socket)
	t.Cleanup(func() {
		c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = a.Stop(ctx)
	})
	return a, c
}

// resyncNodeAddrs are the resync tests' node's addresses.
var resyncNodeAddrs = []netip.Addr{netip.AddrFrom4([4]byte{192, 168, 230, 1})}

func createResyncEndpoint(ctx context.Context, t *testing.T, c *client.Client, pod, label string) *models.Endpoint {
	t.Helper()
	ip, err := c.IPAMAllocate(ctx, "ipv4", "sim/"+pod)
	if err != nil {
		t.Fatalf("allocate an address for %s: %v", pod, err)
	}
	ep, err := c.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{ContainerID: "resync-" + pod, K8sNamespace: "sim",
		K8sPodName: pod, Labels: []string{label}, Addressing: &models.AddressPair{IPv4: ip.Address.IPv4}, SyncBuild: true})
	if err != nil {
		t.Fatalf("create endpoint %s: %v", pod, err)
	}
	if ep.Identity == nil || ep.Identity.ID == 0 {
		t.Fatalf("endpoint %s has no identity: %+v", pod, ep)
	}
	return ep
}

// waitIdentity waits until id/n is in etcd and returns its labels key.
func waitIdentity(t *testing.T, cli *clientv3.Client, n identity.NumericIdentity) string {
	t.Helper()
	var lk string
	resyncWait(t, fmt.Sprintf("id/%d in etcd", n), func() bool {
		st, err := readEtcdIdentities(context.Background(), cli)
		lk = st.ids[n]
		return err == nil && lk != ""
	})
	return lk
}

// gcNode is another node's identity backend, whose GC passes the test
// runs.
type gcNode struct{ b *kvstore.IdentityBackend }

// startGCNode connects another node to etcd at endpoint.
func startGCNode(t *testing.T, endpoint string) (*gcNode, *clientv3.Client) {
	t.Helper()
	c, err := kvstore.Connect(kvstore.Config{Endpoints: []string{endpoint}, NodeName: "resync-gc", Prefix: simPrefix,
		LeaseTTL: 2 * time.Second, GCInterval: -1, GCGrace: time.Millisecond}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("connect the GC node: %v", err)
	}
	b := kvstore.NewIdentityBackend(c)
	t.Cleanup(func() {
		_ = b.Close()
		_ = c.Close()
	})
	return &gcNode{b: b}, c.Etcd()
}

// collect runs GC passes until identity n is gone from etcd.
func (g *gcNode) collect(ctx context.Context, t *testing.T, cli *clientv3.Client, n identity.NumericIdentity) {
	t.Helper()
	resyncWait(t, fmt.Sprintf("the GC collecting identity %d", n), func() bool {
		if _, err := g.b.CollectGarbage(ctx); err != nil {
			t.Logf("gc pass: %v", err)
		}
		st, err := readEtcdIdentities(ctx, cli)
		return err == nil && st.ids[n] == ""
	})
}

// resyncWait polls cond until it holds, bounded by a deadline only a
// broken implementation reaches.
func resyncWait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
