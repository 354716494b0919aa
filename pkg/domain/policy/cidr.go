package policy

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// CIDREntry is one entry of an endpoint's CIDR policy: CIDR rules
// (fromCIDR/toCIDR, CIDRSet and ipBlock) decide on the peer's address,
// whatever identity the address has, so a pod's address is matched like
// any other and a pod's identity is never widened to its siblings.
//
// Entries of one group {Dir, Proto, Port} (wildcards as in Key) form a
// longest-prefix-match table of their own: a packet in Dir to Port over
// Proto with peer address a is allowed by the group when the longest
// Prefix of the group holding a has Allow set. The groups tried are the
// exact one, the port wildcard and the protocol wildcard (CIDRAllows);
// one allowing is enough. A group's table is exact (see cidrEntries):
// the longest match of every address gives that address's verdict over
// all the rules of the group, so an except of one rule is never undone by
// a broader prefix of another rule, nor turned into a deny of an address
// another rule allows.
//
// Deny entries (ingressDeny, egressDeny) form groups of their own, Deny
// set, in which Allow means the deny holds the address: a new
// connection is dropped when one deny group's longest match has Allow
// set (CIDRDenies), whatever the other entries allow.
type CIDREntry struct {
	Dir    Direction
	Deny   bool
	Proto  uint8
	Port   uint16
	Prefix netip.Prefix // masked; IPv4 prefixes are 4-byte
	Allow  bool
}

// CompareCIDR orders entries by direction, deny, protocol, port, then
// prefix (IPv4 first, then address, then length); Allow is not
// compared, so the entries of one MapState never share the other fields.
func CompareCIDR(a, b CIDREntry) int {
	return cmp.Or(cmp.Compare(a.Dir, b.Dir), compareBool(a.Deny, b.Deny), cmp.Compare(a.Proto, b.Proto),
		cmp.Compare(a.Port, b.Port), comparePrefix(a.Prefix, b.Prefix))
}

func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// CIDRAllows reports whether the CIDR entries allow a new connection
// with peer address addr on port/proto in dir (enforcement aside). The
// BPF programs' cidr_lookup computes the same.
func (m *MapState) CIDRAllows(addr netip.Addr, port uint16, proto uint8, dir Direction) bool {
	return m.cidrHolds(false, addr, port, proto, dir)
}

// CIDRDenies reports whether the CIDR deny entries drop a new
// connection with peer address addr on port/proto in dir (enforcement
// aside): one deny group's longest match holds it. The BPF programs'
// cidr_denied computes the same.
func (m *MapState) CIDRDenies(addr netip.Addr, port uint16, proto uint8, dir Direction) bool {
	return m.cidrHolds(true, addr, port, proto, dir)
}

func (m *MapState) cidrHolds(deny bool, addr netip.Addr, port uint16, proto uint8, dir Direction) bool {
	if m == nil || !addr.IsValid() {
		return false
	}
	addr = addr.Unmap()
	for _, g := range [3][2]uint16{{uint16(proto), port}, {uint16(proto), 0}, {0, 0}} {
		if e, ok := m.longestCIDR(dir, deny, uint8(g[0]), g[1], addr); ok && e.Allow {
			return true
		}
	}
	return false
}

func (m *MapState) longestCIDR(dir Direction, deny bool, proto uint8, port uint16, addr netip.Addr) (CIDREntry, bool) {
	var best CIDREntry
	found := false
	for _, e := range m.CIDR {
		if e.Dir == dir && e.Deny == deny && e.Proto == proto && e.Port == port && e.Prefix.Contains(addr) &&
			(!found || e.Prefix.Bits() > best.Prefix.Bits()) {
			best, found = e, true
		}
	}
	return best, found
}

// AllowsAddr reports whether a new connection with the peer of identity
// peer and address addr on port/proto in dir passes: always when dir is
// not enforced; else never when an identity entry denies it (the first
// of Lookups present) or the CIDR deny entries do (CIDRDenies); else when
// an identity entry or the CIDR entries (CIDRAllows) allow it. The
// datapath's verdict must equal this one.
func (m *MapState) AllowsAddr(peer identity.NumericIdentity, addr netip.Addr, port uint16, proto uint8, dir Direction) bool {
	if !m.Enforced(dir) {
		return true
	}
	found, denied := m.lookup(peer, port, proto, dir)
	if denied || m.CIDRDenies(addr, port, proto, dir) {
		return false
	}
	return found || m.CIDRAllows(addr, port, proto, dir)
}

// cidrGroup is one {Dir, Proto, Port} group's CIDR selectors.
type cidrGroup struct {
	dir   Direction
	proto uint8
	port  uint16
	deny  bool
}

