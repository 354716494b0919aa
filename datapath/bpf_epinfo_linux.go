package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// endpoint_info.flags (bpf/endpoint.h): which of the entry's addresses
// are the endpoint's. from_container drops what the pod sends from any
// other source, and all of a family without an address.
const (
	endpointFlagIPv4 = 1 // ENDPOINT_F_IPV4
	endpointFlagIPv6 = 2 // ENDPOINT_F_IPV6
	// endpointFlagAudit (ENDPOINT_F_AUDIT): the endpoint's policy audit
	// mode; what its policy would drop passes, reported as policy-audit.
	endpointFlagAudit = 4
	// endpointFlagEnforceKnown (ENDPOINT_F_ENFORCE_KNOWN): the entry's
	// endpointFlagEnforceIngress and endpointFlagEnforceEgress say which
	// directions may have the enforce entry in the policy map; a
	// direction without its flag has none, and the programs skip its
	// lookup. Set before the enforce entry is written, cleared after it
	// is deleted (realizeBPF).
	endpointFlagEnforceKnown   = 8
	endpointFlagEnforceIngress = 16
	endpointFlagEnforceEgress  = 32
	endpointFlagsEnforce       = endpointFlagEnforceKnown | endpointFlagEnforceIngress | endpointFlagEnforceEgress
)

// enforceFlags are the ENDPOINT_F_ENFORCE_* flags of an endpoint whose
// policy map enforces m.
func enforceFlags(m *policy.MapState) uint32 {
	f := uint32(endpointFlagEnforceKnown)
	if m.Enforced(policy.Ingress) {
		f |= endpointFlagEnforceIngress
	}
	if m.Enforced(policy.Egress) {
		f |= endpointFlagEnforceEgress
	}
	return f
}

// epAddrs are the endpoint's addresses an endpoints entry holds (each
// invalid when absent: a single-stack pod).
type epAddrs struct {
	v4, v6 netip.Addr
}

// addrsOf returns ep's addresses as the programs compare them: IPv4
// (also written IPv4-mapped) and IPv6, without zones.
func addrsOf(ep *endpoint.Endpoint) epAddrs {
	var a epAddrs
	if v4 := ep.IPv4.Unmap(); v4.Is4() {
		a.v4 = v4
	}
	if ep.IPv6.Is6() && !ep.IPv6.Is4In6() {
		a.v6 = ep.IPv6.WithZone("")
	}
	return a
}

// endpointInfo is the endpoints entry of endpoint id: its identity, its
// policy maps' slot and its addresses.
func endpointInfo(id endpoint.ID, ident identity.NumericIdentity, slot uint32, a epAddrs) bpf.EndpointEndpointInfo {
	v := bpf.EndpointEndpointInfo{Id: uint32(id), Identity: uint32(ident), Slot: slot}
	if a.v4.IsValid() {
		var b [16]byte
		copy(b[:], a.v4.AsSlice())
		v.Flags |= endpointFlagIPv4
		v.Ipv4 = addrWords(b)[0]
	}
	if a.v6.IsValid() {
		v.Flags |= endpointFlagIPv6
		v.Ipv6 = addrWords(a.v6.As16())
	}
	return v
}

// infoAddrs reads the addresses of an endpoints entry.
func infoAddrs(v bpf.EndpointEndpointInfo) epAddrs {
	var a epAddrs
	if v.Flags&endpointFlagIPv4 != 0 {
		b := addrBytes([4]uint32{v.Ipv4})
		a.v4 = netip.AddrFrom4([4]byte(b[:4]))
	}
	if v.Flags&endpointFlagIPv6 != 0 {
		a.v6 = netip.AddrFrom16(addrBytes(v.Ipv6))
	}
	return a
}

// oldEndpointInfoSize is the size of an endpoints value before the
// addresses: {id, identity, slot, flags}, the first 16 bytes of today's.
const oldEndpointInfoSize = 16

// openEndpointsMap opens the endpoints map pinned at path like
// openSharedMap, which replaces a map of another layout with a new one.
// The entries of a map of the layout before the addresses are carried
// over, without addresses: the previous agent's endpoints keep their
// slots (initSlots would otherwise empty them as unnamed, and the old
// programs, still attached with the old map, would drop their traffic
// as no-endpoint until each is realised again) and are found again on
// restore (endpointSlot). An entry without addresses lets its pod send
// nothing; the agent attaches the new programs to an interface only
// after writing its entry with the addresses (realizeBPF).
func openEndpointsMap(spec *ebpf.MapSpec, path string) (*ebpf.Map, error) {
	return openCarriedMap(spec, path,
		func(old *ebpf.Map) bool { return old.KeySize() == 4 && old.ValueSize() == oldEndpointInfoSize },
		oldEndpointEntries,
		func(k uint32, _ bpf.EndpointEndpointInfo) string {
			return fmt.Sprintf("endpoints entry of ifindex %d", k)
		})
}

// openCarriedMap opens the shared map pinned at path like openSharedMap;
// when the pinned map is of an earlier layout (incompatible with spec
// and old says it is that layout), read's entries are carried over into
// the new map (not replacing entries already there). what names an
// entry in errors.
func openCarriedMap[K comparable, V any](spec *ebpf.MapSpec, path string, old func(*ebpf.Map) bool,
	read func(*ebpf.Map) (map[K]V, error), what func(K, V) string) (*ebpf.Map, error) {
	var carried map[K]V
	if pinned, err := ebpf.LoadPinnedMap(path, nil); err == nil {
		if spec.Compatible(pinned) != nil && old(pinned) {
			carried, err = read(pinned)
		}
		pinned.Close()
		if err != nil {
			return nil, err
		}
	}
	m, err := openSharedMap(spec, path)
	if err != nil {
		return nil, err
	}
	var errs []error
	for k, v := range carried {
		if err := m.Update(k, v, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			errs = append(errs, fmt.Errorf("carry %s over: %w", what(k, v), err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// oldEndpointEntries reads a map of the layout before the addresses.
func oldEndpointEntries(old *ebpf.Map) (map[uint32]bpf.EndpointEndpointInfo, error) {
	out := map[uint32]bpf.EndpointEndpointInfo{}
	var k uint32
	v := make([]byte, oldEndpointInfoSize)
	it := old.Iterate()
	for it.Next(&k, &v) {
		ne := binary.NativeEndian
		out[k] = bpf.EndpointEndpointInfo{Id: ne.Uint32(v[0:]), Identity: ne.Uint32(v[4:]), Slot: ne.Uint32(v[8:])}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read endpoints map of the old layout: %w", err)
	}
	return out, nil
}
