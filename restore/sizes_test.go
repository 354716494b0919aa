package restore

import (
	"runtime"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// TestSizeTable: every ID reads unknown until written, a write reads
// back (unknown and empty halves too) without touching other IDs, and
// the table costs its chunks, not 65,536 words, until IDs are written.
func TestSizeTable(t *testing.T) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	tab := newSizeTable()
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 16<<10 {
		t.Errorf("newSizeTable allocated %d bytes, want a few KiB (chunks on first write)", got)
	}
	for _, id := range []endpoint.ID{0, 1, 255, 256, endpoint.MaxID} {
		if cur, next := tab.get(id); cur != unknownSizes || next != unknownSizes {
			t.Errorf("fresh id %d: %#x %#x, want unknown", id, cur, next)
		}
	}
	cases := []struct {
		id        endpoint.ID
		cur, next dirSizes
	}{{7, sizesOf(make([]byte, 300), make([]byte, 40)), emptyDir}, {endpoint.MaxID, emptyDir, unknownSizes}, {300, unknownSizes, sizesOf(nil, make([]byte, 1<<20))}}
	for _, c := range cases {
		tab.set(c.id, c.cur, c.next)
	}
	for _, c := range cases {
		if cur, next := tab.get(c.id); cur != c.cur || next != c.next {
			t.Errorf("id %d: %#x %#x, want %#x %#x", c.id, cur, next, c.cur, c.next)
		}
	}
	if cur, next := tab.get(8); cur != unknownSizes || next != unknownSizes {
		t.Errorf("id 8 beside a written one: %#x %#x, want unknown", cur, next)
	}
	n := 0
	for i := range tab.chunks {
		if tab.chunks[i].Load() != nil {
			n++
		}
	}
	if n != 3 {
		t.Errorf("%d chunks allocated, want 3", n)
	}
}
