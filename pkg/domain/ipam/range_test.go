package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestNewRange(t *testing.T) {
	tests := []struct {
		name    string
		prefix  netip.Prefix
		want    string // masked prefix
		family  Family
		gateway string
		size    int
	}{
		{"v4 /30", netip.MustParsePrefix("10.0.0.0/30"), "10.0.0.0/30", IPv4, "10.0.0.1", 1},
		{"v4 /29", netip.MustParsePrefix("10.0.0.8/29"), "10.0.0.8/29", IPv4, "10.0.0.9", 5},
		{"v4 /24", netip.MustParsePrefix("192.168.7.0/24"), "192.168.7.0/24", IPv4, "192.168.7.1", 253},
		{"v4 /16", netip.MustParsePrefix("10.200.0.0/16"), "10.200.0.0/16", IPv4, "10.200.0.1", 65533},
		{"v4 /8", netip.MustParsePrefix("10.0.0.0/8"), "10.0.0.0/8", IPv4, "10.0.0.1", 1<<24 - 3},
		{"v4 unmasked", netip.MustParsePrefix("10.1.2.3/24"), "10.1.2.0/24", IPv4, "10.1.2.1", 253},
		{"v6 /126", netip.MustParsePrefix("fd00::/126"), "fd00::/126", IPv6, "fd00::1", 2},
		{"v6 /112", netip.MustParsePrefix("fd00:200::/112"), "fd00:200::/112", IPv6, "fd00:200::1", 65534},
		{"v6 /104", netip.MustParsePrefix("fd00::/104"), "fd00::/104", IPv6, "fd00::1", 1<<24 - 2},
		{"v6 unmasked", netip.MustParsePrefix("fd00:200::abcd/112"), "fd00:200::/112", IPv6, "fd00:200::1", 65534},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewRange(tt.prefix, Sequential, nil)
			if err != nil {
				t.Fatalf("NewRange: %v", err)
			}
			if got := r.Prefix().String(); got != tt.want {
				t.Errorf("Prefix() = %s, want %s", got, tt.want)
			}
			if got := r.Family(); got != tt.family {
				t.Errorf("Family() = %s, want %s", got, tt.family)
			}
			if got := r.Gateway().String(); got != tt.gateway {
				t.Errorf("Gateway() = %s, want %s", got, tt.gateway)
			}
			if got := r.Strategy(); got != Sequential {
				t.Errorf("Strategy() = %v, want sequential", got)
			}
			if got := r.Size(); got != tt.size {
				t.Errorf("Size() = %d, want %d", got, tt.size)
			}
			checkCounts(t, r, 0)
			if r.Free() != tt.size {
				t.Errorf("Free() = %d, want %d", r.Free(), tt.size)
			}
		})
	}
}

func TestNewRangeRefused(t *testing.T) {
	tests := []struct {
		name     string
		prefix   netip.Prefix
		strategy Strategy
		want     error
	}{
		{"zero prefix", netip.Prefix{}, Sequential, ErrInvalidRange},
		{"bad bits", netip.PrefixFrom(netip.MustParseAddr("10.0.0.0"), 33), Sequential, ErrInvalidRange},
		{"v4 /31", netip.MustParsePrefix("10.0.0.0/31"), Sequential, ErrInvalidRange},
		{"v4 /32", netip.MustParsePrefix("10.0.0.1/32"), Sequential, ErrInvalidRange},
		{"v4 /7", netip.MustParsePrefix("10.0.0.0/7"), Sequential, ErrInvalidRange},
		{"v4 /0", netip.MustParsePrefix("0.0.0.0/0"), Sequential, ErrInvalidRange},
		{"v6 /127", netip.MustParsePrefix("fd00::/127"), Sequential, ErrInvalidRange},
		{"v6 /128", netip.MustParsePrefix("fd00::1/128"), Sequential, ErrInvalidRange},
		{"v6 /103", netip.MustParsePrefix("fd00::/103"), Sequential, ErrInvalidRange},
		{"v6 /64", netip.MustParsePrefix("fd00::/64"), Random, ErrInvalidRange},
		{"v4-mapped v6", netip.MustParsePrefix("::ffff:10.0.0.0/120"), Sequential, ErrInvalidRange},
		{"unknown strategy", netip.MustParsePrefix("10.0.0.0/24"), Strategy(7), ErrInvalidStrategy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewRange(tt.prefix, tt.strategy, nil)
			if !errors.Is(err, tt.want) {
				t.Fatalf("NewRange(%s) = %v, %v; want error %v", tt.prefix, r, err, tt.want)
			}
			if r != nil {
				t.Errorf("NewRange returned a Range with error %v", err)
			}
			if !strings.Contains(err.Error(), tt.prefix.String()) {
				t.Errorf("error %q does not name prefix %s", err, tt.prefix)
			}
		})
	}
}

