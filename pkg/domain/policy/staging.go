package policy

// Staging prepares an import in steps, so that the repository's owner
// can serve other requests between them: each step creates the selector
// cache entries (and CIDR identities) of some of the policies' selectors
// and holds them. No rule changes before Import, so a policy computed
// between steps is the one before the import (its peers may hold the new
// CIDR identities inside prefixes they already allowed; the next change
// recomputes it).
//
// Only Stage's repository changes it, and nothing imports or deletes
// policies in that repository between Stage and Import (identities may
// change).
type Staging struct {
	r    *Repository
	pols []*Policy
	todo []Selector // selectors still to prepare
	held []Selector // prepared: one selector reference and its CIDR references each
}

// Stage returns the staging of importing pols.
func (r *Repository) Stage(pols []*Policy) *Staging {
	s := &Staging{r: r, pols: pols}
	for _, p := range pols {
		for _, rule := range p.Rules {
			s.todo = append(s.todo, rule.Subject)
			forPeers(rule, func(sel Selector) { s.todo = append(s.todo, sel) })
		}
	}
	return s
}

// Step prepares up to n more selectors and reports whether all are.
func (s *Staging) Step(n int) bool {
	n = min(n, len(s.todo))
	batch := s.todo[:n]
	s.todo = s.todo[n:]
	for _, sel := range batch { // CIDR identities first, as importPolicies
		s.r.refCIDRs(sel, s.r.staged)
	}
	for _, sel := range batch {
		s.r.ref(sel)
	}
	s.held = append(s.held, batch...)
	return len(s.todo) == 0
}

// Import imports the staged policies, as Repository.Import, and releases
// what the steps held. Selectors not prepared yet are prepared now.
func (s *Staging) Import() Result {
	return s.r.importPolicies(s.pols, func() {
		for _, sel := range s.held {
			s.r.unref(sel)
			s.r.unrefCIDRs(sel)
		}
		s.held = nil
	})
}
