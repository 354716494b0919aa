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
