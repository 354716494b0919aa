package ipam

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"net/netip"
)

const (
	// minHostBits is the fewest host bits a prefix may leave (/30 in IPv4,
	// /126 in IPv6): four addresses, enough for network, gateway and, in
	// IPv4, broadcast, plus at least one allocatable address.
	minHostBits = 2
	// maxHostBits caps a Range at 2^24 addresses so that its bitmap stays at
	// 2 MiB or less. It admits an IPv4 /8 and an IPv6 /104, and refuses an
	// IPv6 /64.
	maxHostBits = 24
	// gatewayOffset is the offset of the gateway from the network address.
	gatewayOffset = 1
)

// Allocation is one allocated address and its owner.
type Allocation struct {
	IP    netip.Addr
	Owner string
}

// Range is a bitmap allocator over one CIDR. The zero value is not usable;
// call NewRange.
//
// A Range is not safe for concurrent use: it is meant to be owned by a single
// actor that serialises all calls.
//
// Addresses are identified internally by their offset from the network
// address. The bitmap has one bit per offset; reserved offsets and the
// padding bits past the end of the range are permanently set, so that every
// clear bit is an allocatable free address. Exactly the allocated offsets
// have an entry in owners.
type Range struct {
	prefix   netip.Prefix
	family   Family
	strategy Strategy
	rng      *rand.Rand // used by Random only

	base    [16]byte // network address (IPv6 only; the low 32 bits are in baseLow)
	baseLow uint32   // low 32 bits of the network address
	first   uint32   // first allocatable offset
	last    uint32   // last allocatable offset
	next    uint32   // where Sequential starts its search
	bitmap  []uint64 // bit i set: offset i is allocated, reserved or padding
	owners  map[uint32]string
}

