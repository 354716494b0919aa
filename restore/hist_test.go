package restore

import (
	"testing"
	"time"
)

// TestHist: every duration falls in a bucket whose bound is at least it
// and within 25% above it (or 1 µs), and quantiles come out in order.
func TestHist(t *testing.T) {
	for us := int64(0); us < 1<<22; us = us*9/8 + 1 {
		d := time.Duration(us) * time.Microsecond
		ub := bucketMax(histBucket(d))
		if ub < d || ub > d*5/4+time.Microsecond {
			t.Fatalf("%v in a bucket up to %v", d, ub)
		}
	}
	var h Hist
	for i := range 100 {
		h.Add(time.Duration(i+1) * time.Millisecond)
	}
	if p50, p99 := h.Quantile(0.5), h.Quantile(0.99); p50 < 50*time.Millisecond || p50 > 63*time.Millisecond || p99 < 99*time.Millisecond || p99 > 125*time.Millisecond {
		t.Fatalf("p50 %v, p99 %v of 1..100 ms", p50, p99)
	}
	if (Hist{}).Quantile(0.5) != 0 {
		t.Fatal("quantile of nothing")
	}
}
