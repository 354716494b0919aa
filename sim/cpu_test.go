package sim

import (
	"math"
	"testing"
	"time"
)

func TestCPUPerLifecycle(t *testing.T) {
	for _, tc := range []struct {
		name       string
		s          [2]cpuSample
		lifecycles uint64
		ms, gc     float64
	}{
		{"two seconds over 1000", [2]cpuSample{{time.Second, 0, time.Second}, {3 * time.Second, time.Second, 5 * time.Second}}, 1000, 2, 0.25},
		{"no lifecycles", [2]cpuSample{{0, 0, 0}, {time.Second, 0, 0}}, 0, 0, 0},
		{"unmeasured", [2]cpuSample{}, 10, 0, 0},
	} {
		ms, gc := cpuPerLifecycle(tc.s, tc.lifecycles)
		if math.Abs(ms-tc.ms) > 1e-9 || math.Abs(gc-tc.gc) > 1e-9 {
			t.Errorf("%s: cpuPerLifecycle = %v ms, %v GC; want %v, %v", tc.name, ms, gc, tc.ms, tc.gc)
		}
	}
	if s := sampleCPU(); s.process <= 0 {
		t.Errorf("sampleCPU() = %+v: no process CPU time", s)
	}
}
