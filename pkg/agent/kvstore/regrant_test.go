package kvstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
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

// TestLeaseKeptAfterLapse: a keep-alive that lapses while etcd still
// holds the lease (its answers read late by a starved node) keeps the
// lease and the keys under it, instead of granting a new lease and
// writing every key again; a lease etcd dropped is replaced and the keys
// written again under the new one.
func TestLeaseKeptAfterLapse(t *testing.T) {
	srv := startEtcd(t)
	n := newNode(t, srv.Endpoint, "lapse")
	ls := labelSet(t, "k8s:app=lapse")
	if _, _, err := n.id.Acquire(context.Background(), ls); err != nil {
		t.Fatal(err)
	}
	ref := prefixOf(t) + "state/identities/v1/refs/" + kvstore.RefHash(ls.Key()) + "/lapse"
	cli := n.c.Etcd()
	get := func() (rev, lease int64) {
		resp, err := cli.Get(context.Background(), ref)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 1 {
			return 0, 0
		}
		return resp.Kvs[0].ModRevision, resp.Kvs[0].Lease
	}
	lease, _ := n.c.Lease()
	rev, held := get()
	if clientv3.LeaseID(held) != lease {
		t.Fatalf("reference under lease %x, node lease %x", held, lease)
	}

	n.c.LapseKeepAlive()
	testutil.Eventually(t, "the lapsed lease kept", func() bool { return n.c.Health().Kept == 1 })
	if h := n.c.Health(); h.Regrants != 0 || clientv3.LeaseID(h.Lease) != lease {
		t.Fatalf("after the lapse: lease %x (was %x), %d regrants", h.Lease, lease, h.Regrants)
	}
	// Kept alive past its TTL, the keys untouched.
	time.Sleep(3 * time.Second)
	if r, l := get(); r != rev || clientv3.LeaseID(l) != lease {
		t.Fatalf("reference at revision %d under lease %x; was %d under %x", r, l, rev, lease)
	}

	// A lease etcd dropped is replaced, the keys written again.
	if _, err := cli.Revoke(context.Background(), lease); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "a new lease and the reference under it", func() bool {
		l, ok := n.c.Lease()
		_, rl := get()
		return ok && l != lease && clientv3.LeaseID(rl) == l
	})
	if h := n.c.Health(); h.Regrants != 1 || h.Kept != 1 {
		t.Fatalf("after the revoke: %d regrants, %d kept", h.Regrants, h.Kept)
	}
}
