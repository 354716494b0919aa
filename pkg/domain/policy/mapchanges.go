package policy

import (
	"fmt"
	"slices"
	"weak"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// Incremental policy changes (Cilium's MapChanges). When a change only
// changes which identities selectors select (a DNS answer's new address:
// a new CIDR identity the FQDN selectors select, SetFQDN), the policy of
// an identity whose own subjects did not change differs from its cached
// one only in the entries whose peer is one of the identities the change
// re-evaluated (peerIDs): every entry is built for one peer identity (or
// any peer, 0), and a deny meets an allow only when their peers are
// equal or one of them is any peer (intersect), so the entries of peer P
// depend on the rules, the selectors' membership of P and the entries of
// any peer alone. patchFor builds those entries alone (build with only)
// and replaces them in a copy of the cached policy; finish keeps the full
// recompute for every other change and identity, and the tests compare
// the two (mapchanges_test.go).
//
// The patched policy remembers what it was patched from (patchStep):
// the datapath, holding that policy, writes only the entries of the
// peers changed since (PatchedFrom, DiffPeers) instead of diffing the
// whole policy map.

// maxPatchSteps is how many patches back a policy remembers: an
// endpoint whose realised policy is older diffs its whole map.
const maxPatchSteps = 8

// patchStep records that a policy differs from the policy from (weakly
// held: the step keeps no old policy alive) only in the entries of
// peers (sorted).
type patchStep struct {
	from  weak.Pointer[MapState]
	peers []identity.NumericIdentity
}

// patchFor returns old (id's cached policy) with the entries of peers
// recomputed, or id's full recompute when the policy holds what the
// patch does not rebuild (named ingress entries' L7 rules, whose
// builder ForPorts merges into). patched shares one patch between the
// identities that shared old.
func (r *Repository) patchFor(id identity.NumericIdentity, old *MapState, peers []identity.NumericIdentity, patched map[*MapState]*MapState) *MapState {
	if m, ok := patched[old]; ok {
		return m
	}
	m := r.patch(id, old, peers)
	if m == nil {
		return r.compute(id)
	}
	patched[old] = m
	return m
}

// patch returns old with the entries of peers rebuilt, or nil when it
// cannot patch old.
func (r *Repository) patch(id identity.NumericIdentity, old *MapState, peers []identity.NumericIdentity) *MapState {
	if old.l7 != nil || len(peers) == 0 {
		return nil
	}
	subjects := r.subjectsOf(id)
	if len(subjects) == 0 {
		return nil
	}
	part := r.build(id, subjects, peers)
	if part == nil || part.IngressEnforced != old.IngressEnforced || part.EgressEnforced != old.EgressEnforced || len(part.NamedL7) > 0 {
		return nil
	}
	groups, named := peerGroups(peers), make([]uint64, len(peers))
	for i, p := range peers {
		named[i] = uint64(p)
	}
	namedGroup := func(k NamedKey) uint64 { return uint64(k.Identity) }
	// The first patch of old may append to old's arrays past their
	// length (old's readers never look there): a new address's entries
	// sort last (its CIDR identity is the newest), so they cost no copy.
	tail := !old.tailTaken
	old.tailTaken = true
	m := &MapState{
		Revision:        r.revision,
		IngressEnforced: old.IngressEnforced, EgressEnforced: old.EgressEnforced,
		Allow:      replacePeers(old.Allow, part.Allow, groups, keyGroup, tail),
		Deny:       replacePeers(old.Deny, part.Deny, groups, keyGroup, tail),
		CIDR:       old.CIDR,
		L7:         replacePeers(old.L7, part.L7, groups, func(e L7Entry) uint64 { return keyGroup(e.Key) }, tail),
		DNS:        replacePeers(old.DNS, part.DNS, groups, func(e DNSEntry) uint64 { return keyGroup(e.Key) }, tail),
		Named:      replacePeers(old.Named, part.Named, named, namedGroup, tail),
		NamedDeny:  replacePeers(old.NamedDeny, part.NamedDeny, named, namedGroup, tail),
		cidrGroups: old.cidrGroups, namedCIDR: old.namedCIDR,
	}
	steps := old.steps
	if len(steps) >= maxPatchSteps {
		steps = steps[len(steps)-maxPatchSteps+1:]
	}
	m.steps = append(slices.Clip(steps), patchStep{from: weak.Make(old), peers: peers})
	m.self = weak.Make(m)
	return m
}

// replacePeers returns old without its elements whose group (grp: the
// direction and peer identity, which order old and part first) is one
// of groups (sorted), with part's elements of those groups in their
// place; nil when empty. Old is never changed: the result shares old's
// array when it is old with elements added after its last (appended
// past old's length, only when tail allows: the first patch of a
// policy) or its last elements dropped (capped, so that nothing is ever
// appended over old's elements); else the elements are copied in runs.
func replacePeers[T any](old, part []T, groups []uint64, grp func(T) uint64, tail bool) []T {
	lower := func(s []T, g uint64) int {
		lo, hi := 0, len(s)
		for lo < hi {
			m := int(uint(lo+hi) >> 1)
			if grp(s[m]) < g {
				lo = m + 1
			} else {
				hi = m
			}
		}
		return lo
	}
	runs := make([]peerRun, len(groups))
	removed, added := 0, 0
	prev := 0
	for i, g := range groups {
		lo := prev + lower(old[prev:], g)
		hi := lo + lower(old[lo:], g+1)
		plo := lower(part, g)
		phi := plo + lower(part[plo:], g+1)
		runs[i] = peerRun{lo, hi, plo, phi}
		removed, added = removed+hi-lo, added+phi-plo
		prev = hi
	}
	last := len(old) - 1
	switch {
	case removed == 0 && added == 0:
		return old
	case removed == 0 && tail && (last < 0 || allAfter(old[last], part, runs, grp)):
		out := old
		for _, r := range runs {
			out = append(out, part[r.plo:r.phi]...)
		}
		return out
	case added == 0 && tailRemoved(runs, len(old), removed):
		if n := len(old) - removed; n > 0 {
			return old[:n:n]
		}
		return nil
	}
	out := make([]T, 0, len(old)-removed+added)
	prev = 0
	for _, r := range runs {
		out = append(out, old[prev:r.lo]...)
		out = append(out, part[r.plo:r.phi]...)
		prev = r.hi
	}
	out = append(out, old[prev:]...)
	if len(out) == 0 {
		return nil
	}
	return out
}

// peerRun is one group's elements: old[lo:hi] replaced by part[plo:phi].
type peerRun struct{ lo, hi, plo, phi int }

// allAfter reports whether part's elements of runs all sort after last
// (their groups are greater than last's).
func allAfter[T any](last T, part []T, runs []peerRun, grp func(T) uint64) bool {
	for _, r := range runs {
		if r.phi > r.plo && grp(part[r.plo]) <= grp(last) {
			return false
		}
	}
	return true
}

// tailRemoved reports whether the removed ranges of runs (removed
// elements in all) are old's last elements (old has n).
func tailRemoved(runs []peerRun, n, removed int) bool {
	end := n
	for i := len(runs) - 1; i >= 0; i-- {
		r := runs[i]
		if r.hi == r.lo {
			continue
		}
		if r.hi != end {
			return false
		}
		end = r.lo
	}
	return n-end == removed
}

// keyGroup is a key's group for replacePeers: direction, then peer.
func keyGroup(k Key) uint64 { return uint64(k.Dir)<<32 | uint64(k.Identity) }

// peerGroups returns the groups (keyGroup) of peers in both directions,
// sorted.
func peerGroups(peers []identity.NumericIdentity) []uint64 {
	out := make([]uint64, 0, 2*len(peers))
	for _, dir := range []Direction{Ingress, Egress} {
		for _, p := range peers {
			out = append(out, keyGroup(Key{Dir: dir, Identity: p}))
		}
	}
	return out
}

// PatchedFrom reports whether m is have with the entries (Allow, Deny,
// L7, DNS, Named, NamedDeny) of the returned peer identities alone
// replaced, by the repository's incremental changes: its CIDR entries
// and enforcement are have's. A copy of a patched policy (ForPorts,
// WithDeny) is not patched.
func (m *MapState) PatchedFrom(have *MapState) ([]identity.NumericIdentity, bool) {
	if m == nil || have == nil || len(m.steps) == 0 || m.self != weak.Make(m) {
		return nil, false
	}
	from := weak.Make(have)
	for i := len(m.steps) - 1; i >= 0; i-- {
		if m.steps[i].from != from {
			continue
		}
		var peers []identity.NumericIdentity
		for _, s := range m.steps[i:] {
			peers = append(peers, s.peers...)
		}
		slices.Sort(peers)
		return slices.Compact(peers), true
	}
	return nil, false
}

// PeerKeys returns the entries of Allow whose peer is one of peers
// (sorted), sorted.
func (m *MapState) PeerKeys(peers []identity.NumericIdentity) []Key {
	if m == nil {
		return nil
	}
	var out []Key
	for _, dir := range []Direction{Ingress, Egress} {
		for _, p := range peers {
			lo, _ := slices.BinarySearchFunc(m.Allow, Key{Dir: dir, Identity: p}, Compare)
			hi := lo
			for hi < len(m.Allow) && m.Allow[hi].Dir == dir && m.Allow[hi].Identity == p {
				hi++
			}
			out = append(out, m.Allow[lo:hi]...)
		}
	}
	return out
}

// DiffPeers is Diff restricted to the entries whose peer is one of peers
// (sorted): with to.PatchedFrom(from) returning peers, it equals Diff.
func DiffPeers(from, to *MapState, peers []identity.NumericIdentity) (add, remove []Key) {
	a, b := &MapState{Allow: from.PeerKeys(peers)}, &MapState{Allow: to.PeerKeys(peers)}
	return Diff(a, b)
}

// RedirectsOf is Redirects for the entries keys of m alone.
func (m *MapState) RedirectsOf(keys []Key, ports ProxyPorts) (map[Key]uint16, error) {
	if !m.HasL7() && !m.HasDNS() {
		return nil, nil
	}
	var out map[Key]uint16
	for _, k := range keys {
		parser := L7Parser("")
		if _, ok := m.DNSRedirected(k); ok {
			parser = ParserDNS
		}
		if i, ok := slices.BinarySearchFunc(m.L7, k, func(e L7Entry, k Key) int { return Compare(e.Key, k) }); ok {
			parser = m.L7[i].Parser()
		}
		if parser == "" {
			continue
		}
		p := ports[parser]
		if p == 0 {
			return nil, fmt.Errorf("entry %+v: %w for parser %q", k, ErrNoProxy, parser)
		}
		if out == nil {
			out = map[Key]uint16{}
		}
		out[k] = p
	}
	return out, nil
}
