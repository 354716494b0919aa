package ipam

import (
	"math/rand/v2"
	"net/netip"
	"runtime"
	"testing"
)

// newTestRange returns a Range over cidr; Random ranges get an rng seeded
// with seed so that runs are reproducible.
func newTestRange(tb testing.TB, cidr string, s Strategy, seed uint64) *Range {
	tb.Helper()
	r, err := NewRange(netip.MustParsePrefix(cidr), s, rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)))
	if err != nil {
		tb.Fatalf("NewRange(%s, %v): %v", cidr, s, err)
	}
	return r
}

// mustAllocateNext calls AllocateNext and fails the test on error.
func mustAllocateNext(tb testing.TB, r *Range, owner string) netip.Addr {
	tb.Helper()
	ip, err := r.AllocateNext(owner)
	if err != nil {
		tb.Fatalf("AllocateNext(%q) in %s: %v", owner, r.Prefix(), err)
	}
	return ip
}

// checkCounts fails the test unless Used equals used and Used+Free equals
// Size.
func checkCounts(tb testing.TB, r *Range, used int) {
	tb.Helper()
	if got := r.Used(); got != used {
		tb.Errorf("Used() = %d, want %d", got, used)
	}
	if r.Used()+r.Free() != r.Size() {
		tb.Errorf("Used()+Free() = %d+%d, want Size() = %d", r.Used(), r.Free(), r.Size())
	}
}

// checkModel fails the test unless r's allocations are exactly model's, in
// address order, and the counters agree with it.
func checkModel(tb testing.TB, r *Range, model map[netip.Addr]string) {
	tb.Helper()
	checkCounts(tb, r, len(model))
	allocs := r.Allocations()
	if len(allocs) != len(model) {
		tb.Fatalf("len(Allocations()) = %d, want %d", len(allocs), len(model))
	}
	for i, a := range allocs {
		if i > 0 && !allocs[i-1].IP.Less(a.IP) {
			tb.Fatalf("Allocations() not sorted: %s before %s", allocs[i-1].IP, a.IP)
		}
		if want, ok := model[a.IP]; !ok || want != a.Owner {
			tb.Fatalf("Allocations() has %s owned by %q, model has %q (present %v)", a.IP, a.Owner, want, ok)
		}
	}
}

// isReserved reports whether ip is the network, gateway or (IPv4) broadcast
// address of r, computed independently of the Range's internals.
func isReserved(r *Range, ip netip.Addr) bool {
	network := r.Prefix().Addr()
	if ip == network || ip == network.Next() {
		return true
	}
	if r.Family() == IPv4 {
		return ip == lastAddr(r.Prefix())
	}
	return false
}

// lastAddr returns the last address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As16()
	hostBits := p.Addr().BitLen() - p.Bits()
	for i := 15; hostBits > 0; i-- {
		n := min(hostBits, 8)
		a[i] |= byte(1<<n - 1)
		hostBits -= n
	}
	ip := netip.AddrFrom16(a)
	if p.Addr().Is4() {
		return ip.Unmap()
	}
	return ip
}

// testingAllocBytes returns the bytes allocated on the heap while fn runs.
func testingAllocBytes(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
