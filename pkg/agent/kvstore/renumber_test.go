package kvstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/etcdtest"
)

// TestRenumberedDuringPartition is how a node's identity number comes to
// differ from the store's (issue 38: "the identity conflict that is
// logged but never relabelled"): a node cut off etcd longer than its
// lease loses its reference, GC collects its identity, and another node
// numbers the same labels anew; back, the node cannot restore its number
// (the labels have another). The identity actor then moves the node to
// the store's number: it acquires the label set (the new number) and
// releases the old one, in either order. Both numbers share the node's
// reference key (it is per label set), so the release of the old number
// must not delete the reference the new one needs: it stays, and the
// node holds just the new number.
func TestRenumberedDuringPartition(t *testing.T) {
	srv := startEtcd(t)
	proxy := etcdtest.NewProxy(t, srv.Endpoint[len("http://"):])
	a := newNode(t, "http://"+proxy.Addr, "renum-a")
	b := newNode(t, srv.Endpoint, "renum-b")
	gcClient := connect(t, srv.Endpoint, "renum-gc", func(c *kvstore.Config) { c.GCGrace = time.Nanosecond })
	gc := kvstore.NewIdentityBackend(gcClient)
	t.Cleanup(func() { _ = gc.Close() })
	p := prefixOf(t) + "state/identities/v1/"
	ls := labelSet(t, "k8s:app=renumbered")
	ref := p + "refs/" + kvstore.RefHash(ls.Key()) + "/renum-a"
	ctx := context.Background()

	old, _, err := a.id.Acquire(ctx, ls)
	if err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	testutil.Eventually(t, "gc collects a's identity while a is cut off", func() bool {
		if _, err := gc.CollectGarbage(ctx); err != nil {
			t.Fatal(err)
		}
		n, _ := countKeys(t, gcClient.Etcd(), fmt.Sprintf("%sid/%d", p, old))
		return n == 0
	})
	want := old + 1
	if want > 65535 {
		want = old - 1
	}
	renumbered, _, err := b.id.AcquirePreferred(ctx, ls, want)
	if err != nil || renumbered == old {
		t.Fatalf("b numbered the labels %d, %v; want a number other than %d", renumbered, err, old)
	}
	proxy.Restore()
	testutil.Eventually(t, "a reaches etcd again: its old number cannot come back", func() bool {
		_, ok := a.c.Lease()
		return ok && a.c.Health().Healthy
	})
	assertIdentity(t, gcClient.Etcd(), p, renumbered, ls, "renum-b")

	// The identity actor's renumbering: the store's number first (the
	// answer to its Acquire), then the release of the old one.
	if got, _, err := a.id.Acquire(ctx, ls); err != nil || got != renumbered {
		t.Fatalf("a acquires the labels: %d, %v; want %d", got, err, renumbered)
	}
	if err := a.id.Release(ctx, old); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "a's reference to the store's number", func() bool {
		n, _ := countKeys(t, gcClient.Etcd(), ref)
		return n == 1
	})
	if n := a.id.Held(); n != 1 {
		t.Fatalf("a holds %d numbers, want 1", n)
	}
	assertIdentity(t, gcClient.Etcd(), p, renumbered, ls, "renum-a")
	// The reference keeps the identity through a collection pass.
	if _, err := gc.CollectGarbage(ctx); err != nil {
		t.Fatal(err)
	}
	assertIdentity(t, gcClient.Etcd(), p, renumbered, ls, "renum-a")
}
