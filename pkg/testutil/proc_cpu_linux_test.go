package testutil

import (
	"os"
	"syscall"
	"testing"
	"time"
)

// TestProcessCPU: this process's CPU read from /proc agrees with
// getrusage (to /proc's 10 ms ticks), also while it grows.
func TestProcessCPU(t *testing.T) {
	before, err := ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for r0 := rusageCPU(t); rusageCPU(t)-r0 < 100*time.Millisecond; {
		_ = sha(time.Now()) // busy until getrusage counted 100 ms
	}
	after, err := ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	rusage := rusageCPU(t)
	if after-before < 80*time.Millisecond {
		t.Errorf("/proc's CPU grew %v while getrusage's grew 100 ms", after-before)
	}
	if d := rusage - after; d < -20*time.Millisecond || d > 100*time.Millisecond {
		t.Errorf("/proc says %v, getrusage %v", after, rusage)
	}
	if _, err := ProcessCPU(1 << 30); err == nil {
		t.Error("a process that does not exist has a CPU time")
	}
}

func rusageCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func sha(t time.Time) uint64 {
	x := uint64(t.UnixNano())
	for range 1000 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	return x
}
