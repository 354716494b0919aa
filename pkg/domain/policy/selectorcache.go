package policy

import (
	"cmp"
	"encoding/binary"
	"maps"
	"net/netip"
	"slices"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// register adds p's rules (its CIDR identities exist: importPolicies
// made them); the identities it selects are affected.
func (r *Repository) register(p *Policy, affected idSet) {
	key := p.Key()
	r.policies[key] = p
	for i, rule := range p.Rules {
		cs := r.ref(rule.Subject)
		cs.subjectOf = append(cs.subjectOf, ruleRef{policy: p, rule: i})
		r.subjects[cs] = struct{}{}
		if anyNamedEgress(&p.Rules[i]) {
			r.anyNamed++
		}
		forPeers(rule, func(s Selector) {
			ps := r.ref(s)
			if ps.peerOf == nil {
				ps.peerOf = map[string]int{}
			}
			ps.peerOf[key]++
		})
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
		if anyNamedEgress(&p.Rules[i]) {
			r.anyNamed--
		}
		if len(cs.subjectOf) == 0 {
			delete(r.subjects, cs)
		}
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
	for _, prs := range [][]PeerRule{rule.Ingress, rule.Egress, rule.IngressDeny, rule.EgressDeny} {
		for _, pr := range prs {
			for _, s := range pr.Peers {
				fn(s)
			}
		}
	}
}

// ref takes a reference on the cache entry of sel, creating it when it
// is new: a CIDR selector looks up the CIDR identities inside its prefix,
// any other scans the known identities.
func (r *Repository) ref(sel Selector) *cachedSelector {
	key := sel.Key()
	if cs, ok := r.selectors[key]; ok {
		cs.users++
		return cs
	}
	r.serial++
	cs := &cachedSelector{sel: sel, ids: idSet{}, users: 1, serial: r.serial}
	if c, ok := sel.(*CIDRSelector); ok {
		cs.cidr = c
		r.cidrPrefixes.inside(c.Prefix, func(p netip.Prefix) {
			if c.selects(p) {
				cs.ids[r.cidrs[p].id] = struct{}{}
			}
		})
		for id := range r.oddIDs {
			if c.Matches(r.ids[id]) {
				cs.ids[id] = struct{}{}
			}
		}
		r.cidrSels.add(cs)
	} else {
		for id, ls := range r.ids {
			if r.matches(cs, id, ls) {
				cs.ids[id] = struct{}{}
			}
		}
		r.otherSels[cs] = struct{}{}
	}
	r.selectors[key] = cs
	if f, ok := sel.(*FQDNSelector); ok {
		r.fqdnSels[cs] = struct{}{}
		r.fqdnSelectorChanged(f)
	}
	if s, ok := sel.(*ServiceSelector); ok {
		r.svcSels[cs] = struct{}{}
		r.svcSelectorChanged(s)
	}
	return cs
}

func (r *Repository) unref(sel Selector) {
	key := sel.Key()
	cs := r.selectors[key]
	if cs.users--; cs.users > 0 {
		return
	}
	delete(r.selectors, key)
	if cs.cidr != nil {
		r.cidrSels.remove(cs)
	} else {
		delete(r.otherSels, cs)
	}
	delete(r.changed, cs)
	if f, ok := sel.(*FQDNSelector); ok {
		delete(r.fqdnSels, cs)
		r.fqdnSelectorChanged(f)
	}
	if s, ok := sel.(*ServiceSelector); ok {
		delete(r.svcSels, cs)
		r.svcSelectorChanged(s)
	}
}

// matches reports whether cs selects identity id with labels ls. CIDR
// identities are matched by their prefix, never by parsing their label.
func (r *Repository) matches(cs *cachedSelector, id identity.NumericIdentity, ls labels.Labels) bool {
	if p, ok := r.cidrIDs[id]; ok {
		return r.matchesCIDR(cs, p, ls)
	}
	return r.matchesLabels(cs, ls)
}

// matchesLabels reports whether cs selects an identity (not a CIDR
// identity) with labels ls: a service selector by the pod selectors of
// the Services it names.
func (r *Repository) matchesLabels(cs *cachedSelector, ls labels.Labels) bool {
	if s, ok := cs.sel.(*ServiceSelector); ok {
		return r.svcMatchesLabels(s, ls)
	}
	return cs.sel.Matches(ls)
}

// matchesCIDR reports whether cs selects the CIDR identity of prefix p
// with labels ls. An FQDN selector selects a host prefix learned for a
// name it matches.
func (r *Repository) matchesCIDR(cs *cachedSelector, p netip.Prefix, ls labels.Labels) bool {
	switch s := cs.sel.(type) {
	case *CIDRSelector:
		return s.selects(p)
	case *EntitySelector:
		return s.Entity == EntityWorld
	case *FQDNSelector:
		return r.fqdnSelects(s, p)
	case *ServiceSelector:
		return r.svcSelectsPrefix(s, p)
	}
	return cs.sel.Matches(ls)
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
		r.refPrefix(p, affected)
	}
}

// refPrefix takes a reference on the CIDR identity of p, allocating it
// when p has none.
func (r *Repository) refPrefix(p netip.Prefix, affected idSet) {
	if c, ok := r.cidrs[p]; ok {
		if c.refs == 0 {
			r.pendingUp()[p] = c.id // a seed or a prefix about to be dropped
		}
		c.refs++
		return
	}
	id := r.allocCIDR()
	r.addCIDR(p, id)
	r.cidrs[p].refs = 1
	r.reselect(id, nil, affected)
	r.pendingUp()[p] = id
}

// addCIDR records the CIDR identity id of prefix p, without references.
func (r *Repository) addCIDR(p netip.Prefix, id identity.NumericIdentity) {
	r.cidrs[p] = &cidrIdentity{id: id}
	r.ids[id] = CIDRLabels(p)
	r.cidrIDs[id] = p
	r.cidrPrefixes.add(p)
}

func (r *Repository) unrefCIDRs(s Selector) {
	for _, p := range cidrPrefixes(s) {
		r.unrefPrefix(p)
	}
}

// unrefPrefix drops a reference on the CIDR identity of p; finish drops
// the identity when none is left.
func (r *Repository) unrefPrefix(p netip.Prefix) {
	if c, ok := r.cidrs[p]; ok && c.refs > 0 {
		if c.refs--; c.refs == 0 {
			r.unused[p] = struct{}{} // dropped in finish when it stays 0
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

// reselect updates the selector sets for identity id (added, changed or
// removed; old are its previous labels), marks id affected if a subject
// selects it before or after, and records the entries whose set changed
// (finish marks the subjects of the rules peering them). Only entries
// that can match id are visited: for a CIDR identity the CIDR selectors
// containing its prefix, for another identity the CIDR selectors only if
// it is world or cidr-labelled, before or after. An identity that is
// no endpoint's also affects the subjects of the rules resolving a named
// port for any peer (anyNamedUsers).
func (r *Repository) reselect(id identity.NumericIdentity, old labels.Labels, affected idSet) {
	ls, present := r.ids[id]
	p, isCIDR := r.cidrIDs[id]
	r.peerIDs[id] = struct{}{}
	check := func(cs *cachedSelector) {
		var m bool
		switch {
		case !present:
		case isCIDR:
			m = r.matchesCIDR(cs, p, ls)
		default:
			m = r.matchesLabels(cs, ls)
		}
		_, had := cs.ids[id]
		if len(cs.subjectOf) > 0 && (m || had) {
			affected[id] = struct{}{}
			r.ownIDs[id] = struct{}{}
		}
		if m == had {
			return
		}
		if m {
			cs.ids[id] = struct{}{}
		} else {
			delete(cs.ids, id)
		}
		r.changed[cs] = struct{}{}
	}
	for cs := range r.otherSels {
		check(cs)
	}
	if isCIDR {
		r.cidrSels.containing(p, check)
	} else if cidrLike(ls) || cidrLike(old) {
		r.cidrSels.all(check)
	}
	if !endpointIdentity(id) {
		r.anyNamedUsers(affected)
	}
}

// finish drops unreferenced CIDR identities, recomputes the cached
// policies of the affected identities and reports those that changed.
func (r *Repository) finish(affected idSet) Result {
	r.bySubjects = nil // selectors or rules changed
	res := Result{Revision: r.revision}
	var drop []netip.Prefix
	for p := range r.unused {
		if c, ok := r.cidrs[p]; ok && c.refs == 0 {
			drop = append(drop, p)
		}
	}
	clear(r.unused)
	slices.SortFunc(drop, comparePrefix)
	for _, p := range drop {
		c := r.cidrs[p]
		delete(r.cidrs, p)
		delete(r.ids, c.id)
		delete(r.mapStates, c.id)
		delete(r.resolved, c.id)
		delete(r.upserts, p)
		r.reselect(c.id, nil, affected)
		delete(r.cidrIDs, c.id)
		r.cidrPrefixes.remove(p)
		r.freeCIDR = append(r.freeCIDR, c.id)
		res.CIDRDeletes = append(res.CIDRDeletes, p)
	}
	res.CIDRUpserts, r.upserts = r.upserts, nil
	for cs := range r.changed {
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
	clear(r.changed)
	incr := r.incremental && len(r.staged) == 0
	for id := range r.staged {
		affected[id] = struct{}{}
	}
	clear(r.staged)
	var peers []identity.NumericIdentity
	if incr {
		peers = slices.Sorted(maps.Keys(r.peerIDs))
	}
	patched := map[*MapState]*MapState{}
	for _, id := range slices.Sorted(maps.Keys(affected)) {
		old, had := r.mapStates[id]
		if !had {
			continue // nobody asked: computed on demand
		}
		var m *MapState
		if _, own := r.ownIDs[id]; incr && !own && old != nil {
			m = r.patchFor(id, old, peers, patched)
		} else {
			m = r.compute(id)
		}
		if old.Equal(m) {
			continue
		}
		r.mapStates[id] = m
		delete(r.resolved, id)
		res.Changed = append(res.Changed, Change{Identity: id, Policy: m})
	}
	clear(r.peerIDs)
	clear(r.ownIDs)
	r.incremental = false
	return res
}

// compute builds the MapState of id from the rules whose subject
// selector's cached set holds id and the cached sets of their peers.
// Identities selected by the same subject selectors get the same policy,
// so it is computed once per such set (per change) and shared.
func (r *Repository) compute(id identity.NumericIdentity) *MapState {
	subjects := r.subjectsOf(id)
	if len(subjects) == 0 {
		return nil
	}
	// The host identity's rules are the host rules of its subjects,
	// another identity's the others (hostpolicy.go): a signature byte
	// keeps their shared policies apart.
	sig := make([]byte, 1, 1+8*len(subjects))
	if id == identity.ReservedHost {
		sig[0] = 1
	}
	for _, cs := range subjects {
		sig = binary.AppendUvarint(sig, cs.serial)
	}
	if m, ok := r.bySubjects[string(sig)]; ok {
		return m
	}
	m := r.build(id, subjects, nil)
	if r.bySubjects == nil {
		r.bySubjects = map[string]*MapState{}
	}
	r.bySubjects[string(sig)] = m
	return m
}

// subjectsOf returns the subject selectors selecting id, in serial order.
func (r *Repository) subjectsOf(id identity.NumericIdentity) []*cachedSelector {
	var subjects []*cachedSelector
	for cs := range r.subjects {
		if _, ok := cs.ids[id]; ok {
			subjects = append(subjects, cs)
		}
	}
	slices.SortFunc(subjects, func(a, b *cachedSelector) int { return cmp.Compare(a.serial, b.serial) })
	return subjects
}

// build computes the MapState of id from the rules of subjects. With
// only set, the peer entries are those of the peers in only and of any
// peer (identity 0) alone, and CIDR entries are left out: the part of
// the policy patchFor takes the entries of only from.
func (r *Repository) build(id identity.NumericIdentity, subjects []*cachedSelector, only []identity.NumericIdentity) *MapState {
	var ingress, egress, ingressOpen, egressOpen bool
	n, nd := 0, 0
	for _, cs := range subjects {
		for _, ref := range cs.subjectOf {
			rule := &ref.policy.Rules[ref.rule]
			if only != nil || !appliesTo(rule, id) {
				continue
			}
			n += r.countKeys(rule.Ingress) + r.countKeys(rule.Egress)
			nd += r.countKeys(rule.IngressDeny) + r.countKeys(rule.EgressDeny)
		}
	}
	keys, deny := make([]Key, 0, n), make([]Key, 0, nd)
	groups := map[cidrGroup][]*CIDRSelector{}
	var (
		l7  *l7Builder
		dns *dnsBuilder
	)
	for _, cs := range subjects {
		for _, ref := range cs.subjectOf {
			rule := &ref.policy.Rules[ref.rule]
			if !appliesTo(rule, id) {
				continue
			}
			if l7 == nil && (anyL7(rule.Ingress) || anyL7(rule.Egress)) {
				l7 = &l7Builder{}
			}
			if dns == nil && anyDNS(rule.Egress) {
				dns = &dnsBuilder{}
			}
		}
	}
	var (
		named, namedDeny []NamedKey
		namedL7          []NamedL7Entry
	)
	namedCIDR := map[namedGroup][]*CIDRSelector{}
	for _, cs := range subjects {
		for _, ref := range cs.subjectOf {
			rule := &ref.policy.Rules[ref.rule]
			if !appliesTo(rule, id) {
				continue
			}
			if rule.IngressEnforced || rule.IngressOpen {
				ingress = ingress || rule.IngressEnforced
				ingressOpen = ingressOpen || rule.IngressOpen
				keys = r.appendKeys(keys, rule.Ingress, Ingress, l7, nil, &named, &namedL7, only)
				deny = r.appendKeys(deny, rule.IngressDeny, Ingress, nil, nil, &namedDeny, nil, only)
				if only == nil {
					r.addCIDRGroups(groups, namedCIDR, rule.Ingress, Ingress, false)
					r.addCIDRGroups(groups, namedCIDR, rule.IngressDeny, Ingress, true)
				}
			}
			if rule.EgressEnforced || rule.EgressOpen {
				egress = egress || rule.EgressEnforced
				egressOpen = egressOpen || rule.EgressOpen
				keys = r.appendKeys(keys, rule.Egress, Egress, l7, dns, nil, nil, only)
				deny = r.appendKeys(deny, rule.EgressDeny, Egress, nil, nil, nil, nil, only)
				if only == nil {
					r.addCIDRGroups(groups, nil, rule.Egress, Egress, false)
					r.addCIDRGroups(groups, nil, rule.EgressDeny, Egress, true)
				}
			}
		}
	}
	// A direction only rules without default deny select is enforced
	// with an entry allowing any peer: their more specific entries (L7
	// redirects, denies) still decide what they match.
	if ingressOpen && !ingress {
		keys, ingress = append(keys, Key{Dir: Ingress}), true
	}
	if egressOpen && !egress {
		keys, egress = append(keys, Key{Dir: Egress}), true
	}
	var m *MapState
	if ingress || egress {
		m = NewMapState(r.revision, ingress, egress, keys)
		m.CIDR = cidrEntries(groups)
		m.L7 = l7.entries()
		m.DNS = dns.entries()
		m.applyDeny(deny)
		if len(named) > 0 {
			slices.SortFunc(named, compareNamedKey)
			m.Named = slices.Compact(named)
		}
		if len(namedDeny) > 0 {
			slices.SortFunc(namedDeny, compareNamedKey)
			m.NamedDeny = slices.Compact(namedDeny)
		}
		if len(namedL7) > 0 {
			slices.SortFunc(namedL7, compareNamedL7)
			m.NamedL7 = slices.CompactFunc(namedL7, func(a, b NamedL7Entry) bool { return compareNamedL7(a, b) == 0 })
			m.l7 = l7
		}
		if len(namedCIDR) > 0 {
			m.cidrGroups, m.namedCIDR = groups, namedCIDR
		}
	}
	return m
}

var anyPort = []PortProto{{Port: 0, Proto: ProtoAny}}

// countKeys returns (at most) how many keys appendKeys adds for prs.
func (r *Repository) countKeys(prs []PeerRule) int {
	n := 0
	for _, pr := range prs {
		peers := 1
		if !pr.Any {
			peers = 0
			for _, s := range pr.Peers {
				peers += len(r.selectors[s.Key()].ids)
			}
		}
		n += peers * max(len(pr.Ports), 1)
	}
	return n
}

// appendKeys appends the keys of prs and records their L7 rules in l7
// and their DNS rules in dns. A named port is resolved in egress
// against each peer identity's ports when it is an endpoint's, against
// every endpoint's (clusterPorts) when it is not: world, reserved, CIDR
// and per-node identities declare none (peerNums). For any peer it is
// resolved so for every endpoint identity declaring it and every known
// identity that is no endpoint's. The resolved keys take the rule's L7
// and DNS rules; in
// ingress it is left to each endpoint and appended to named, and, when
// l7 records, to namedL7 with its L7 rules (ForPorts adds them to l7's
// once resolved). Deny entries' named ports resolve the same way, into
// deny keys (egress) or named deny keys (ingress, named is NamedDeny's).
//
// With only set (sorted), the keys of other peers than those of only and
// any peer (0) are left out.
func (r *Repository) appendKeys(keys []Key, prs []PeerRule, dir Direction, l7 *l7Builder, dns *dnsBuilder, named *[]NamedKey, namedL7 *[]NamedL7Entry, only []identity.NumericIdentity) []Key {
	for _, pr := range prs {
		ports := pr.Ports
		if len(ports) == 0 {
			ports = anyPort
		}
		emit := func(peer identity.NumericIdentity, onlyNamed bool) {
			for _, pp := range ports {
				if onlyNamed && pp.Name == "" {
					continue
				}
				if pp.Name != "" {
					if dir == Ingress {
						nk := NamedKey{Identity: peer, Name: pp.Name, Proto: pp.Proto}
						*named = append(*named, nk)
						if l7 != nil {
							*namedL7 = append(*namedL7, NamedL7Entry{Key: nk, HTTP: pr.HTTP, Kafka: pr.Kafka})
						}
						continue
					}
					if peer == 0 {
						continue // resolved per peer below
					}
					for _, n := range r.peerNums(peer, pp.Name, pp.Proto) {
						k := Key{Identity: peer, Port: n, Proto: pp.Proto, Dir: dir}
						keys = append(keys, k)
						l7.add(k, pr.HTTP, pr.Kafka)
						dns.add(k, pr.DNS)
					}
					continue
				}
				k := Key{Identity: peer, Port: pp.Port, Proto: pp.Proto, Dir: dir}
				keys = append(keys, k)
				l7.add(k, pr.HTTP, pr.Kafka)
				dns.add(k, pr.DNS)
			}
		}
		if pr.Any {
			emit(0, false)
			if dir == Egress && hasNamedPort(pr.Ports) && only != nil {
				for _, peer := range only {
					_, declares := r.idPorts[peer]
					_, known := r.ids[peer]
					if (endpointIdentity(peer) && declares) || (!endpointIdentity(peer) && known && len(r.clusterNums) > 0) {
						emit(peer, true)
					}
				}
				continue
			}
			if dir == Egress && hasNamedPort(pr.Ports) {
				for peer := range r.idPorts {
					if endpointIdentity(peer) {
						emit(peer, true)
					}
				}
				if len(r.clusterNums) > 0 {
					for peer := range r.ids {
						if !endpointIdentity(peer) {
							emit(peer, true)
						}
					}
				}
			}
			continue
		}
		for _, s := range pr.Peers {
			ids := r.selectors[s.Key()].ids
			if only != nil {
				for _, peer := range only {
					if _, ok := ids[peer]; ok {
						emit(peer, false)
					}
				}
				continue
			}
			for peer := range ids {
				emit(peer, false)
			}
		}
	}
	return keys
}

// addCIDRGroups adds the CIDR selectors of prs to the groups of their
// ports. They also select CIDR identities (appendKeys), which decide
// the same for addresses the ipcache maps to those identities; the CIDR
// entries decide for every address, a pod's too.
//
// A CIDR rule on a named port goes, in ingress, to named (the
// endpoint's own port, resolved by ForPorts); in egress (named is nil)
// to the group of each number the cluster's endpoints give the name
// (clusterPorts: an address declares no ports), none when no endpoint
// declares it.
//
// Deny entries' selectors go to deny groups (deny set), which drop what
// their longest match holds; on a named port to named deny groups
// (ingress) or the resolved numbers' deny groups (egress).
func (r *Repository) addCIDRGroups(groups map[cidrGroup][]*CIDRSelector, named map[namedGroup][]*CIDRSelector, prs []PeerRule, dir Direction, deny bool) {
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
				if pp.Name != "" {
					if named != nil {
						ng := namedGroup{name: pp.Name, proto: pp.Proto, deny: deny}
						named[ng] = append(named[ng], c)
						continue
					}
					for _, n := range r.clusterPorts(pp.Name, pp.Proto) {
						g := cidrGroup{dir: dir, proto: pp.Proto, port: n, deny: deny}
						groups[g] = append(groups[g], c)
					}
					continue
				}
				g := cidrGroup{dir: dir, proto: pp.Proto, port: pp.Port, deny: deny}
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
