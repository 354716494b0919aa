package ipam

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

func BenchmarkAllocateRelease(b *testing.B) {
	for _, s := range []Strategy{Sequential, Random} {
		b.Run(s.String(), func(b *testing.B) {
			r := newTestRange(b, "10.0.0.0/16", s, 1)
			b.ReportAllocs()
			for b.Loop() {
				ip, err := r.AllocateNext("owner")
				if err != nil {
					b.Fatal(err)
				}
				r.Release(ip)
			}
		})
	}
}

// BenchmarkAllocateNearlyFull measures AllocateNext+Release on a /16 with 99%
// of its addresses used, and with a single free address (the worst case: a
// scan of all 1024 words).
func BenchmarkAllocateNearlyFull(b *testing.B) {
	tests := []struct {
		name     string
		strategy Strategy
		free     int
	}{
		{"sequential/99pct", Sequential, 655},
		{"random/99pct", Random, 655},
		{"sequential/one-free", Sequential, 1},
		{"random/one-free", Random, 1},
	}
	for _, tt := range tests {
		b.Run(tt.name, func(b *testing.B) {
			r := fillAllBut(b, tt.strategy, tt.free)
			b.ReportAllocs()
			for b.Loop() {
				ip, err := r.AllocateNext("owner")
				if err != nil {
					b.Fatal(err)
				}
				r.Release(ip)
			}
		})
	}
}

// fillAllBut returns a full 10.0.0.0/16 Range with free random addresses
// released again.
func fillAllBut(tb testing.TB, s Strategy, free int) *Range {
	tb.Helper()
	r := newTestRange(tb, "10.0.0.0/16", s, 1)
	for r.Free() > 0 {
		mustAllocateNext(tb, r, "filler")
	}
	rng := rand.New(rand.NewPCG(2, 3))
	for r.Free() < free {
		var a [4]byte
		a[0], a[1], a[2], a[3] = 10, 0, byte(rng.UintN(256)), byte(rng.UintN(256))
		r.Release(netip.AddrFrom4(a))
	}
	return r
}
