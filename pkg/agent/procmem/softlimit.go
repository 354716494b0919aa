package procmem

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// MinGCPercent bounds what a soft limit (SetSoftLimit) costs in CPU: the
// limit is raised so that the heap may always grow by at least this
// share of the live heap between two collections, as with GOGC=50, however
// large the live heap becomes. Go's own memory limit has no such floor: a
// live heap near the limit makes the collector run back to back (capped at
// half the CPU).
const MinGCPercent = 50

// softLimit is the process's one soft limit (SetSoftLimit).
var softLimit struct {
	// want is the limit asked for (0: none); applied the effective
	// one last set.
	want, applied atomic.Int64
	// adjusts counts the recomputations (one per collection).
	adjusts atomic.Uint64
	once    sync.Once
	mu      sync.Mutex // serialises adjust
	samples []metrics.Sample
}

// The runtime/metrics the effective limit is computed from.
var softLimitMetrics = []string{
	"/gc/heap/live:bytes",
	"/memory/classes/total:bytes",
	"/memory/classes/heap/released:bytes",
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/free:bytes",
}

// SetSoftLimit keeps the Go runtime's memory (what runtime/debug's memory
// limit counts: everything the runtime mapped and did not return) near
// limit bytes: the collector runs earlier than the GC percentage asks
// when the heap would grow past it, and the scavenger returns freed pages
// to the kernel. After every collection the limit actually set is
// recomputed as the larger of limit and what the live heap needs with
// MinGCPercent headroom (plus the runtime's memory outside the heap), so
// a live heap that outgrows limit costs collections as at GOGC=50 and
// never a collector running back to back. limit <= 0 removes the limit.
// Process-wide (debug.SetMemoryLimit): the last call wins.
func SetSoftLimit(limit int64) {
	softLimit.want.Store(max(limit, 0))
	softLimit.once.Do(func() {
		softLimit.samples = make([]metrics.Sample, len(softLimitMetrics))
		for i, name := range softLimitMetrics {
			softLimit.samples[i].Name = name
		}
		armSoftLimit()
	})
	adjustSoftLimit()
}

// SoftLimit is the memory limit SetSoftLimit last set (0: none) and how
// many times it was recomputed.
func SoftLimit() (applied int64, adjusts uint64) {
	return softLimit.applied.Load(), softLimit.adjusts.Load()
}

// gcSentinel is unreachable from its creation: its finalizer runs once
// per collection (re-arming itself), the hook that recomputes the limit.
type gcSentinel struct{ _ *byte } // a pointer: never a tiny allocation, whose finalizer may not run

func armSoftLimit() {
	runtime.SetFinalizer(&gcSentinel{}, onGC)
}

func onGC(s *gcSentinel) {
	adjustSoftLimit()
	runtime.SetFinalizer(s, onGC)
}

// adjustSoftLimit sets the effective limit from the live heap of the last
// collection.
func adjustSoftLimit() {
	softLimit.mu.Lock()
	defer softLimit.mu.Unlock()
	softLimit.adjusts.Add(1)
	want := softLimit.want.Load()
	if want == 0 {
		if softLimit.applied.Swap(0) != 0 {
			debug.SetMemoryLimit(math.MaxInt64)
		}
		return
	}
	metrics.Read(softLimit.samples)
	v := func(i int) int64 {
		if softLimit.samples[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return int64(min(softLimit.samples[i].Value.Uint64(), math.MaxInt64))
	}
	live, total, released, objects, free := v(0), v(1), v(2), v(3), v(4)
	// What the runtime counts against the limit besides the heap's
	// objects (mgcpacer.go, memoryLimitHeapGoal): stacks, GC metadata,
	// its own structures and the unused parts of the heap's spans.
	outside := max(total-released-objects-free, 0)
	need := outside + live + live*MinGCPercent/100
	// The runtime keeps 3% of the limit (at least 1 MiB) below it.
	eff := max(want, need+max(need/25, 1<<20))
	if softLimit.applied.Swap(eff) != eff {
		debug.SetMemoryLimit(eff)
	}
}