// NewRange returns an empty Range over prefix, masked to its network
// address. strategy selects how AllocateNext searches; rng is the source of
// randomness for Random and may be nil, in which case a randomly seeded one is
// created (it is unused by Sequential).
//
// Returns ErrInvalidRange if prefix is invalid, IPv4-mapped IPv6, longer than
// /30 (IPv4) or /126 (IPv6), or holds more than 2^24 addresses. Returns
// ErrInvalidStrategy if strategy is unknown.
func NewRange(prefix netip.Prefix, strategy Strategy, rng *rand.Rand) (*Range, error) {
	if !strategy.valid() {
		return nil, fmt.Errorf("new range %s: %v: %w", prefix, strategy, ErrInvalidStrategy)
	}
	if err := checkPrefix(prefix); err != nil {
		return nil, fmt.Errorf("new range %s: %w", prefix, err)
	}
	prefix = prefix.Masked()
	hostBits := prefix.Addr().BitLen() - prefix.Bits()
	total := uint32(1) << hostBits

	r := &Range{
		prefix:   prefix,
		family:   IPv4,
		strategy: strategy,
		rng:      rng,
		first:    gatewayOffset + 1,
		last:     total - 2, // broadcast is total-1
		bitmap:   make([]uint64, (total+63)/64),
		owners:   make(map[uint32]string),
	}
	if prefix.Addr().Is6() {
		r.family = IPv6
		r.last = total - 1 // no broadcast in IPv6
		r.base = prefix.Addr().As16()
		r.baseLow = binary.BigEndian.Uint32(r.base[12:])
	} else {
		a := prefix.Addr().As4()
		r.baseLow = binary.BigEndian.Uint32(a[:])
	}
	r.next = r.first
	if r.strategy == Random && r.rng == nil {
		r.rng = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	// Mark everything that is not allocatable: offsets below first, above
	// last (broadcast) and the padding up to the end of the last word.
	for off := range r.first {
		r.set(off)
	}
	for off := r.last + 1; off < uint32(len(r.bitmap))*64; off++ {
		r.set(off)
	}
	return r, nil
}

// checkPrefix returns an error wrapping ErrInvalidRange if prefix cannot back
// a Range.
func checkPrefix(prefix netip.Prefix) error {
	if !prefix.IsValid() {
		return fmt.Errorf("prefix is not valid: %w", ErrInvalidRange)
	}
	if prefix.Addr().Is4In6() {
		return fmt.Errorf("ipv4-mapped ipv6 prefix, use the ipv4 form: %w", ErrInvalidRange)
	}
	bitLen := prefix.Addr().BitLen()
	hostBits := bitLen - prefix.Bits()
	if hostBits < minHostBits {
		return fmt.Errorf("prefix longer than /%d leaves no allocatable address: %w",
			bitLen-minHostBits, ErrInvalidRange)
	}
	if hostBits > maxHostBits {
		return fmt.Errorf("2^%d addresses exceed the limit of 2^%d (prefix shorter than /%d): %w",
			hostBits, maxHostBits, bitLen-maxHostBits, ErrInvalidRange)
	}
	return nil
}

// Prefix returns the range's CIDR, masked to its network address.
func (r *Range) Prefix() netip.Prefix { return r.prefix }

// Family returns the range's address family.
func (r *Range) Family() Family { return r.family }

// Strategy returns the strategy AllocateNext uses.
func (r *Range) Strategy() Strategy { return r.strategy }

// Gateway returns the gateway address: the first address after the network
// address. It is reserved and never handed out.
func (r *Range) Gateway() netip.Addr { return r.addr(gatewayOffset) }

// Size returns the number of allocatable addresses: all addresses of the
// prefix minus the reserved ones.
func (r *Range) Size() int { return int(r.last - r.first + 1) }

// Used returns the number of allocated addresses.
func (r *Range) Used() int { return len(r.owners) }

// Free returns the number of addresses still available, Size() - Used().
func (r *Range) Free() int { return r.Size() - r.Used() }

// Contains reports whether ip lies inside the range's prefix. An
// IPv4-mapped IPv6 address is treated as its IPv4 form; an address of the
// other family or with a zone is never contained.
func (r *Range) Contains(ip netip.Addr) bool {
	_, ok := r.offset(ip)
	return ok
}

// AllocateNext allocates a free address to owner and returns it. Sequential
// returns the first free address after the one it returned last, wrapping
// around; Random the first free address at or after a random offset. The
// search scans the bitmap a 64-bit word at a time.
//
// Returns an *ExhaustedError, which matches ErrExhausted, if no address is
// free.
func (r *Range) AllocateNext(owner string) (netip.Addr, error) {
	start := r.next
	if r.strategy == Random {
		start = r.first + r.rng.Uint32N(r.last-r.first+1)
	}
	off, ok := r.findFree(start)
	if !ok {
		return netip.Addr{}, fmt.Errorf("allocate next: %w", &ExhaustedError{Prefix: r.prefix})
	}
	r.claim(off, owner)
	if r.strategy == Sequential {
		r.next = off + 1
		if r.next > r.last {
			r.next = r.first
		}
	}
	return r.addr(off), nil
}

// Allocate allocates ip to owner. It is idempotent: allocating an address
// again to the same owner succeeds and changes nothing. It does not move the
// Sequential cursor.
//
// Returns ErrOutOfRange if ip is not inside the prefix (including an address
// of the other family), ErrReserved if ip is the network, gateway or
// broadcast address, and ErrAllocated if ip belongs to another owner.
func (r *Range) Allocate(ip netip.Addr, owner string) error {
	off, ok := r.offset(ip)
	if !ok {
		return fmt.Errorf("allocate %s in %s: %w", ip, r.prefix, ErrOutOfRange)
	}
	if r.reserved(off) {
		return fmt.Errorf("allocate %s in %s: %w", ip, r.prefix, ErrReserved)
	}
	if cur, ok := r.owners[off]; ok {
		if cur == owner {
			return nil
		}
		return fmt.Errorf("allocate %s to %q: owned by %q: %w", ip, owner, cur, ErrAllocated)
	}
	r.claim(off, owner)
	return nil
}

// Check reports whether ip could be allocated in the range, without
// allocating it or looking at its owner.
//
// Returns ErrOutOfRange if ip is not inside the prefix (including an
// address of the other family) and ErrReserved if ip is the network,
// gateway or broadcast address.
func (r *Range) Check(ip netip.Addr) error {
	off, ok := r.offset(ip)
	if !ok {
		return fmt.Errorf("address %s outside %s: %w", ip, r.prefix, ErrOutOfRange)
	}
	if r.reserved(off) {
		return fmt.Errorf("address %s is reserved in %s (network, gateway or broadcast): %w", ip, r.prefix, ErrReserved)
	}
	return nil
}

// Release frees ip and returns the owner it had. Releasing an address that is
// not allocated, reserved or outside the range does nothing and returns
// false.
func (r *Range) Release(ip netip.Addr) (owner string, released bool) {
	off, ok := r.offset(ip)
	if !ok {
		return "", false
	}
	owner, ok = r.owners[off]
	if !ok {
		return "", false
	}
	delete(r.owners, off)
	r.bitmap[off/64] &^= 1 << (off % 64)
	return owner, true
}

// Owner returns the owner of ip and whether ip is allocated.
func (r *Range) Owner(ip netip.Addr) (string, bool) {
	off, ok := r.offset(ip)
	if !ok {
		return "", false
	}
	owner, ok := r.owners[off]
	return owner, ok
}

// Allocations returns every allocation, sorted by address.
func (r *Range) Allocations() []Allocation {
	out := make([]Allocation, 0, len(r.owners))
	r.ForEach(func(ip netip.Addr, owner string) bool {
		out = append(out, Allocation{IP: ip, Owner: owner})
		return true
	})
	return out
}

// ForEach calls fn for every allocation in address order until fn returns
// false. fn must not modify r.
func (r *Range) ForEach(fn func(ip netip.Addr, owner string) bool) {
	for w, word := range r.bitmap {
		for word != 0 {
			off := uint32(w)*64 + uint32(bits.TrailingZeros64(word))
			word &= word - 1
			owner, ok := r.owners[off]
			if !ok {
				continue // reserved or padding
			}
			if !fn(r.addr(off), owner) {
				return
			}
		}
	}
}

// findFree returns the first clear bit at or after start, wrapping around
// once. It visits each word of the bitmap at most twice: the start word is
// first searched only from start on, and last in full.
func (r *Range) findFree(start uint32) (uint32, bool) {
	n := len(r.bitmap)
	w := int(start / 64)
	word := r.bitmap[w] | (uint64(1)<<(start%64) - 1)
	for range n + 1 {
		if word != ^uint64(0) {
			return uint32(w)*64 + uint32(bits.TrailingZeros64(^word)), true
		}
		if w++; w == n {
			w = 0
		}
		word = r.bitmap[w]
	}
	return 0, false
}

func (r *Range) claim(off uint32, owner string) {
	r.set(off)
	r.owners[off] = owner
}

func (r *Range) set(off uint32) { r.bitmap[off/64] |= 1 << (off % 64) }

func (r *Range) reserved(off uint32) bool { return off < r.first || off > r.last }

// offset returns ip's offset from the network address and whether ip is
// inside the prefix.
func (r *Range) offset(ip netip.Addr) (uint32, bool) {
	ip = ip.Unmap()
	if !r.prefix.Contains(ip) {
		return 0, false
	}
	if ip.Is4() {
		a := ip.As4()
		return binary.BigEndian.Uint32(a[:]) - r.baseLow, true
	}
	a := ip.As16()
	return binary.BigEndian.Uint32(a[12:]) - r.baseLow, true
}

// addr returns the address at offset off. The prefix is masked and has at
// most 24 host bits, so the sum never carries out of the low 32 bits.
func (r *Range) addr(off uint32) netip.Addr {
	if r.family == IPv4 {
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], r.baseLow+off)
		return netip.AddrFrom4(a)
	}
	a := r.base
	binary.BigEndian.PutUint32(a[12:], r.baseLow+off)
	return netip.AddrFrom16(a)
}

// Gateways returns the gateway address of each valid prefix (the address
// every Range of that prefix reserves for the node), in order; invalid
// prefixes (a family the node does not serve) are skipped.
func Gateways(prefixes ...netip.Prefix) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, p := range prefixes {
		if !p.IsValid() {
			continue
		}
		if err := checkPrefix(p); err != nil {
			return nil, fmt.Errorf("gateway of %s: %w", p, err)
		}
		a := p.Masked().Addr()
		for range gatewayOffset {
			a = a.Next()
		}
		out = append(out, a)
	}
	return out, nil
}