func TestSlash30(t *testing.T) {
	for _, s := range []Strategy{Sequential, Random} {
		t.Run(s.String(), func(t *testing.T) {
			r := newTestRange(t, "10.0.0.0/30", s, 1)
			for _, ip := range []string{"10.0.0.0", "10.0.0.1", "10.0.0.3"} {
				if err := r.Allocate(netip.MustParseAddr(ip), "x"); !errors.Is(err, ErrReserved) {
					t.Errorf("Allocate(%s) = %v, want ErrReserved", ip, err)
				}
			}
			if got := mustAllocateNext(t, r, "a"); got != netip.MustParseAddr("10.0.0.2") {
				t.Errorf("AllocateNext = %s, want 10.0.0.2", got)
			}
			if _, err := r.AllocateNext("b"); !errors.Is(err, ErrExhausted) {
				t.Errorf("second AllocateNext = %v, want ErrExhausted", err)
			}
			checkCounts(t, r, 1)
		})
	}
}

func TestExhaustSlash24(t *testing.T) {
	for _, s := range []Strategy{Sequential, Random} {
		t.Run(s.String(), func(t *testing.T) {
			r := newTestRange(t, "10.1.2.0/24", s, 42)
			seen := make(map[netip.Addr]bool)
			for i := range 253 {
				ip := mustAllocateNext(t, r, fmt.Sprintf("c%d", i))
				if seen[ip] || isReserved(r, ip) || !r.Contains(ip) {
					t.Fatalf("AllocateNext #%d = %s: duplicate %v, reserved %v, contained %v",
						i, ip, seen[ip], isReserved(r, ip), r.Contains(ip))
				}
				seen[ip] = true
			}
			checkCounts(t, r, 253)
			_, err := r.AllocateNext("late")
			if !errors.Is(err, ErrExhausted) {
				t.Fatalf("AllocateNext on full range = %v, want ErrExhausted", err)
			}
			var ee *ExhaustedError
			if !errors.As(err, &ee) || ee.Prefix != r.Prefix() {
				t.Fatalf("errors.As(%v) = %v, want *ExhaustedError for %s", err, ee, r.Prefix())
			}
			if !strings.Contains(err.Error(), "10.1.2.0/24") {
				t.Errorf("error %q does not name the prefix", err)
			}

			// Release and reallocate: the only free address comes back.
			freed := netip.MustParseAddr("10.1.2.77")
			if owner, ok := r.Release(freed); !ok || owner == "" {
				t.Fatalf("Release(%s) = %q, %v", freed, owner, ok)
			}
			checkCounts(t, r, 252)
			if got := mustAllocateNext(t, r, "again"); got != freed {
				t.Errorf("AllocateNext after release = %s, want %s", got, freed)
			}
			if owner, _ := r.Owner(freed); owner != "again" {
				t.Errorf("Owner(%s) = %q, want again", freed, owner)
			}
		})
	}
}

