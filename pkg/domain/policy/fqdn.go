package policy

import (
	"net/netip"
	"slices"

	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
)

// SetFQDN sets the addresses learned from DNS answers for name (an empty
// ips forgets the name). Each address with a name gets the CIDR identity
// of its host prefix (allocated as for a policy's CIDR, reported in
// CIDRUpserts for the ipcache), which the FQDN selectors matching one of
// its names select; an address without names left gives its reference
// back (CIDRDeletes once unreferenced). The revision is not bumped:
// learned addresses change what selectors select, not the rules.
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
	p := netip.PrefixFrom(ip, ip.BitLen())
	if len(names) == 1 {
		r.refPrefix(p, affected)
	}
	r.reselectPrefix(p, affected)
}

func (r *Repository) fqdnUnlink(name string, ip netip.Addr, affected idSet) {
	names := r.fqdnNames[ip]
	delete(names, name)
	p := netip.PrefixFrom(ip, ip.BitLen())
	r.reselectPrefix(p, affected)
	if len(names) == 0 {
		delete(r.fqdnNames, ip)
		r.reselectPrefix(p, affected)
		r.unrefPrefix(p)
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
