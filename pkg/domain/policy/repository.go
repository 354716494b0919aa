package policy

import (
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// MinCIDRIdentity is the first local identity given to a policy's CIDR
// prefix (Cilium's local identity scope, 1<<24).
const MinCIDRIdentity identity.NumericIdentity = 1 << 24

type idSet = map[identity.NumericIdentity]struct{}

// cachedSelector is a selector cache entry: the identities a selector
// matches, kept up to date as identities come and go.
type cachedSelector struct {
	sel Selector
	// cidr is sel when it is a CIDR selector.
	cidr *CIDRSelector
	ids  idSet
	// serial is unique per entry (the order subjects are combined in).
	serial uint64
	// users counts the rule references (subject or peer) holding it.
	users int
	// subjectOf lists the rules it is the subject of.
	subjectOf []ruleRef
	// peerOf counts, per policy key, the peer references to it (nil
	// until the first).
	peerOf map[string]int
}

type ruleRef struct {
	policy *Policy
	rule   int
}

// cidrIdentity is a CIDR prefix's local identity with its reference count.
type cidrIdentity struct {
	id   identity.NumericIdentity
	refs int
}

// Change is an identity whose computed policy changed. Known is false
// when nothing was cached for it before (after a restart of the owner):
// then only endpoints whose realised policy differs need regenerating.
type Change struct {
	Identity identity.NumericIdentity
	Policy   *MapState
	Known    bool
}

// Result is what a repository change did.
type Result struct {
	Revision uint64
	Changed  []Change
	// CIDRUpserts and CIDRDeletes are the ipcache entries of policy CIDR
	// prefixes to add and remove.
	CIDRUpserts map[netip.Prefix]identity.NumericIdentity
	CIDRDeletes []netip.Prefix
	// Reselected are the keys of the policies whose Selections may have
	// changed (SetService).
	Reselected []string
}

// Repository holds the policies, the selector cache and the computed
// MapState of every identity that asked. Not goroutine safe: the policy
// actor owns it.
type Repository struct {
	revision  uint64
	policies  map[string]*Policy
	ids       map[identity.NumericIdentity]labels.Labels // every known identity
	selectors map[string]*cachedSelector                 // by Selector.Key
	mapStates map[identity.NumericIdentity]*MapState
	cidrs     map[netip.Prefix]*cidrIdentity
	nextCIDR  identity.NumericIdentity
	freeCIDR  []identity.NumericIdentity
	serial    uint64
	// bySubjects shares computed policies between identities selected by
	// the same subject selectors (keyed by their serials); cleared by
	// every change.
	bySubjects map[string]*MapState
	// upserts collects the CIDR prefixes (re)gaining a reference during
	// one change, reported by finish.
	upserts map[netip.Prefix]identity.NumericIdentity

	// The indexes below spare a scan of every identity or selector per
	// change (cidrindex.go). cidrIDs maps each CIDR identity to its
	// prefix (the inverse of cidrs); cidrPrefixes orders those prefixes.
	cidrIDs      map[identity.NumericIdentity]netip.Prefix
	cidrPrefixes prefixSet
	// cidrSels holds the CIDR selector entries by prefix, otherSels the
	// others (labels, entities), subjects those that are a rule's subject.
	cidrSels  cidrSelectors
	otherSels map[*cachedSelector]struct{}
	subjects  map[*cachedSelector]struct{}
	// oddIDs are the identities, other than CIDR identities, that a CIDR
	// selector may match (world, labels of source cidr).
	oddIDs map[identity.NumericIdentity]struct{}
	// changed holds the entries whose set changed since the last finish,
	// which marks the subjects of the rules peering them as affected.
	changed map[*cachedSelector]struct{}
	// unused holds the CIDR prefixes left without references (or seeded)
	// since the last finish, which drops those still unreferenced.
	unused map[netip.Prefix]struct{}
	// staged holds the identities affected by a Staging's steps; the
	// next finish recomputes them.
	staged idSet
	// fqdnAddrs are the addresses learned for each (normalized) name
	// (SetFQDN), fqdnNames the names of each address. fqdnHeld are the
	// addresses a cached FQDN selector (fqdnSels) selects by one of their
	// names: each holds a reference on the CIDR identity of its host
	// prefix (the others have none: nothing could select it).
	fqdnAddrs map[string][]netip.Addr
	fqdnNames map[netip.Addr]map[string]struct{}
	fqdnHeld  map[netip.Addr]struct{}
	fqdnSels  map[*cachedSelector]struct{}
	// services are the Services toServices selectors resolve against
	// (SetService), by "namespace/name"; svcNames the Services (without
	// a pod selector) naming each backend address; svcSels the cached
	// service selectors (services.go).
	services map[string]*Service
	svcNames map[netip.Addr]map[string]struct{}
	svcSels  map[*cachedSelector]struct{}
	// portOwners are the named ports each endpoint declared, idPorts
	// their union per identity with a count of the endpoints declaring
	// each (namedports_repo.go). resolved caches MapStateFor per
	// identity and set of ports; cleared when the identity's policy
	// changes. clusterNums are, per name and protocol, the numbers
	// of idPorts with a count of the identities declaring each: what an
	// egress named port resolves to toward an identity that is no
	// endpoint's (clusterPorts). anyNamed counts the registered rules
	// with an egress entry toward any peer on a named port
	// (anyNamedEgress), whose subjects such an identity coming or going
	// affects.
	portOwners  map[string]portOwner
	idPorts     map[identity.NumericIdentity]map[NamedPort]int
	clusterNums map[portName]map[uint16]int
	resolved    map[identity.NumericIdentity]map[string]*MapState
	anyNamed    int
	// peerIDs are the identities reselect re-evaluated since the last
	// finish (their memberships of selectors may have changed), ownIDs
	// those of them a subject selector selected before or after (their
	// own policy may have changed). incremental is set by a change that
	// changes nothing else (SetFQDN): finish then patches the entries of
	// peerIDs into the cached policies of the other affected identities
	// instead of recomputing them (mapchanges.go).
	peerIDs, ownIDs idSet
	incremental     bool
}

// NewRepository returns an empty repository knowing the reserved identities.
func NewRepository() *Repository {
	r := &Repository{
		policies: map[string]*Policy{}, ids: map[identity.NumericIdentity]labels.Labels{},
		selectors: map[string]*cachedSelector{}, mapStates: map[identity.NumericIdentity]*MapState{},
		cidrs: map[netip.Prefix]*cidrIdentity{}, nextCIDR: MinCIDRIdentity,
		cidrIDs: map[identity.NumericIdentity]netip.Prefix{}, otherSels: map[*cachedSelector]struct{}{},
		subjects: map[*cachedSelector]struct{}{}, oddIDs: map[identity.NumericIdentity]struct{}{},
		changed: map[*cachedSelector]struct{}{}, unused: map[netip.Prefix]struct{}{}, staged: idSet{},
		fqdnAddrs: map[string][]netip.Addr{}, fqdnNames: map[netip.Addr]map[string]struct{}{},
		fqdnHeld: map[netip.Addr]struct{}{}, fqdnSels: map[*cachedSelector]struct{}{},
		services: map[string]*Service{}, svcNames: map[netip.Addr]map[string]struct{}{}, svcSels: map[*cachedSelector]struct{}{},
		portOwners: map[string]portOwner{}, idPorts: map[identity.NumericIdentity]map[NamedPort]int{},
		clusterNums: map[portName]map[uint16]int{},
		resolved:    map[identity.NumericIdentity]map[string]*MapState{},
		peerIDs:     idSet{}, ownIDs: idSet{},
	}
	for id := identity.ReservedHost; id <= identity.ReservedIngress; id++ {
		if ls, ok := identity.ReservedLabels(id); ok {
			r.setLabels(id, ls)
		}
	}
	return r
}

// Revision returns the repository revision, bumped by every import and delete.
func (r *Repository) Revision() uint64 { return r.revision }

// SetRevision sets the revision (rebuild after a restart).
func (r *Repository) SetRevision(rev uint64) { r.revision = rev }

// Policies returns the policies sorted by key.
func (r *Repository) Policies() []*Policy {
	out := slices.Collect(maps.Values(r.policies))
	slices.SortFunc(out, func(a, b *Policy) int { return strings.Compare(a.Key(), b.Key()) })
	return out
}

// SeedCIDR binds prefix to id before policies are re-imported after a
// restart, so CIDR identities keep their numbers. It has no references
// until a policy uses the prefix; Prune drops unused seeds.
func (r *Repository) SeedCIDR(p netip.Prefix, id identity.NumericIdentity) {
	if _, ok := r.cidrs[p]; ok || id < MinCIDRIdentity {
		return
	}
	r.addCIDR(p, id)
	r.unused[p] = struct{}{}
	r.nextCIDR = max(r.nextCIDR, id+1)
}

// Import adds or replaces policies (by namespace/name) and bumps the
// revision once. Of several policies with one key, the last wins.
func (r *Repository) Import(pols []*Policy) Result {
	return r.importPolicies(pols, nil)
}

// importPolicies imports pols, calling release (if not nil) once their
// rules hold their selectors.
func (r *Repository) importPolicies(pols []*Policy, release func()) Result {
	r.revision++
	affected := idSet{}
	last := make(map[string]int, len(pols))
	for i, p := range pols {
		last[p.Key()] = i
	}
	if len(last) < len(pols) {
		var kept []*Policy
		for i, p := range pols {
			if last[p.Key()] == i {
				kept = append(kept, p)
			}
		}
		pols = kept
	}
	// Every CIDR identity first: then the index of CIDR prefixes is
	// merged once, before the new selectors look into it.
	for _, p := range pols {
		if old, ok := r.policies[p.Key()]; ok {
			r.unregister(old, affected)
		}
		for _, rule := range p.Rules {
			forPeers(rule, func(s Selector) { r.refCIDRs(s, affected) })
		}
	}
	for _, p := range pols {
		r.register(p, affected)
	}
	if release != nil {
		release()
	}
	return r.finish(affected)
}

// DeleteByName removes one policy ("namespace/name"). Returns ErrNotFound.
func (r *Repository) DeleteByName(key string) (Result, error) {
	p, ok := r.policies[key]
	if !ok {
		return Result{Revision: r.revision}, ErrNotFound
	}
	r.revision++
	affected := idSet{}
	r.unregister(p, affected)
	return r.finish(affected), nil
}

// DeleteByLabels removes every policy whose metadata labels include sel
// and returns their keys; it bumps the revision even when nothing matched.
func (r *Repository) DeleteByLabels(sel map[string]string) (Result, []string) {
	r.revision++
	affected := idSet{}
	var deleted []string
	for _, p := range r.Policies() {
		match := true
		for k, v := range sel {
			if got, ok := p.Labels[k]; !ok || got != v {
				match = false
				break
			}
		}
		if match {
			r.unregister(p, affected)
			deleted = append(deleted, p.Key())
		}
	}
	return r.finish(affected), deleted
}

// UpsertIdentity adds or relabels an identity and returns the identities
// whose policy changed because selectors now match differently.
func (r *Repository) UpsertIdentity(id identity.NumericIdentity, ls labels.Labels) Result {
	old, ok := r.ids[id]
	if ok && old.Equal(ls) {
		return Result{Revision: r.revision}
	}
	r.setLabels(id, ls)
	affected := idSet{}
	r.reselect(id, old, affected) // marks id itself if a subject selected it before or now
	return r.finish(affected)
}

// RemoveIdentity forgets an identity (released).
func (r *Repository) RemoveIdentity(id identity.NumericIdentity) Result {
	old, ok := r.ids[id]
	if !ok || id.IsReserved() {
		return Result{Revision: r.revision}
	}
	delete(r.ids, id)
	delete(r.oddIDs, id)
	affected := idSet{}
	r.reselect(id, old, affected)
	delete(r.mapStates, id)
	delete(r.resolved, id)
	delete(affected, id)
	return r.finish(affected)
}

// setLabels records the labels of an identity other than a CIDR identity.
func (r *Repository) setLabels(id identity.NumericIdentity, ls labels.Labels) {
	r.ids[id] = ls
	if cidrLike(ls) {
		r.oddIDs[id] = struct{}{}
	} else {
		delete(r.oddIDs, id)
	}
}

// Known reports whether the repository knows identity id.
func (r *Repository) Known(id identity.NumericIdentity) bool {
	_, ok := r.ids[id]
	return ok
}

// MapState returns the policy of identity id (nil: nothing selects it),
// computing and caching it. Every caller gets the same shared pointer
// until the policy of id changes.
func (r *Repository) MapState(id identity.NumericIdentity) *MapState {
	if m, ok := r.mapStates[id]; ok {
		return m
	}
	m := r.compute(id)
	r.mapStates[id] = m
	return m
}

// Selectors returns the number of selector cache entries.
func (r *Repository) Selectors() int { return len(r.selectors) }

// CIDRs returns the CIDR prefix identities in use.
func (r *Repository) CIDRs() map[netip.Prefix]identity.NumericIdentity {
	out := make(map[netip.Prefix]identity.NumericIdentity, len(r.cidrs))
	for p, c := range r.cidrs {
		out[p] = c.id
	}
	return out
}