func TestSequentialCursor(t *testing.T) {
	type step struct {
		release string // if set, release this address
		want    string // else AllocateNext must return this ("" for exhausted)
	}
	tests := []struct {
		name  string
		cidr  string
		steps []step
	}{
		{"in order", "10.0.0.0/24", []step{{want: "10.0.0.2"}, {want: "10.0.0.3"}, {want: "10.0.0.4"}}},
		{"released not reused at once", "10.0.0.0/24", []step{
			{want: "10.0.0.2"}, {want: "10.0.0.3"}, {release: "10.0.0.3"}, {want: "10.0.0.4"},
			{release: "10.0.0.2"}, {want: "10.0.0.5"},
		}},
		{"wraps around", "10.0.0.0/29", []step{
			{want: "10.0.0.2"}, {want: "10.0.0.3"}, {want: "10.0.0.4"}, {want: "10.0.0.5"},
			{release: "10.0.0.3"}, {want: "10.0.0.6"}, {want: "10.0.0.3"}, {want: ""},
			{release: "10.0.0.5"}, {release: "10.0.0.2"}, {want: "10.0.0.5"}, {want: "10.0.0.2"},
		}},
		{"cursor at end wraps to first", "10.0.0.0/29", []step{
			{want: "10.0.0.2"}, {want: "10.0.0.3"}, {want: "10.0.0.4"}, {want: "10.0.0.5"}, {want: "10.0.0.6"},
			{release: "10.0.0.2"}, {release: "10.0.0.6"}, {want: "10.0.0.2"}, {want: "10.0.0.6"},
		}},
		{"v6 wraps past last", "fd00::/126", []step{
			{want: "fd00::2"}, {want: "fd00::3"}, {want: ""}, {release: "fd00::2"}, {want: "fd00::2"},
		}},
		{"word boundary", "10.0.0.0/24", func() []step {
			var s []step
			for i := 2; i < 70; i++ {
				s = append(s, step{want: fmt.Sprintf("10.0.0.%d", i)})
			}
			return append(s, step{release: "10.0.0.10"}, step{want: "10.0.0.70"})
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newTestRange(t, tt.cidr, Sequential, 0)
			for i, st := range tt.steps {
				if st.release != "" {
					if _, ok := r.Release(netip.MustParseAddr(st.release)); !ok {
						t.Fatalf("step %d: Release(%s) = false", i, st.release)
					}
					continue
				}
				got, err := r.AllocateNext(fmt.Sprint("s", i))
				if st.want == "" {
					if !errors.Is(err, ErrExhausted) {
						t.Fatalf("step %d: AllocateNext = %s, %v; want ErrExhausted", i, got, err)
					}
					continue
				}
				if err != nil || got.String() != st.want {
					t.Fatalf("step %d: AllocateNext = %s, %v; want %s", i, got, err, st.want)
				}
			}
		})
	}
}

func TestAllocateSpecificDoesNotMoveCursor(t *testing.T) {
	r := newTestRange(t, "10.0.0.0/24", Sequential, 0)
	if err := r.Allocate(netip.MustParseAddr("10.0.0.100"), "restored"); err != nil {
		t.Fatal(err)
	}
	if got := mustAllocateNext(t, r, "a"); got != netip.MustParseAddr("10.0.0.2") {
		t.Errorf("AllocateNext = %s, want 10.0.0.2", got)
	}
}

func TestRandomStrategy(t *testing.T) {
	tests := []struct {
		cidr string
		seed uint64
	}{
		{"10.0.0.0/24", 1},
		{"10.0.0.0/24", 2},
		{"10.0.0.0/29", 3},
		{"10.0.0.0/22", 4},
		{"fd00::/120", 5},
		{"fd00::/126", 6},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/seed=%d", tt.cidr, tt.seed), func(t *testing.T) {
			r := newTestRange(t, tt.cidr, Random, tt.seed)
			seen := make(map[netip.Addr]bool)
			inOrder := true
			var prev netip.Addr
			for range r.Size() {
				ip := mustAllocateNext(t, r, "o")
				if seen[ip] || isReserved(r, ip) || !r.Contains(ip) {
					t.Fatalf("AllocateNext = %s: duplicate %v, reserved %v, contained %v",
						ip, seen[ip], isReserved(r, ip), r.Contains(ip))
				}
				if prev.IsValid() && !prev.Less(ip) {
					inOrder = false
				}
				seen[ip], prev = true, ip
			}
			if _, err := r.AllocateNext("o"); !errors.Is(err, ErrExhausted) {
				t.Fatalf("AllocateNext on full range = %v, want ErrExhausted", err)
			}
			if inOrder && r.Size() > 8 {
				t.Errorf("random strategy handed out %d addresses in ascending order", r.Size())
			}
		})
	}
}

func TestRandomDeterministicWithSeed(t *testing.T) {
	a := newTestRange(t, "10.0.0.0/16", Random, 99)
	b := newTestRange(t, "10.0.0.0/16", Random, 99)
	for i := range 100 {
		x, y := mustAllocateNext(t, a, "o"), mustAllocateNext(t, b, "o")
		if x != y {
			t.Fatalf("allocation %d: %s != %s with the same seed", i, x, y)
		}
	}
}

