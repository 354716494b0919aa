package policy

import (
	"net/netip"
	"slices"

	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
)

// SetFQDN sets the addresses learned from DNS answers for name (an empty
// ips forgets the name). An address with a name some cached FQDN
// selector (toFQDNs) matches gets the CIDR identity of its host prefix
// (allocated as for a policy's CIDR, reported in CIDRUpserts for the
// ipcache), which those selectors select; an address no selector wants
// any more gives its reference back (CIDRDeletes once unreferenced).
// Names no selector matches are kept, for a selector imported later.
// The revision is not bumped: learned addresses change what selectors
// select, not the rules.
func (r *Repository) SetFQDN(name string, ips []netip.Addr) Result {
	name = fqdn.Normalize(name)
	want := make([]netip.Addr, 0, len(ips))
	for _, ip := range ips {
		if ip.IsValid() {
			want = append(want, ip.Unmap())
		}
	}
	slices.SortFunc(want, netip.Addr.Compare)
	want = slices.Compact(want)
	old := r.fqdnAddrs[name]
	if slices.Equal(old, want) {
		return Result{Revision: r.revision}
	}
	if len(want) == 0 {
		delete(r.fqdnAddrs, name)
	} else {
		r.fqdnAddrs[name] = want
	}
	affected := idSet{}
	// Only what selectors select changes: the policies that peer them
	// are patched (mapchanges.go).
	r.incremental = true
	for _, ip := range old {
		if _, keep := slices.BinarySearchFunc(want, ip, netip.Addr.Compare); !keep {
			r.fqdnUnlink(name, ip, affected)
		}
	}
	for _, ip := range want {
		if _, had := slices.BinarySearchFunc(old, ip, netip.Addr.Compare); !had {
			r.fqdnLink(name, ip, affected)
		}
	}
	return r.finish(affected)
}

// FQDNAddrs returns the addresses set for name.
func (r *Repository) FQDNAddrs(name string) []netip.Addr {
	return slices.Clone(r.fqdnAddrs[fqdn.Normalize(name)])
}

func (r *Repository) fqdnLink(name string, ip netip.Addr, affected idSet) {
	names := r.fqdnNames[ip]
	if names == nil {
		names = map[string]struct{}{}
		r.fqdnNames[ip] = names
	}
	names[name] = struct{}{}
	r.fqdnSync(ip, affected)
}

func (r *Repository) fqdnUnlink(name string, ip netip.Addr, affected idSet) {
	names := r.fqdnNames[ip]
	delete(names, name)
	if len(names) == 0 {
		delete(r.fqdnNames, ip)
	}
	r.fqdnSync(ip, affected)
}

// fqdnSync gives ip's host prefix a CIDR identity reference while a
// cached FQDN selector selects one of ip's names or a cached service
// selector one of ip's Services (services.go), takes it back when none
// does, and re-evaluates the selectors for that identity.
func (r *Repository) fqdnSync(ip netip.Addr, affected idSet) {
	p := netip.PrefixFrom(ip, ip.BitLen())
	want := r.fqdnWanted(ip) || r.svcWanted(ip)
	_, held := r.fqdnHeld[ip]
	switch {
	case want && !held:
		r.fqdnHeld[ip] = struct{}{}
		r.refPrefix(p, affected)
	case !want && held:
		delete(r.fqdnHeld, ip)
		r.unrefPrefix(p)
	}
	r.reselectPrefix(p, affected)
}

// fqdnWanted reports whether a cached FQDN selector matches a name of ip.
func (r *Repository) fqdnWanted(ip netip.Addr) bool {
	for name := range r.fqdnNames[ip] {
		for cs := range r.fqdnSels {
			if cs.sel.(*FQDNSelector).MatchesName(name) {
				return true
			}
		}
	}
	return false
}

// fqdnSelectorChanged syncs the addresses with a name f matches, after
// f's cache entry was made or dropped (the identities affected are
// recomputed by the next finish).
func (r *Repository) fqdnSelectorChanged(f *FQDNSelector) {
	for ip, names := range r.fqdnNames {
		for name := range names {
			if f.MatchesName(name) {
				r.fqdnSync(ip, r.staged)
				break
			}
		}
	}
}

// reselectPrefix re-evaluates the selectors for the CIDR identity of p.
func (r *Repository) reselectPrefix(p netip.Prefix, affected idSet) {
	if c, ok := r.cidrs[p]; ok {
		r.reselect(c.id, r.ids[c.id], affected)
	}
}

// fqdnSelects reports whether s selects the CIDR identity of p: a host
// prefix learned for a name s matches.
func (r *Repository) fqdnSelects(s *FQDNSelector, p netip.Prefix) bool {
	if p.Bits() != p.Addr().BitLen() {
		return false
	}
	for name := range r.fqdnNames[p.Addr()] {
		if s.MatchesName(name) {
			return true
		}
	}
	return false
}
