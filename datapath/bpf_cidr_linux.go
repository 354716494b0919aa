package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// cidrPrefixBase is bpf/endpoint.h's CIDR_PREFIX_BASE: the bits of
// {dir, proto, dport, family, pad} every CIDR entry matches whole.
const cidrPrefixBase = 64

// cidrDirDeny marks the deny groups in a CIDR key's dir (CIDR_DIR_DENY).
const cidrDirDeny = 2

// cidrKey encodes e; it refuses entries the programs cannot express.
func cidrKey(e policy.CIDREntry) (bpf.EndpointCidrKey, error) {
	switch {
	case !e.Prefix.IsValid() || e.Prefix.Addr().Is4In6() || e.Prefix != e.Prefix.Masked():
		return bpf.EndpointCidrKey{}, fmt.Errorf("cidr entry %+v: prefix not masked or IPv4-mapped: %w", e, ErrInvalidPolicy)
	case e.Proto == policy.ProtoAny && e.Port != 0:
		return bpf.EndpointCidrKey{}, fmt.Errorf("cidr entry %+v: port without protocol: %w", e, ErrInvalidPolicy)
	case e.Dir != policy.Ingress && e.Dir != policy.Egress:
		return bpf.EndpointCidrKey{}, fmt.Errorf("cidr entry %+v: bad direction: %w", e, ErrInvalidPolicy)
	}
	return encodeCIDRKey(e), nil
}

func encodeCIDRKey(e policy.CIDREntry) bpf.EndpointCidrKey {
	k := bpf.EndpointCidrKey{
		Prefixlen: cidrPrefixBase + uint32(e.Prefix.Bits()),
		Dir:       uint8(e.Dir), Proto: e.Proto, Dport: e.Port, Family: familyV6,
	}
	if e.Deny {
		k.Dir |= cidrDirDeny
	}
	if e.Prefix.Addr().Is4() {
		k.Family = familyV4
	}
	var b [16]byte
	copy(b[:], e.Prefix.Addr().AsSlice())
	k.Addr = addrWords(b)
	return k
}

func decodeCIDRKey(k bpf.EndpointCidrKey, v bpf.EndpointCidrValue) (policy.CIDREntry, bool) {
	b := addrBytes(k.Addr)
	var addr netip.Addr
	switch k.Family {
	case familyV4:
		addr = netip.AddrFrom4([4]byte(b[:4]))
	case familyV6:
		addr = netip.AddrFrom16(b)
	default:
		return policy.CIDREntry{}, false
	}
	p, err := addr.Prefix(int(k.Prefixlen) - cidrPrefixBase)
	if err != nil || int(k.Prefixlen) < cidrPrefixBase {
		return policy.CIDREntry{}, false
	}
	return policy.CIDREntry{Dir: policy.Direction(k.Dir &^ cidrDirDeny), Deny: k.Dir&cidrDirDeny != 0,
		Proto: k.Proto, Port: k.Dport, Prefix: p, Allow: v.Allow != 0}, true
}

// dumpCIDRMap reads a CIDR policy map, sorted by policy.CompareCIDR.
// Keys that do not decode (none are written) are skipped.
func dumpCIDRMap(m *ebpf.Map) ([]CIDRPolicyEntry, error) {
	var k bpf.EndpointCidrKey
	var v bpf.EndpointCidrValue
	var out []CIDRPolicyEntry
	it := m.Iterate()
	for it.Next(&k, &v) {
		if e, ok := decodeCIDRKey(k, v); ok {
			out = append(out, CIDRPolicyEntry{Entry: e, Packets: v.Packets, Bytes: v.Bytes})
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("dump cidr policy map: %w", err)
	}
	slices.SortFunc(out, func(a, b CIDRPolicyEntry) int { return policy.CompareCIDR(a.Entry, b.Entry) })
	return out, nil
}

// syncCIDRMap makes m hold want's CIDR entries, given that it holds
// have's. Order: entries that drop written first (deny groups' holding
// entries, then allow groups' excepts), then those that let through
// (allow groups' allowing entries, then deny groups' excepts); removals
// the other way round. At every step each group's longest match of an
// address allows it only if have or want does: a written allow is
// reached only once the denies beneath it are in place, and removing an
// allow before the denies beneath it can only let an address fall back
// to an entry have or want agrees with.
func syncCIDRMap(m *ebpf.Map, have, want *policy.MapState) error {
	upsert, remove := policy.DiffCIDR(have, want)
	keys := make([]bpf.EndpointCidrKey, len(upsert))
	for i, e := range upsert {
		k, err := cidrKey(e)
		if err != nil {
			return err
		}
		keys[i] = k
	}
	// The rank of an entry in writes: deny groups' holding entries,
	// allow groups' excepts, allow groups' allowing entries, deny groups'
	// excepts. Removals go in the reverse order.
	rank := func(e policy.CIDREntry) int {
		switch {
		case e.Deny && e.Allow:
			return 0
		case !e.Deny && !e.Allow:
			return 1
		case !e.Deny:
			return 2
		}
		return 3
	}
	for r := range 4 {
		for i, e := range upsert {
			if rank(e) != r {
				continue
			}
			v := bpf.EndpointCidrValue{}
			if e.Allow {
				v.Allow = 1
			}
			if err := m.Update(keys[i], v, ebpf.UpdateAny); err != nil {
				return fmt.Errorf("update cidr policy map: %w", err)
			}
		}
	}
	for r := 3; r >= 0; r-- {
		for _, e := range remove {
			if rank(e) != r {
				continue
			}
			if err := m.Delete(encodeCIDRKey(e)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("delete from cidr policy map: %w", err)
			}
		}
	}
	return nil
}
