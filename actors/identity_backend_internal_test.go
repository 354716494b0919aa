package actors

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// unreachableReleases is a backend whose Release always fails (the store
// unreachable) and whose Acquire answers at once.
type unreachableReleases struct{ releases atomic.Int32 }

func (b *unreachableReleases) Acquire(context.Context, labels.Labels) (identity.NumericIdentity, bool, error) {
	return 4242, false, nil
}

func (b *unreachableReleases) Release(context.Context, identity.NumericIdentity) error {
	b.releases.Add(1)
	return errors.New("store unreachable")
}

func (b *unreachableReleases) Watch(ctx context.Context, _ func(identity.ClusterEvent)) error {
	<-ctx.Done()
	return nil
}

func (b *unreachableReleases) Status() identity.ClusterStatus { return identity.ClusterStatus{} }
func (b *unreachableReleases) Close() error                   { return nil }

// TestReleaseGivesWayToAcquire: a Release retrying against an unreachable
// store stops once an Acquire of its label set is queued behind it on the
// same worker, instead of making the Acquire (and the endpoint waiting
// for it) sit out the retries (TestProvisionalIdentityRecreated's
// timeouts under load). The backoff here is an hour: without the rule
// the Acquire's answer never comes within the test's bound.
func TestReleaseGivesWayToAcquire(t *testing.T) {
	b := &unreachableReleases{}
	msgs := make(chan any, 16)
	w := newBackendWorkers(b, ClusterIdentityConfig{CallTimeout: time.Second, RetryMin: time.Hour, RetryMax: time.Hour,
		Attempts: 20, Workers: 1, Queue: 8}, func(m any) { msgs <- m }, slog.New(slog.DiscardHandler))
	t.Cleanup(w.stop)
	ls, err := labels.ParseSet([]string{"k8s:app=give-way"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.release(4242, ls); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the release's first attempt", func() bool { return b.releases.Load() == 1 })
	if err := w.acquire(ls, 0); err != nil {
		t.Fatal(err)
	}
	var released *clusterReleased
	var acquired *clusterAcquired
	deadline := time.After(testutil.EventuallyBound)
	for released == nil || acquired == nil {
		select {
		case m := <-msgs:
			switch m := m.(type) {
			case *clusterReleased:
				released = m
			case *clusterAcquired:
				if released == nil {
					t.Fatal("the Acquire answered before the Release it was queued behind")
				}
				acquired = m
			}
		case <-deadline:
			t.Fatalf("after %v: released %v, acquired %v: the Acquire waits out the Release's retries", testutil.EventuallyBound, released, acquired)
		}
	}
	if released.err == nil || acquired.err != nil || acquired.id != 4242 {
		t.Fatalf("released %+v, acquired %+v: want the release given up and the acquire answered", released, acquired)
	}
	if n := b.releases.Load(); n != 1 {
		t.Fatalf("%d Release calls, want 1: a queued Acquire ends the retries", n)
	}
}
