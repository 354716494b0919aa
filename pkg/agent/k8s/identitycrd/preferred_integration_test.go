package identitycrd_test

import (
	"context"
	"errors"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestAcquirePreferred: a label set no object holds is created with the
// preferred number when it is free; a label set an object holds keeps
// its number whatever is preferred; a preferred number held by other
// labels is skipped for the usual candidates; one outside the range is
// refused.
func TestAcquirePreferred(t *testing.T) {
	e := env(t)
	a, b := newBackend(t, e.Config, noGC(uniq("node-p"))), newBackend(t, e.Config, noGC(uniq("node-q")))
	ctx := context.Background()
	free := identity.NumericIdentity(0)
	for n := identity.NumericIdentity(61000); n < 62000; n++ { // the package's tests share one API server
		if getIdentity(t, e.Config, n) == nil {
			free = n
			break
		}
	}
	if free == 0 {
		t.Fatal("no free number in 61000..61999")
	}
	ls := mustLabels(t, "k8s:app="+uniq("preferred"))
	id, isNew, err := a.AcquirePreferred(ctx, ls, free)
	if err != nil || id != free || !isNew {
		t.Fatalf("new label set, free preferred %d: %d %t %v", free, id, isNew, err)
	}
	if mi := getIdentity(t, e.Config, free); mi == nil || keyOf(mi) != ls.Key() {
		t.Fatalf("object %d = %+v, want %s", free, mi, ls.Key())
	}
	// b's informer sees a's object first: an Acquire before that would
	// allocate b a number of its own for the same labels (the race the
	// cluster identity store resolves later, not this test's subject).
	testutil.Eventually(t, "b's cache to hold the label set", func() bool {
		_, ok := b.CachedUsageForTest(free)
		return ok
	})
	if id, _, err := b.Acquire(ctx, ls); err != nil || id != free {
		t.Fatalf("b acquiring the held label set: %d %v, want %d", id, err, free)
	}
	if id, isNew, err := b.AcquirePreferred(ctx, ls, free+1); err != nil || id != free || isNew {
		t.Fatalf("held label set, preferred %d: %d %t %v, want %d", free+1, id, isNew, err, free)
	}
	other := mustLabels(t, "k8s:app="+uniq("other"))
	if id, isNew, err := b.AcquirePreferred(ctx, other, free); err != nil || id == free || !isNew {
		t.Fatalf("preferred %d held by other labels: %d %t %v, want another new number", free, id, isNew, err)
	}
	for _, bad := range []identity.NumericIdentity{1, 70000} {
		if _, _, err := a.AcquirePreferred(ctx, ls, bad); !errors.Is(err, identity.ErrInvalidIdentity) {
			t.Errorf("preferred %d: %v, want ErrInvalidIdentity", bad, err)
		}
	}
}
