package testutil

import "runtime"

// GoroutinesAndHeap is the process's goroutine count and live heap
// after a GC: what a fault test samples to show growth is bounded (the
// agent under test runs in the test's process).
func GoroutinesAndHeap() (int, uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return runtime.NumGoroutine(), ms.HeapAlloc
}

// Mean is the mean of v (0 when empty).
func Mean(v []int) float64 {
	if len(v) == 0 {
		return 0
	}
	s := 0
	for _, x := range v {
		s += x
	}
	return float64(s) / float64(len(v))
}

// MiB converts byte counts to whole MiB, for logs.
func MiB(v []uint64) []uint64 {
	out := make([]uint64, len(v))
	for i, x := range v {
		out[i] = x >> 20
	}
	return out
}
