package restore

import (
	"math"
	"math/bits"
	"time"
)

// Hist counts durations in log-linear buckets (four per power of two of
// microseconds: a quantile read from it is within 25%), for the tails the
// means in Stats hide.
type Hist [112]uint64

func histBucket(d time.Duration) int {
	us := uint64(max(d.Microseconds(), 0))
	if us < 4 {
		return int(us)
	}
	e := bits.Len64(us) - 1
	b := 4*(e-1) + int((us>>(e-2))&3)
	return min(b, len(Hist{})-1)
}

// bucketMax is the upper bound of bucket b.
func bucketMax(b int) time.Duration {
	if b < 4 {
		return time.Duration(b+1) * time.Microsecond
	}
	e, m := b/4+1, b%4
	return time.Duration(uint64(5+m)<<(e-2)) * time.Microsecond
}

// Add counts d.
func (h *Hist) Add(d time.Duration) { h[histBucket(d)]++ }

// Sub returns h minus an earlier snapshot of it.
func (h Hist) Sub(o Hist) Hist {
	for i := range h {
		h[i] -= o[i]
	}
	return h
}

// Quantile returns the upper bound of the bucket holding quantile q
// (0 <= q <= 1), or 0 when empty.
func (h Hist) Quantile(q float64) time.Duration {
	var n uint64
	for _, c := range h {
		n += c
	}
	if n == 0 {
		return 0
	}
	rank := max(uint64(math.Ceil(q*float64(n))), 1)
	var seen uint64
	for b, c := range h {
		if seen += c; seen >= rank {
			return bucketMax(b)
		}
	}
	return bucketMax(len(h) - 1)
}
