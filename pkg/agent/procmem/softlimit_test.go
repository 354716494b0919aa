package procmem

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

const mib = 1 << 20

func gcCycles() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestSoftLimitSet: a limit above what the heap needs is the runtime's
// memory limit as asked; 0 removes it.
func TestSoftLimitSet(t *testing.T) {
	t.Cleanup(func() { SetSoftLimit(0) })
	SetSoftLimit(512 * mib)
	if got := debug.SetMemoryLimit(-1); got != 512*mib {
		t.Fatalf("memory limit %d, want %d", got, 512*mib)
	}
	if applied, _ := SoftLimit(); applied != 512*mib {
		t.Fatalf("SoftLimit() = %d, want %d", applied, 512*mib)
	}
	SetSoftLimit(0)
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("memory limit %d after SetSoftLimit(0), want none", got)
	}
}

// TestSoftLimitFollowsLiveHeap: a live heap larger than the limit raises
// the limit after the next collection to at least the live heap plus
// MinGCPercent of it, so allocating garbage costs collections as at
// GOGC=50 (at most 8 per 256 MiB with 64 MiB live; 4 here) and not
// back to back, as Go's memory limit alone would (28 here); when the heap shrinks the limit comes back
// down to the one asked for.
func TestSoftLimitFollowsLiveHeap(t *testing.T) {
	t.Cleanup(func() { SetSoftLimit(0) })
	defer debug.SetGCPercent(debug.SetGCPercent(200))
	SetSoftLimit(8 * mib)
	live := make([][]byte, 64)
	for i := range live {
		live[i] = make([]byte, mib)
		live[i][0] = 1
	}
	// A collection per try: the finalizer that recomputes the limit may
	// still be queued from an earlier cycle, re-arming after this one.
	testutil.Eventually(t, "the limit raised to the live heap's floor after a collection", func() bool {
		runtime.GC()
		applied, _ := SoftLimit()
		return applied >= 96*mib
	})
	if applied, _ := SoftLimit(); debug.SetMemoryLimit(-1) != applied {
		t.Fatalf("runtime's memory limit %d MiB, SoftLimit %d MiB; want the same", debug.SetMemoryLimit(-1)>>20, applied>>20)
	}
	cycles := gcCycles()
	var sink []byte
	for range 256 * 4 {
		sink = make([]byte, 256<<10)
		sink[0] = 1
	}
	_ = sink
	if n := gcCycles() - cycles; n > 12 {
		t.Fatalf("%d collections while allocating 256 MiB with 64 MiB live, want at most 12", n)
	}
	runtime.KeepAlive(live)
	live = nil
	testutil.Eventually(t, "the limit lowered after the live heap went", func() bool {
		runtime.GC()
		applied, _ := SoftLimit()
		return applied < 64*mib
	})
}