func TestRandomNilRNG(t *testing.T) {
	r, err := NewRange(netip.MustParsePrefix("10.0.0.0/24"), Random, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 253 {
		mustAllocateNext(t, r, "o")
	}
	checkCounts(t, r, 253)
}

func TestAllocate(t *testing.T) {
	tests := []struct {
		name  string
		cidr  string
		ip    netip.Addr
		owner string
		want  error
	}{
		{"ok", "10.0.0.0/24", netip.MustParseAddr("10.0.0.50"), "other", nil},
		{"ok last before broadcast", "10.0.0.0/24", netip.MustParseAddr("10.0.0.254"), "other", nil},
		{"ok v4-mapped", "10.0.0.0/24", netip.MustParseAddr("::ffff:10.0.0.51"), "other", nil},
		{"ok v6 last", "fd00::/112", netip.MustParseAddr("fd00::ffff"), "other", nil},
		{"out of range", "10.0.0.0/24", netip.MustParseAddr("10.0.1.5"), "other", ErrOutOfRange},
		{"out of range below", "10.0.1.0/24", netip.MustParseAddr("10.0.0.255"), "other", ErrOutOfRange},
		{"wrong family v6 in v4", "10.0.0.0/24", netip.MustParseAddr("fd00::5"), "other", ErrOutOfRange},
		{"wrong family v4 in v6", "fd00::/112", netip.MustParseAddr("10.0.0.5"), "other", ErrOutOfRange},
		{"invalid addr", "10.0.0.0/24", netip.Addr{}, "other", ErrOutOfRange},
		{"zoned v6", "fe80::/112", netip.MustParseAddr("fe80::5%eth0"), "other", ErrOutOfRange},
		{"network", "10.0.0.0/24", netip.MustParseAddr("10.0.0.0"), "other", ErrReserved},
		{"gateway", "10.0.0.0/24", netip.MustParseAddr("10.0.0.1"), "other", ErrReserved},
		{"broadcast", "10.0.0.0/24", netip.MustParseAddr("10.0.0.255"), "other", ErrReserved},
		{"v6 network", "fd00::/112", netip.MustParseAddr("fd00::"), "other", ErrReserved},
		{"v6 gateway", "fd00::/112", netip.MustParseAddr("fd00::1"), "other", ErrReserved},
		{"taken by other", "10.0.0.0/24", netip.MustParseAddr("10.0.0.9"), "other", ErrAllocated},
		{"same owner idempotent", "10.0.0.0/24", netip.MustParseAddr("10.0.0.9"), "first", nil},
		{"v6 taken by other", "fd00::/112", netip.MustParseAddr("fd00::9"), "other", ErrAllocated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newTestRange(t, tt.cidr, Sequential, 0)
			taken := r.Prefix().Addr().Next().Next()
			for range 7 {
				taken = taken.Next()
			}
			if err := r.Allocate(taken, "first"); err != nil { // .9 / ::9
				t.Fatalf("setup Allocate(%s): %v", taken, err)
			}
			err := r.Allocate(tt.ip, tt.owner)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("Allocate(%s, %q) = %v, want %v", tt.ip, tt.owner, err, tt.want)
			}
			wantUsed := 1
			if err == nil && tt.ip.Unmap() != taken {
				wantUsed = 2
			}
			checkCounts(t, r, wantUsed)
			if errors.Is(err, ErrAllocated) && !strings.Contains(err.Error(), `"first"`) {
				t.Errorf("error %q does not name the current owner", err)
			}
			if err == nil {
				if owner, ok := r.Owner(tt.ip); !ok || owner != tt.owner {
					t.Errorf("Owner(%s) = %q, %v; want %q", tt.ip, owner, ok, tt.owner)
				}
			}
		})
	}
}

