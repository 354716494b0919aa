package policy

import (
	"net/netip"
	"slices"
	"sort"
)

// prefixSet keeps the prefixes of the CIDR identities in address order
// (comparePrefix), so that those inside a prefix are one contiguous run
// found by binary search. Additions and removals are applied lazily, in
// one merge before the next query: an import adds all its prefixes
// before it asks about any.
type prefixSet struct {
	sorted  []netip.Prefix            // ordered, may hold removed prefixes
	added   []netip.Prefix            // not merged yet, unordered
	removed map[netip.Prefix]struct{} // still in sorted or added
}

// add adds p, which the set does not hold.
func (s *prefixSet) add(p netip.Prefix) {
	if _, ok := s.removed[p]; ok {
		delete(s.removed, p) // still stored
		return
	}
	s.added = append(s.added, p)
}

// remove removes p, which the set holds.
func (s *prefixSet) remove(p netip.Prefix) {
	if s.removed == nil {
		s.removed = map[netip.Prefix]struct{}{}
	}
	s.removed[p] = struct{}{}
}

func (s *prefixSet) merge() {
	if len(s.removed) > 0 {
		gone := func(p netip.Prefix) bool { _, ok := s.removed[p]; return ok }
		s.sorted = slices.DeleteFunc(s.sorted, gone)
		s.added = slices.DeleteFunc(s.added, gone)
		clear(s.removed)
	}
	if len(s.added) == 0 {
		return
	}
	slices.SortFunc(s.added, comparePrefix)
	out := make([]netip.Prefix, 0, len(s.sorted)+len(s.added))
	i, j := 0, 0
	for i < len(s.sorted) && j < len(s.added) {
		if comparePrefix(s.sorted[i], s.added[j]) <= 0 {
			out = append(out, s.sorted[i])
			i++
		} else {
			out = append(out, s.added[j])
			j++
		}
	}
	out = append(append(out, s.sorted[i:]...), s.added[j:]...)
	s.sorted, s.added = out, s.added[:0]
}

// inside calls fn for every prefix of the set inside outer (outer
// itself included).
func (s *prefixSet) inside(outer netip.Prefix, fn func(netip.Prefix)) {
	s.merge()
	first := outer.Addr()
	last := lastAddr(outer)
	i := sort.Search(len(s.sorted), func(i int) bool { return s.sorted[i].Addr().Compare(first) >= 0 })
	for ; i < len(s.sorted) && s.sorted[i].Addr().Compare(last) <= 0; i++ {
		if p := s.sorted[i]; p.Bits() >= outer.Bits() {
			fn(p) // a shorter prefix at the same address contains outer
		}
	}
}

// lastAddr returns the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// cidrSelectors indexes the CIDR selector cache entries by prefix, so
// that those containing a prefix are found with one lookup per prefix
// length in use.
type cidrSelectors struct {
	byPrefix map[netip.Prefix][]*cachedSelector
	// lens counts the entries per family (0: IPv4, 1: IPv6) and length.
	lens [2][129]int
}

func family(p netip.Prefix) int {
	if p.Addr().Is4() {
		return 0
	}
	return 1
}

func (c *cidrSelectors) add(cs *cachedSelector) {
	p := cs.cidr.Prefix
	if c.byPrefix == nil {
		c.byPrefix = map[netip.Prefix][]*cachedSelector{}
	}
	c.byPrefix[p] = append(c.byPrefix[p], cs)
	c.lens[family(p)][p.Bits()]++
}

func (c *cidrSelectors) remove(cs *cachedSelector) {
	p := cs.cidr.Prefix
	rest := slices.DeleteFunc(c.byPrefix[p], func(x *cachedSelector) bool { return x == cs })
	if len(rest) == 0 {
		delete(c.byPrefix, p)
	} else {
		c.byPrefix[p] = rest
	}
	c.lens[family(p)][p.Bits()]--
}

// containing calls fn for every entry whose prefix contains p.
func (c *cidrSelectors) containing(p netip.Prefix, fn func(*cachedSelector)) {
	lens := &c.lens[family(p)]
	for l := 0; l <= p.Bits(); l++ {
		if lens[l] == 0 {
			continue
		}
		q, err := p.Addr().Prefix(l)
		if err != nil {
			continue
		}
		for _, cs := range c.byPrefix[q] {
			fn(cs)
		}
	}
}

// all calls fn for every entry.
func (c *cidrSelectors) all(fn func(*cachedSelector)) {
	for _, css := range c.byPrefix {
		for _, cs := range css {
			fn(cs)
		}
	}
}
