package sim

import (
	"runtime/metrics"
	"time"
)

// cpuSample is the process's CPU time and the Go runtime's CPU classes
// (estimates, comparable only with each other) at one moment.
type cpuSample struct {
	process time.Duration
	// gc, busy: the runtime's estimates of the CPU time its garbage
	// collector used and of all CPU time it used (total minus idle).
	gc, busy time.Duration
}

var cpuMetrics = []string{"/cpu/classes/gc/total:cpu-seconds", "/cpu/classes/total:cpu-seconds", "/cpu/classes/idle:cpu-seconds"}

func sampleCPU() cpuSample {
	s := make([]metrics.Sample, len(cpuMetrics))
	for i, name := range cpuMetrics {
		s[i].Name = name
	}
	metrics.Read(s)
	v := make([]time.Duration, len(s))
	for i := range s {
		if s[i].Value.Kind() == metrics.KindFloat64 {
			v[i] = time.Duration(s[i].Value.Float64() * float64(time.Second))
		}
	}
	return cpuSample{process: processCPU(), gc: v[0], busy: v[1] - v[2]}
}

// cpuPerLifecycle returns the CPU milliseconds per lifecycle between two
// samples and the garbage collector's share of the CPU time the runtime
// used (zeros when unmeasured).
func cpuPerLifecycle(s [2]cpuSample, lifecycles uint64) (ms, gcFraction float64) {
	if cpu := s[1].process - s[0].process; cpu > 0 && lifecycles > 0 {
		ms = float64(cpu.Microseconds()) / 1000 / float64(lifecycles)
	}
	if busy := s[1].busy - s[0].busy; busy > 0 {
		gcFraction = min(1, float64(s[1].gc-s[0].gc)/float64(busy))
	}
	return ms, gcFraction
}
