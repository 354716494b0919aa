package policy

import (
	"cmp"
	"encoding/binary"
	"maps"
	"net/netip"
	"slices"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// register adds p's rules: CIDR identities first (so new selectors see
// them), then its selectors; the identities it selects are affected.
func (r *Repository) register(p *Policy, affected idSet) {
	key := p.Key()
	r.policies[key] = p
	for _, rule := range p.Rules {
		forPeers(rule, func(s Selector) { r.refCIDRs(s, affected) })
	}
	for i, rule := range p.Rules {
		cs := r.ref(rule.Subject)
		cs.subjectOf = append(cs.subjectOf, ruleRef{policy: p, rule: i})
		forPeers(rule, func(s Selector) { r.ref(s).peerOf[key]++ })
		for id := range cs.ids {
			affected[id] = struct{}{}
		}
	}
}

// unregister removes p's rules; the identities it selected are affected.
func (r *Repository) unregister(p *Policy, affected idSet) {
	key := p.Key()
	for i, rule := range p.Rules {
		cs := r.selectors[rule.Subject.Key()]
		for id := range cs.ids {
			affected[id] = struct{}{}
		}
		cs.subjectOf = slices.DeleteFunc(cs.subjectOf, func(ref ruleRef) bool { return ref.policy == p && ref.rule == i })
		r.unref(rule.Subject)
		forPeers(rule, func(s Selector) {
			ps := r.selectors[s.Key()]
			if ps.peerOf[key]--; ps.peerOf[key] == 0 {
				delete(ps.peerOf, key)
			}
			r.unref(s)
			r.unrefCIDRs(s)
		})
	}
	delete(r.policies, key)
}

func forPeers(rule Rule, fn func(Selector)) {
	for _, prs := range [][]PeerRule{rule.Ingress, rule.Egress} {
		for _, pr := range prs {
			for _, s := range pr.Peers {
				fn(s)
			}
		}
	}
}

// ref takes a reference on the cache entry of sel, creating it (one scan
// of the known identities) when it is new.
func (r *Repository) ref(sel Selector) *cachedSelector {
	key := sel.Key()
	if cs, ok := r.selectors[key]; ok {
		cs.users++
		return cs
	}
	r.serial++
	cs := &cachedSelector{sel: sel, ids: idSet{}, users: 1, peerOf: map[string]int{}, serial: r.serial}
	for id, ls := range r.ids {
		if sel.Matches(ls) {
			cs.ids[id] = struct{}{}
		}
	}
	r.selectors[key] = cs
	return cs
}

func (r *Repository) unref(sel Selector) {
	key := sel.Key()
	cs := r.selectors[key]
	if cs.users--; cs.users == 0 {
		delete(r.selectors, key)
	}
}

// cidrPrefixes returns the prefixes of a CIDR selector that need their
// own identity: the prefix (unless /0: nothing to tell apart from the
// world) and the excepts.
func cidrPrefixes(s Selector) []netip.Prefix {
	c, ok := s.(*CIDRSelector)
	if !ok {
		return nil
	}
	var out []netip.Prefix
	if c.Prefix.Bits() > 0 {
		out = append(out, c.Prefix)
	}
	return append(out, c.Except...)
}

func (r *Repository) refCIDRs(s Selector, affected idSet) {
	for _, p := range cidrPrefixes(s) {
		if c, ok := r.cidrs[p]; ok {
			if c.refs == 0 {
				r.pendingUp()[p] = c.id // a seed or a prefix about to be dropped
			}
			c.refs++
			continue
		}
		id := r.allocCIDR()
		r.cidrs[p] = &cidrIdentity{id: id, refs: 1}
		r.ids[id] = CIDRLabels(p)
		r.reselect(id, affected)
		r.pendingUp()[p] = id
	}
}

func (r *Repository) unrefCIDRs(s Selector) {
	for _, p := range cidrPrefixes(s) {
		if c, ok := r.cidrs[p]; ok && c.refs > 0 {
			c.refs-- // dropped in finish when it stays 0
		}
	}
}

func (r *Repository) pendingUp() map[netip.Prefix]identity.NumericIdentity {
	if r.upserts == nil {
		r.upserts = map[netip.Prefix]identity.NumericIdentity{}
	}
	return r.upserts
}

func (r *Repository) allocCIDR() identity.NumericIdentity {
	if n := len(r.freeCIDR); n > 0 {
		id := r.freeCIDR[n-1]
		r.freeCIDR = r.freeCIDR[:n-1]
		return id
	}
	id := r.nextCIDR
	r.nextCIDR++
	return id
}

// reselect updates every selector's set for identity id (added, changed
// or removed) and marks as affected the identities whose rules use a
// selector whose set changed, and id itself if a subject selects it.
func (r *Repository) reselect(id identity.NumericIdentity, affected idSet) {
	ls, present := r.ids[id]
	for _, cs := range r.selectors {
		m := present && cs.sel.Matches(ls)
		_, had := cs.ids[id]
		if len(cs.subjectOf) > 0 && (m || had) {
			affected[id] = struct{}{}
		}
		if m == had {
			continue
		}
		if m {
			cs.ids[id] = struct{}{}
		} else {
			delete(cs.ids, id)
		}
		for pk := range cs.peerOf {
			for _, rule := range r.policies[pk].Rules {
				if ss := r.selectors[rule.Subject.Key()]; ss != nil {
					for sid := range ss.ids {
						affected[sid] = struct{}{}
					}
				}
			}
		}
	}
}

// finish drops unreferenced CIDR identities, recomputes the cached
// policies of the affected identities and reports those that changed.
func (r *Repository) finish(affected idSet) Result {
	r.bySubjects = nil // selectors or rules changed
	res := Result{Revision: r.revision}
	for _, p := range slices.SortedFunc(maps.Keys(r.cidrs), comparePrefix) {
		c := r.cidrs[p]
		if c.refs > 0 {
			continue
		}
		delete(r.cidrs, p)
		delete(r.ids, c.id)
		delete(r.mapStates, c.id)
		delete(r.upserts, p)
		r.reselect(c.id, affected)
		r.freeCIDR = append(r.freeCIDR, c.id)
		res.CIDRDeletes = append(res.CIDRDeletes, p)
	}
	res.CIDRUpserts, r.upserts = r.upserts, nil
	for _, id := range slices.Sorted(maps.Keys(affected)) {
		old, had := r.mapStates[id]
		if !had {
			continue // nobody asked: computed on demand
		}
		m := r.compute(id)
		if old.Equal(m) {
			continue
		}
		r.mapStates[id] = m
		res.Changed = append(res.Changed, Change{Identity: id, Policy: m})
	}
	return res
}

// compute builds the MapState of id from the rules whose subject
// selector's cached set holds id and the cached sets of their peers.
// Identities selected by the same subject selectors get the same policy,
// so it is computed once per such set (per change) and shared.
func (r *Repository) compute(id identity.NumericIdentity) *MapState {
	var subjects []*cachedSelector
	for _, cs := range r.selectors {
		if len(cs.subjectOf) == 0 {
			continue
		}
		if _, ok := cs.ids[id]; ok {
			subjects = append(subjects, cs)
		}
	}
	if len(subjects) == 0 {
		return nil
	}
	slices.SortFunc(subjects, func(a, b *cachedSelector) int { return cmp.Compare(a.serial, b.serial) })
	sig := make([]byte, 0, 8*len(subjects))
	for _, cs := range subjects {
		sig = binary.AppendUvarint(sig, cs.serial)
	}
	if m, ok := r.bySubjects[string(sig)]; ok {
		return m
	}
	var ingress, egress bool
	var keys []Key
	groups := map[cidrGroup][]*CIDRSelector{}
	for _, cs := range subjects {
		for _, ref := range cs.subjectOf {
			rule := &ref.policy.Rules[ref.rule]
			if rule.IngressEnforced {
				ingress = true
				keys = r.appendKeys(keys, rule.Ingress, Ingress)
				addCIDRGroups(groups, rule.Ingress, Ingress)
			}
			if rule.EgressEnforced {
				egress = true
				keys = r.appendKeys(keys, rule.Egress, Egress)
				addCIDRGroups(groups, rule.Egress, Egress)
			}
		}
	}
	var m *MapState
	if ingress || egress {
		m = NewMapState(r.revision, ingress, egress, keys)
		m.CIDR = cidrEntries(groups)
	}
	if r.bySubjects == nil {
		r.bySubjects = map[string]*MapState{}
	}
	r.bySubjects[string(sig)] = m
	return m
}

var anyPort = []PortProto{{0, ProtoAny}}

func (r *Repository) appendKeys(keys []Key, prs []PeerRule, dir Direction) []Key {
	for _, pr := range prs {
		ports := pr.Ports
		if len(ports) == 0 {
			ports = anyPort
		}
		emit := func(peer identity.NumericIdentity) {
			for _, pp := range ports {
				keys = append(keys, Key{Identity: peer, Port: pp.Port, Proto: pp.Proto, Dir: dir})
			}
		}
		if pr.Any {
			emit(0)
			continue
		}
		for _, s := range pr.Peers {
			for peer := range r.selectors[s.Key()].ids {
				emit(peer)
			}
		}
	}
	return keys
}

// addCIDRGroups adds the CIDR selectors of prs to the groups of their
// ports. They also select CIDR identities (appendKeys), which decide
// the same for addresses the ipcache maps to those identities; the CIDR
// entries decide for every address, a pod's too.
func addCIDRGroups(groups map[cidrGroup][]*CIDRSelector, prs []PeerRule, dir Direction) {
	for _, pr := range prs {
		ports := pr.Ports
		if len(ports) == 0 {
			ports = anyPort
		}
		for _, s := range pr.Peers {
			c, ok := s.(*CIDRSelector)
			if !ok {
				continue
			}
			for _, pp := range ports {
				g := cidrGroup{dir: dir, proto: pp.Proto, port: pp.Port}
				groups[g] = append(groups[g], c)
			}
		}
	}
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}
