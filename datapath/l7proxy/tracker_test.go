package l7proxy

import (
	"slices"
	"sync"
	"testing"
)

type ackLog struct {
	mu          sync.Mutex
	acks, nacks []waitKey
}

func (l *ackLog) tracker() *Tracker {
	return NewTracker(func(ep, rev uint64) {
		l.mu.Lock()
		l.acks = append(l.acks, waitKey{ep, rev})
		l.mu.Unlock()
	}, func(ep, rev uint64, _ string) {
		l.mu.Lock()
		l.nacks = append(l.nacks, waitKey{ep, rev})
		l.mu.Unlock()
	})
}

func sortKeys(ks []waitKey) []waitKey {
	slices.SortFunc(ks, func(a, b waitKey) int { return int(a.ep) - int(b.ep) })
	return ks
}

func TestTrackerAckNack(t *testing.T) {
	var l ackLog
	tr := l.tracker()
	mustWait := func(ep, rev, v uint64, want bool) {
		t.Helper()
		got, err := tr.Wait(ep, rev, v)
		if err != nil || got != want {
			t.Fatalf("Wait(%d, %d, v%d) = %v, %v; want %v", ep, rev, v, got, err, want)
		}
	}
	mustWait(1, 1, 3, true)
	mustWait(2, 1, 4, true)
	mustWait(3, 1, 6, true)
	tr.Ack(4) // covers v3 and v4
	if want := []waitKey{{1, 1}, {2, 1}}; !slices.Equal(sortKeys(l.acks), want) {
		t.Fatalf("acks = %v, want %v", l.acks, want)
	}
	mustWait(4, 1, 2, false) // already acknowledged
	mustWait(3, 2, 7, true)  // a newer revision replaces ep 3's wait
	tr.Nack(6, "bad regexp")
	if len(l.nacks) != 0 {
		t.Fatalf("nack of v6 failed %v; ep 3 now waits for v7 only", l.nacks)
	}
	tr.Nack(7, "bad regexp")
	if want := []waitKey{{3, 2}}; !slices.Equal(l.nacks, want) {
		t.Fatalf("nacks = %v, want %v", l.nacks, want)
	}
	mustWait(5, 1, 8, true)
	tr.Forget(5)
	tr.Ack(9)
	if len(l.acks) != 2 {
		t.Errorf("forgotten wait acknowledged: %v", l.acks)
	}
	if st := tr.Status(); st.Acked != 9 || st.Pending != 0 || st.Nacks != 2 || st.LastNack != "bad regexp" {
		t.Errorf("status = %+v", st)
	}
}

// TestTrackerEndpoints: the per-endpoint status names each endpoint's
// configuration version and whether the proxy acknowledged it.
func TestTrackerEndpoints(t *testing.T) {
	var l ackLog
	tr := l.tracker()
	if _, err := tr.Wait(1, 10, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Wait(2, 10, 5); err != nil {
		t.Fatal(err)
	}
	tr.Ack(4)
	want := []EndpointAck{{Endpoint: 1, Version: 3, Acked: true}, {Endpoint: 2, Version: 5}}
	if got := tr.Status().Endpoints; !slices.Equal(got, want) {
		t.Errorf("Status().Endpoints = %+v, want %+v", got, want)
	}
	if got, ok := tr.Endpoint(2); !ok || got != want[1] {
		t.Errorf("Endpoint(2) = %+v %v, want %+v", got, ok, want[1])
	}
	tr.Forget(2)
	if _, ok := tr.Endpoint(2); ok || len(tr.Status().Endpoints) != 1 {
		t.Errorf("after Forget(2): still listed")
	}
}