func TestRelease(t *testing.T) {
	tests := []struct {
		name      string
		cidr      string
		ip        netip.Addr
		wantOwner string
		wantOK    bool
	}{
		{"allocated", "10.0.0.0/24", netip.MustParseAddr("10.0.0.9"), "first", true},
		{"allocated v4-mapped", "10.0.0.0/24", netip.MustParseAddr("::ffff:10.0.0.9"), "first", true},
		{"unallocated", "10.0.0.0/24", netip.MustParseAddr("10.0.0.10"), "", false},
		{"out of range", "10.0.0.0/24", netip.MustParseAddr("10.9.0.9"), "", false},
		{"wrong family", "10.0.0.0/24", netip.MustParseAddr("fd00::9"), "", false},
		{"network", "10.0.0.0/24", netip.MustParseAddr("10.0.0.0"), "", false},
		{"gateway", "10.0.0.0/24", netip.MustParseAddr("10.0.0.1"), "", false},
		{"broadcast", "10.0.0.0/24", netip.MustParseAddr("10.0.0.255"), "", false},
		{"invalid addr", "10.0.0.0/24", netip.Addr{}, "", false},
		{"v6 allocated", "fd00::/112", netip.MustParseAddr("fd00::9"), "first", true},
		{"v6 gateway", "fd00::/112", netip.MustParseAddr("fd00::1"), "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newTestRange(t, tt.cidr, Sequential, 0)
			taken := r.Prefix().Addr()
			for range 9 {
				taken = taken.Next()
			}
			if err := r.Allocate(taken, "first"); err != nil {
				t.Fatalf("setup Allocate(%s): %v", taken, err)
			}
			owner, ok := r.Release(tt.ip)
			if owner != tt.wantOwner || ok != tt.wantOK {
				t.Fatalf("Release(%s) = %q, %v; want %q, %v", tt.ip, owner, ok, tt.wantOwner, tt.wantOK)
			}
			wantUsed := 1
			if ok {
				wantUsed = 0
			}
			checkCounts(t, r, wantUsed)
			if owner, ok := r.Release(tt.ip); ok {
				t.Errorf("second Release(%s) = %q, true; want no-op", tt.ip, owner)
			}
			// Reserved addresses stay unallocatable after a Release attempt.
			if err := r.Allocate(r.Gateway(), "x"); !errors.Is(err, ErrReserved) {
				t.Errorf("Allocate(gateway) after Release = %v, want ErrReserved", err)
			}
		})
	}
}

func TestContains(t *testing.T) {
	tests := []struct {
		cidr string
		ip   netip.Addr
		want bool
	}{
		{"10.0.0.0/24", netip.MustParseAddr("10.0.0.0"), true},
		{"10.0.0.0/24", netip.MustParseAddr("10.0.0.255"), true},
		{"10.0.0.0/24", netip.MustParseAddr("10.0.1.0"), false},
		{"10.0.0.0/24", netip.MustParseAddr("::ffff:10.0.0.7"), true},
		{"10.0.0.0/24", netip.MustParseAddr("::a00:7"), false},
		{"10.0.0.0/24", netip.Addr{}, false},
		{"fd00::/112", netip.MustParseAddr("fd00::ffff"), true},
		{"fd00::/112", netip.MustParseAddr("fd00::1:0"), false},
		{"fd00::/112", netip.MustParseAddr("10.0.0.7"), false},
	}
	for _, tt := range tests {
		t.Run(tt.cidr+"/"+tt.ip.String(), func(t *testing.T) {
			r := newTestRange(t, tt.cidr, Sequential, 0)
			if got := r.Contains(tt.ip); got != tt.want {
				t.Errorf("Contains(%s) = %v, want %v", tt.ip, got, tt.want)
			}
		})
	}
}

func TestIPv6Slash112(t *testing.T) {
	r := newTestRange(t, "fd00:200::/112", Sequential, 0)
	if r.Size() != 65534 {
		t.Fatalf("Size() = %d, want 65534", r.Size())
	}
	want := []string{"fd00:200::2", "fd00:200::3", "fd00:200::4"}
	for _, w := range want {
		if got := mustAllocateNext(t, r, "p"); got.String() != w {
			t.Errorf("AllocateNext = %s, want %s", got, w)
		}
	}
	if err := r.Allocate(netip.MustParseAddr("fd00:200::ffff"), "last"); err != nil {
		t.Errorf("Allocate(last address) = %v, want nil: IPv6 has no broadcast", err)
	}
	if err := r.Allocate(netip.MustParseAddr("fd00:201::5"), "x"); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("Allocate(fd00:201::5) = %v, want ErrOutOfRange", err)
	}
	checkCounts(t, r, 4)
	if r.Free() != 65530 {
		t.Errorf("Free() = %d, want 65530", r.Free())
	}
}

