package ipam

import (
	"fmt"
	"net/netip"
)

// Pool holds at most one Range per Family. Like Range it is not safe for
// concurrent use.
type Pool struct {
	v4, v6 *Range
}

// NewPool returns a Pool over v4 and v6; either may be nil when that family
// is not configured. It panics if v4 or v6 is a Range of the other family,
// which is a programming error.
func NewPool(v4, v6 *Range) *Pool {
	if v4 != nil && v4.Family() != IPv4 {
		panic(fmt.Sprintf("ipam: NewPool: v4 range %s is not IPv4", v4.Prefix()))
	}
	if v6 != nil && v6.Family() != IPv6 {
		panic(fmt.Sprintf("ipam: NewPool: v6 range %s is not IPv6", v6.Prefix()))
	}
	return &Pool{v4: v4, v6: v6}
}

// Range returns the Range of family f, or nil if f is not configured.
func (p *Pool) Range(f Family) *Range {
	switch f {
	case IPv4:
		return p.v4
	case IPv6:
		return p.v6
	}
	return nil
}

// RangeFor returns the Range of ip's family (an IPv4-mapped IPv6 address
// counts as IPv4), or nil if that family is not configured. It does not check
// that ip lies inside the Range; use Range.Contains for that.
func (p *Pool) RangeFor(ip netip.Addr) *Range {
	ip = ip.Unmap()
	switch {
	case ip.Is4():
		return p.v4
	case ip.Is6():
		return p.v6
	}
	return nil
}
