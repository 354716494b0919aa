package actors

import (
	"bytes"
	"runtime"
	"sync"
	"testing"
	"time"
)

// goroutineID parses the running goroutine's number from its stack header.
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	f := bytes.Fields(buf)
	if len(f) < 2 {
		return ""
	}
	return string(f[1])
}

func TestWorkerDispatcherRunsEverything(t *testing.T) {
	d := newWorkerDispatcher(10, time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	ran := 0
	for range 1000 {
		wg.Add(1)
		d.Schedule(func() {
			defer wg.Done()
			mu.Lock()
			ran++
			mu.Unlock()
		})
	}
	wg.Wait()
	if ran != 1000 {
		t.Errorf("ran %d of 1000 scheduled runs", ran)
	}
	if d.Throughput() != 10 {
		t.Errorf("Throughput() = %d, want 10", d.Throughput())
	}
}

// TestWorkerDispatcherReusesAndExits: runs one after the other share
// goroutines; idle goroutines exit.
func TestWorkerDispatcherReusesAndExits(t *testing.T) {
	before := runtime.NumGoroutine()
	d := newWorkerDispatcher(10, 200*time.Millisecond)
	ids := map[string]bool{}
	for range 20 {
		done := make(chan string)
		d.Schedule(func() { done <- goroutineID() })
		ids[<-done] = true
		time.Sleep(5 * time.Millisecond) // let the goroutine wait for work again
	}
	if len(ids) > 10 {
		t.Errorf("20 runs one after the other used %d goroutines", len(ids))
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left after the idle time, %d before", runtime.NumGoroutine(), before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
