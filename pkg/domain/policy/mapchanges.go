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
	in := func(p identity.NumericIdentity) bool {
		_, ok := slices.BinarySearch(peers, p)
		return ok
	}
	keyPeer := func(k Key) identity.NumericIdentity { return k.Identity }
	m := &MapState{
		Revision:        r.revision,
		IngressEnforced: old.IngressEnforced, EgressEnforced: old.EgressEnforced,
		Allow:      replacePeers(old.Allow, part.Allow, in, keyPeer, Compare),
		Deny:       replacePeers(old.Deny, part.Deny, in, keyPeer, Compare),
		CIDR:       old.CIDR,
		L7:         replacePeers(old.L7, part.L7, in, func(e L7Entry) identity.NumericIdentity { return e.Key.Identity }, func(a, b L7Entry) int { return Compare(a.Key, b.Key) }),
		DNS:        replacePeers(old.DNS, part.DNS, in, func(e DNSEntry) identity.NumericIdentity { return e.Key.Identity }, func(a, b DNSEntry) int { return Compare(a.Key, b.Key) }),
		Named:      replacePeers(old.Named, part.Named, in, func(k NamedKey) identity.NumericIdentity { return k.Identity }, compareNamedKey),
		NamedDeny:  replacePeers(old.NamedDeny, part.NamedDeny, in, func(k NamedKey) identity.NumericIdentity { return k.Identity }, compareNamedKey),
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

// replacePeers returns old without its elements whose peer is one of
// those in reports, merged with those of part whose peer is (both sorted
// by cmp, as is the result); nil when empty.
func replacePeers[T any](old, part []T, in func(identity.NumericIdentity) bool, peer func(T) identity.NumericIdentity, cmp func(a, b T) int) []T {
	out := make([]T, 0, len(old)+len(part))
	i := 0
	for _, e := range part {
		if !in(peer(e)) {
			continue
		}
		for i < len(old) && cmp(old[i], e) < 0 {
			if !in(peer(old[i])) {
				out = append(out, old[i])
			}
			i++
		}
		out = append(out, e)
	}
	for ; i < len(old); i++ {
		if !in(peer(old[i])) {
			out = append(out, old[i])
		}
	}
	if len(out) == 0 {
		return nil
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
