package ipam

import (
	"errors"
	"math/bits"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// harness applies operations to a Range and to a map model of it, and
// checks after each one that both agree.
type harness struct {
	tb    testing.TB
	r     *Range
	model map[netip.Addr]string // keyed by unmapped address
	// candidates are the addresses operations pick from: every address of
	// the prefix, a few on either side, one of the other family, the
	// invalid Addr and (IPv4) a v4-mapped form.
	candidates []netip.Addr
	// seen counts the outcomes observed, keyed by sentinel error (nil for
	// success), so tests can check that every path was exercised.
	seen map[error]int
}

// harnessOwners are the owners operations pick from; few, so that the same
// owner often allocates an address twice.
var harnessOwners = [...]string{"o0", "o1", "o2", "o3"}

func newHarness(tb testing.TB, r *Range) *harness {
	tb.Helper()
	h := &harness{tb: tb, r: r, model: make(map[netip.Addr]string), seen: make(map[error]int)}
	first := r.Prefix().Addr()
	for range 4 {
		first = first.Prev()
	}
	for ip := first; ; ip = ip.Next() {
		h.candidates = append(h.candidates, ip)
		if ip == lastAddr(r.Prefix()).Next().Next().Next().Next() {
			break
		}
	}
	h.candidates = append(h.candidates, netip.Addr{})
	if r.Family() == IPv4 {
		h.candidates = append(h.candidates, netip.MustParseAddr("fd00::5"),
			netip.AddrFrom16(r.Gateway().Next().As16()))
	} else {
		h.candidates = append(h.candidates, netip.MustParseAddr("10.0.0.5"))
	}
	return h
}

// step applies operation op with argument arg.
func (h *harness) step(op, arg uint8) {
	h.tb.Helper()
	ip := h.candidates[int(arg)%len(h.candidates)]
	owner := harnessOwners[arg%uint8(len(harnessOwners))]
	switch op % 4 {
	case 0:
		h.allocateNext(owner)
	case 1:
		h.allocate(ip, owner)
	case 2:
		want, wantOK := h.model[ip.Unmap()]
		got, ok := h.r.Release(ip)
		if got != want || ok != wantOK {
			h.tb.Fatalf("Release(%s) = %q, %v; model %q, %v", ip, got, ok, want, wantOK)
		}
		delete(h.model, ip.Unmap())
	case 3:
		want, wantOK := h.model[ip.Unmap()]
		if got, ok := h.r.Owner(ip); got != want || ok != wantOK {
			h.tb.Fatalf("Owner(%s) = %q, %v; model %q, %v", ip, got, ok, want, wantOK)
		}
	}
	checkCounts(h.tb, h.r, len(h.model))
	h.checkBitmap()
}

func (h *harness) allocateNext(owner string) {
	h.tb.Helper()
	ip, err := h.r.AllocateNext(owner)
	if len(h.model) == h.r.Size() {
		if !errors.Is(err, ErrExhausted) {
			h.tb.Fatalf("AllocateNext on full range = %s, %v; want ErrExhausted", ip, err)
		}
		h.seen[ErrExhausted]++
		return
	}
	if err != nil {
		h.tb.Fatalf("AllocateNext with %d/%d used: %v", len(h.model), h.r.Size(), err)
	}
	if _, dup := h.model[ip]; dup || isReserved(h.r, ip) || !h.r.Prefix().Contains(ip) {
		h.tb.Fatalf("AllocateNext = %s: duplicate %v, reserved %v", ip, dup, isReserved(h.r, ip))
	}
	h.model[ip] = owner
}

func (h *harness) allocate(ip netip.Addr, owner string) {
	h.tb.Helper()
	u := ip.Unmap()
	cur, taken := h.model[u]
	var want error
	switch {
	case !h.r.Prefix().Contains(u):
		want = ErrOutOfRange
	case isReserved(h.r, u):
		want = ErrReserved
	case taken && cur != owner:
		want = ErrAllocated
	}
	err := h.r.Allocate(ip, owner)
	if !errors.Is(err, want) || (err == nil) != (want == nil) {
		h.tb.Fatalf("Allocate(%s, %q) = %v, want %v (model owner %q, %v)", ip, owner, err, want, cur, taken)
	}
	h.seen[want]++
	if err == nil {
		h.model[u] = owner
	}
}

// checkBitmap checks the internal invariant: the set bits are exactly the
// allocations plus the reserved and padding bits.
func (h *harness) checkBitmap() {
	h.tb.Helper()
	ones := 0
	for _, w := range h.r.bitmap {
		ones += bits.OnesCount64(w)
	}
	fixed := len(h.r.bitmap)*64 - h.r.Size()
	if ones != fixed+len(h.r.owners) {
		h.tb.Fatalf("bitmap has %d bits set, want %d reserved/padding + %d allocated", ones, fixed, len(h.r.owners))
	}
}

func TestRangeMatchesModel(t *testing.T) {
	tests := []struct {
		cidr     string
		strategy Strategy
	}{
		{"10.0.0.64/26", Sequential},
		{"10.0.0.64/26", Random},
		{"10.9.0.0/25", Sequential},
		{"192.168.0.0/30", Random},
		{"fd00::100/120", Sequential},
		{"fd00::100/122", Random},
	}
	const ops = 10000
	for _, tt := range tests {
		t.Run(tt.cidr+"/"+tt.strategy.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, 11))
			h := newHarness(t, newTestRange(t, tt.cidr, tt.strategy, 3))
			for i := range ops {
				// Bias towards allocation in the first half of the run
				// and release in the second, so the range both fills
				// up and drains.
				op := uint8(rng.IntN(4))
				if rng.IntN(3) == 0 {
					op = 2 // release
					if i < ops/2 {
						op = 0 // allocate next
					}
				}
				h.step(op, uint8(rng.UintN(256)))
				if i%100 == 0 {
					checkModel(t, h.r, h.model)
				}
			}
			checkModel(t, h.r, h.model)
			for _, e := range []error{nil, ErrExhausted, ErrOutOfRange, ErrReserved, ErrAllocated} {
				if h.seen[e] == 0 {
					t.Errorf("%d ops never produced outcome %v", ops, e)
				}
			}
		})
	}
}

func FuzzRange(f *testing.F) {
	f.Add([]byte{0})
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 2, 6, 0, 0})
	f.Add([]byte{0, 1, 7, 1, 7, 1, 8, 2, 7, 3, 7, 0, 0})
	f.Add([]byte{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6})
	full := []byte{0}
	for range 70 {
		full = append(full, 0, 1)
	}
	f.Add(full)
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		strategy := Strategy(data[0] % 2)
		h := newHarness(t, newTestRange(t, "10.0.0.64/26", strategy, uint64(data[0])))
		data = data[1:]
		for len(data) >= 2 {
			h.step(data[0], data[1])
			checkModel(t, h.r, h.model)
			data = data[2:]
		}
	})
}
