package restore

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// TestHealthFailAndRecover: a write failing with EIO makes the directory
// unhealthy (cause io-error) and refuses writes without touching the
// disk; a removal that failed is remembered, and once the probe
// succeeds the removal is retried before the directory is healthy again.
// A retry that fails keeps it unhealthy.
func TestHealthFailAndRecover(t *testing.T) {
	retries := make(chan []endpoint.ID, 4)
	failRetry := true
	changes := make(chan Health, 8)
	h := newHealth(t.TempDir(), func(ids []endpoint.ID) error {
		retries <- slices.Sorted(slices.Values(ids))
		if failRetry {
			failRetry = false
			return fmt.Errorf("remove: %w", unix.EIO)
		}
		return nil
	})
	defer h.close()
	h.mu.Lock()
	h.onChange = func(hl Health) { changes <- hl }
	h.mu.Unlock()

	if err := h.refusal(); err != nil {
		t.Fatalf("refusal while healthy: %v", err)
	}
	h.remember(7)
	h.remember(3)
	h.forget(7) // a new write for 7 supersedes its failed removal
	h.fail(fmt.Errorf("append: %w", unix.EIO))
	if got := recv(t, changes); got.OK || got.Cause != CauseIOError {
		t.Fatalf("first change = %+v, want unhealthy io-error", got)
	}
	if err := h.refusal(); !errors.Is(err, unix.EIO) {
		t.Fatalf("refusal while failing I/O = %v, want EIO", err)
	}
	// The probe succeeds (a writable temp dir); the first retry fails
	// (the directory stays unhealthy), the second succeeds.
	if ids := recv(t, retries); !slices.Equal(ids, []endpoint.ID{3}) {
		t.Fatalf("retried removals %v, want [3]", ids)
	}
	if ids := recv(t, retries); !slices.Equal(ids, []endpoint.ID{3}) {
		t.Fatalf("removals retried again %v, want [3]", ids)
	}
	if got := recv(t, changes); !got.OK {
		t.Fatalf("change after the retry = %+v, want healthy", got)
	}
	if err := h.refusal(); err != nil {
		t.Fatalf("refusal after recovery: %v", err)
	}
	if Cause(fmt.Errorf("x: %w", unix.EROFS)) != CauseReadOnly || Cause(unix.EDQUOT) != CauseDiskFull || Cause(errors.New("x")) != CauseFailing {
		t.Fatal("Cause misclassifies")
	}
}

// recv receives from ch, failing the test if nothing comes within a
// bound far beyond the probe interval (a hang, not a timing check).
func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatal("nothing received")
		panic("unreachable")
	}
}
