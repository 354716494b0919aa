package kvstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestAcquireDuringLeaseRegrant reproduces TestEtcdRestart's old flake
// (issue 38: "healthy reported before a new lease exists"): etcd answers
// but the node has no lease yet. The node's lease is revoked behind its
// back and its connection to etcd is 300 ms away each way, so the new
// grant takes a visible while; an Acquire made in that window waits for
// the new lease (bounded by the request timeout) and succeeds, instead of
// failing with ErrUnavailable as it did.
func TestAcquireDuringLeaseRegrant(t *testing.T) {
	srv := startEtcd(t)
	proxy, err := testutil.NewDelayProxy(strings.TrimPrefix(srv.Endpoint, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	n := newNode(t, "http://"+proxy.Addr(), "regrant")
	direct, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	for round := range 3 {
		lease, ok := n.c.Lease()
		if !ok {
			t.Fatal("no lease")
		}
		proxy.SetDelay(300 * time.Millisecond)
		if _, err := direct.Revoke(context.Background(), lease); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, "the node sees its lease gone", func() bool { _, ok := n.c.Lease(); return !ok })
		if !n.c.Health().Healthy {
			t.Fatalf("round %d: etcd unhealthy; the window this test needs is reachable etcd without a lease", round)
		}
		// In the window: healthy, no lease. The Acquire must wait for the
		// new lease, not fail.
		id, _, err := n.id.Acquire(context.Background(), labelSet(t, "k8s:app=regrant"))
		if err != nil {
			t.Fatalf("round %d: acquire while the lease is regranted: %v", round, err)
		}
		if id < 256 {
			t.Fatalf("round %d: identity %d", round, id)
		}
		if l, ok := n.c.Lease(); !ok || l == lease {
			t.Fatalf("round %d: lease %x (ok %v), revoked %x", round, l, ok, lease)
		}
		proxy.SetDelay(0)
	}
}