func TestOwnerAllocationsForEach(t *testing.T) {
	for _, cidr := range []string{"10.0.0.0/16", "fd00::/112"} {
		t.Run(cidr, func(t *testing.T) {
			r := newTestRange(t, cidr, Sequential, 0)
			base := r.Prefix().Addr()
			offsets := []int{300, 5, 64, 63, 65000, 2, 128}
			model := make(map[netip.Addr]string)
			for _, off := range offsets {
				ip := base
				for range off {
					ip = ip.Next()
				}
				owner := fmt.Sprintf("pod-%d", off)
				if err := r.Allocate(ip, owner); err != nil {
					t.Fatalf("Allocate(%s): %v", ip, err)
				}
				model[ip] = owner
			}
			checkModel(t, r, model)
			for ip, want := range model {
				if got, ok := r.Owner(ip); !ok || got != want {
					t.Errorf("Owner(%s) = %q, %v; want %q", ip, got, ok, want)
				}
			}
			if got, ok := r.Owner(r.Gateway()); ok {
				t.Errorf("Owner(gateway) = %q, true", got)
			}
			if got, ok := r.Owner(base.Next().Next().Next()); ok {
				t.Errorf("Owner(unallocated) = %q, true", got)
			}
			allocs := r.Allocations()
			var visited []Allocation
			r.ForEach(func(ip netip.Addr, owner string) bool {
				visited = append(visited, Allocation{ip, owner})
				return len(visited) < 3
			})
			if len(visited) != 3 {
				t.Fatalf("ForEach visited %d after stop at 3", len(visited))
			}
			for i := range visited {
				if visited[i] != allocs[i] {
					t.Errorf("ForEach #%d = %v, want %v", i, visited[i], allocs[i])
				}
			}
		})
	}
}

func TestAllocationsEmpty(t *testing.T) {
	r := newTestRange(t, "10.0.0.0/30", Sequential, 0)
	if got := r.Allocations(); len(got) != 0 {
		t.Errorf("Allocations() = %v, want empty", got)
	}
	r.ForEach(func(netip.Addr, string) bool {
		t.Error("ForEach called fn on an empty range")
		return true
	})
}

// TestMemoryPerAllocation checks the bookkeeping cost of one allocation
// (bitmap excluded, owner strings built beforehand).
func TestMemoryPerAllocation(t *testing.T) {
	const n = 20000
	const limit = 256 // bytes per allocation
	owners := make([]string, n)
	for i := range owners {
		owners[i] = fmt.Sprintf("container-%056d", i)
	}
	r := newTestRange(t, "10.0.0.0/16", Random, 1)
	perAlloc := testingAllocBytes(func() {
		for _, o := range owners {
			if _, err := r.AllocateNext(o); err != nil {
				t.Fatal(err)
			}
		}
	}) / n
	t.Logf("%d bytes allocated per allocation", perAlloc)
	if perAlloc > limit {
		t.Errorf("%d bytes allocated per allocation, want at most %d", perAlloc, limit)
	}
}

// TestCheck: Check agrees with Allocate on out-of-range and reserved
// addresses, and allocates nothing.
func TestCheck(t *testing.T) {
	r, err := NewRange(netip.MustParsePrefix("10.9.0.0/24"), Sequential, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		ip   string
		want error
	}{
		{"10.9.0.2", nil}, {"10.9.0.254", nil}, {"::ffff:10.9.0.7", nil},
		{"10.9.0.0", ErrReserved}, {"10.9.0.1", ErrReserved}, {"10.9.0.255", ErrReserved},
		{"10.9.1.2", ErrOutOfRange}, {"fd00::2", ErrOutOfRange},
	} {
		ip := netip.MustParseAddr(tt.ip)
		if err := r.Check(ip); !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
			t.Errorf("Check(%s) = %v, want %v", ip, err, tt.want)
		}
	}
	if r.Used() != 0 {
		t.Fatalf("Check allocated %d addresses", r.Used())
	}
}

// TestGateways: Gateways agrees with Range.Gateway for both families and
// skips invalid prefixes.
func TestGateways(t *testing.T) {
	v4, v6 := netip.MustParsePrefix("10.200.0.0/16"), netip.MustParsePrefix("fd00:200::/112")
	got, err := Gateways(v4, netip.Prefix{}, v6)
	if err != nil {
		t.Fatal(err)
	}
	var want []netip.Addr
	for _, p := range []netip.Prefix{v4, v6} {
		r, err := NewRange(p, Sequential, nil)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, r.Gateway())
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Gateways = %v, want %v", got, want)
	}
	if _, err := Gateways(netip.MustParsePrefix("10.0.0.0/31")); err == nil {
		t.Fatal("a /31 has a gateway")
	}
}
