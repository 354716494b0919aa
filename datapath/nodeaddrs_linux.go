package datapath

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NodeAddrs finds this node's underlay addresses as Cilium does without a
// Kubernetes Node object: per family, the default route's preferred
// source, else the first global unicast address of the device holding
// the default route (the lowest metric); for a family without a default
// route, the source address the kernel picks toward the first of toward
// of that family (the kvstore's endpoints). A family with neither has no
// address. Returns ErrClosed if the datapath is not open.
func (l *Linux) NodeAddrs(toward []netip.Addr) ([]netip.Addr, error) {
	var out []netip.Addr
	err := l.guard(func() error {
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			a, ok, err := l.defaultRouteAddr(fam)
			if err != nil {
				return err
			}
			if !ok {
				a, ok = l.sourceToward(fam, toward)
			}
			if ok {
				out = append(out, a)
			}
		}
		return nil
	})
	return out, err
}

// defaultRouteAddr is the node address of family fam by its default route.
func (l *Linux) defaultRouteAddr(fam int) (netip.Addr, bool, error) {
	rs, err := l.nl.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return netip.Addr{}, false, fmt.Errorf("node addresses: list routes: %w", err)
	}
	var defaults []netlink.Route
	for _, r := range rs {
		if r.Dst == nil || isDefaultNet(r.Dst) {
			defaults = append(defaults, r)
		}
	}
	slices.SortStableFunc(defaults, func(a, b netlink.Route) int { return a.Priority - b.Priority })
	for _, r := range defaults {
		if a, ok := globalAddr(r.Src); ok {
			return a, true, nil
		}
		idx := r.LinkIndex
		if idx == 0 && len(r.MultiPath) > 0 {
			idx = r.MultiPath[0].LinkIndex
		}
		if idx == 0 {
			continue
		}
		lk, err := l.nl.LinkByIndex(idx)
		if err != nil {
			continue // gone meanwhile
		}
		addrs, err := l.nl.AddrList(lk, fam)
		if err != nil {
			return netip.Addr{}, false, fmt.Errorf("node addresses: %s: %w", lk.Attrs().Name, err)
		}
		for _, ad := range addrs {
			if ad.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED|unix.IFA_F_DEPRECATED) != 0 {
				continue
			}
			if a, ok := globalAddr(ad.IP); ok {
				return a, true, nil
			}
		}
	}
	return netip.Addr{}, false, nil
}

// sourceToward is the source the kernel picks toward the first address of
// family fam in toward that it routes.
func (l *Linux) sourceToward(fam int, toward []netip.Addr) (netip.Addr, bool) {
	for _, dst := range toward {
		if dst.Is4() != (fam == netlink.FAMILY_V4) {
			continue
		}
		rs, err := l.nl.RouteGet(dst.AsSlice())
		if err != nil {
			continue
		}
		for _, r := range rs {
			if a, ok := globalAddr(r.Src); ok {
				return a, true
			}
		}
	}
	return netip.Addr{}, false
}

func isDefaultNet(n *net.IPNet) bool {
	ones, _ := n.Mask.Size()
	return ones == 0
}

// globalAddr is ip as a global unicast address (not loopback, link-local
// or unspecified).
func globalAddr(ip net.IP) (netip.Addr, bool) {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return a, false
	}
	a = a.Unmap()
	return a, a.IsGlobalUnicast() && !a.IsLinkLocalUnicast()
}
