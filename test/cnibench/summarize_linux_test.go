package cnibench

import (
	"testing"
	"time"
)

// TestSummarizeNearestRank: the quantiles are nearest-rank: of 1..n ms,
// the p50 is ceil(n/2) ms and the p99 ceil(0.99n) ms.
func TestSummarizeNearestRank(t *testing.T) {
	for _, c := range []struct {
		n             int
		p50, p99, max time.Duration
	}{
		{1, 1, 1, 1},
		{100, 50, 99, 100},
		{200, 100, 198, 200},
		{101, 51, 100, 101},
	} {
		ds := make([]time.Duration, c.n)
		for i := range ds {
			ds[c.n-1-i] = time.Duration(i+1) * time.Millisecond // reversed: summarize sorts
		}
		got := summarize(ds)
		want := stats{c.p50 * time.Millisecond, c.p99 * time.Millisecond, c.max * time.Millisecond}
		if got != want {
			t.Errorf("n=%d: got %+v, want %+v", c.n, got, want)
		}
	}
}