// cidrEntries compiles the CIDR selectors of each group into exact
// longest-prefix-match tables. For the set S of every prefix and except
// of a group's selectors, an address's longest match P in S decides:
// selector C allows the address iff C.Prefix contains P and no except of
// C contains P (every prefix of C is in S, so one holding the address is
// either P or contains P). Entries whose verdict equals the one their
// nearest enclosing entry gives (deny without one) are left out: removing
// them changes no address's verdict.
func cidrEntries(groups map[cidrGroup][]*CIDRSelector) []CIDREntry {
	var out []CIDREntry
	for g, sels := range groups {
		t := newCIDRTable(sels)
		for _, p := range t.set {
			allow := t.verdict(p)
			inherited := false
			if parent, ok := t.nearestEnclosing(p); ok {
				inherited = t.verdict(parent)
			}
			if allow != inherited {
				out = append(out, CIDREntry{Dir: g.dir, Deny: g.deny, Proto: g.proto, Port: g.port, Prefix: p, Allow: allow})
			}
		}
	}
	slices.SortFunc(out, CompareCIDR)
	return out
}

// cidrTable answers, for one group, which selectors contain a prefix by
// walking the prefix's ancestors (at most 33 or 129 map lookups) instead
// of scanning every selector: a 50,000-CIDR policy compiles in time
// linear in its size.
type cidrTable struct {
	set      []netip.Prefix                              // every prefix and except, sorted, unique
	inSet    map[netip.Prefix]struct{}                   // set, for nearestEnclosing
	bySel    map[netip.Prefix][]*CIDRSelector            // selectors by their (masked) prefix
	excepts  map[*CIDRSelector]map[netip.Prefix]struct{} // large except lists, indexed
	verdicts map[netip.Prefix]bool                       // memo
}

// cidrExceptScan is the except list length up to which a list is
// scanned rather than indexed.
const cidrExceptScan = 8

func newCIDRTable(sels []*CIDRSelector) *cidrTable {
	t := &cidrTable{inSet: map[netip.Prefix]struct{}{}, bySel: map[netip.Prefix][]*CIDRSelector{},
		excepts: map[*CIDRSelector]map[netip.Prefix]struct{}{}, verdicts: map[netip.Prefix]bool{}}
	for _, s := range sels {
		t.set = append(t.set, s.Prefix)
		t.set = append(t.set, s.Except...)
		k := s.Prefix.Masked()
		t.bySel[k] = append(t.bySel[k], s)
		if len(s.Except) > cidrExceptScan {
			m := make(map[netip.Prefix]struct{}, len(s.Except))
			for _, e := range s.Except {
				m[e.Masked()] = struct{}{}
			}
			t.excepts[s] = m
		}
	}
	slices.SortFunc(t.set, comparePrefix)
	t.set = slices.Compact(t.set)
	for _, p := range t.set {
		t.inSet[p.Masked()] = struct{}{}
	}
	return t
}

// verdict reports whether some selector contains p and none of that
// selector's excepts does.
func (t *cidrTable) verdict(p netip.Prefix) bool {
	if v, ok := t.verdicts[p]; ok {
		return v
	}
	v := false
	for bits := p.Bits(); bits >= 0 && !v; bits-- {
		for _, s := range t.bySel[netip.PrefixFrom(p.Addr(), bits).Masked()] {
			if !t.exceptContains(s, p) {
				v = true
				break
			}
		}
	}
	t.verdicts[p] = v
	return v
}

// exceptContains reports whether an except of s contains p.
func (t *cidrTable) exceptContains(s *CIDRSelector, p netip.Prefix) bool {
	m, indexed := t.excepts[s]
	if !indexed {
		return slices.ContainsFunc(s.Except, func(e netip.Prefix) bool { return contains(e, p) })
	}
	for bits := p.Bits(); bits >= 0; bits-- {
		if _, ok := m[netip.PrefixFrom(p.Addr(), bits).Masked()]; ok {
			return true
		}
	}
	return false
}

// nearestEnclosing returns the longest prefix of the set strictly
// containing p.
func (t *cidrTable) nearestEnclosing(p netip.Prefix) (netip.Prefix, bool) {
	for bits := p.Bits() - 1; bits >= 0; bits-- {
		q := netip.PrefixFrom(p.Addr(), bits).Masked()
		if _, ok := t.inSet[q]; ok {
			return q, true
		}
	}
	return netip.Prefix{}, false
}

// DiffCIDR returns the entries of to that from lacks or holds with
// another verdict (upsert), and the entries of from whose fields other
// than Allow are absent from to (remove).
func DiffCIDR(from, to *MapState) (upsert, remove []CIDREntry) {
	var a, b []CIDREntry
	if from != nil {
		a = from.CIDR
	}
	if to != nil {
		b = to.CIDR
	}
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && CompareCIDR(a[i], b[j]) < 0):
			remove = append(remove, a[i])
			i++
		case i == len(a) || CompareCIDR(a[i], b[j]) > 0:
			upsert = append(upsert, b[j])
			j++
		default:
			if a[i].Allow != b[j].Allow {
				upsert = append(upsert, b[j])
			}
			i++
			j++
		}
	}
	return upsert, remove
}
