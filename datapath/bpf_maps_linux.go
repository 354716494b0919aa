package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// enforceIdentity is bpf/endpoint.h's POLICY_ENFORCE_IDENTITY: the exact
// key {enforceIdentity, dir, 0, 0} in a policy map makes dir default-deny.
// Enforcement is a map entry and not a program constant so that toggling
// it is a policy-only change (one map write) that never reloads the
// program; policy keys with this identity are refused.
const enforceIdentity = 0xffffffff

// Policy key prefix lengths (bpf/endpoint.h): identity and dir (L3-only),
// plus proto (port wildcard), plus dport (exact).
const (
	policyPrefixL3    = 40
	policyPrefixProto = 48
	policyPrefixFull  = 64
)

// ipcache key families (bpf/endpoint.h).
const (
	familyV4 = 4
	familyV6 = 6
)

// openSharedMap opens the map pinned at path if it matches spec, else
// (missing, or left by an incompatible build) creates and pins a new one.
func openSharedMap(spec *ebpf.MapSpec, path string) (*ebpf.Map, error) {
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err == nil {
		if cerr := spec.Compatible(m); cerr == nil {
			return m, nil
		}
		m.Close()
		if err := unpin(path); err != nil {
			return nil, err
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("open pinned map %s: %w", path, err)
	}
	m, err = ebpf.NewMap(spec)
	if err != nil {
		return nil, fmt.Errorf("create map %s: %w", spec.Name, err)
	}
	if err := m.Pin(path); err != nil {
		m.Close()
		return nil, fmt.Errorf("pin map %s: %w", path, err)
	}
	return m, nil
}

// ipcacheKey encodes prefix (masked; IPv4-mapped IPv6 as IPv4).
func ipcacheKey(prefix netip.Prefix) bpf.EndpointIpcacheKey {
	addr, bits := prefix.Addr(), prefix.Bits()
	if addr.Is4In6() {
		addr, bits = addr.Unmap(), max(bits-96, 0)
	}
	p := netip.PrefixFrom(addr, bits).Masked()
	k := bpf.EndpointIpcacheKey{Prefixlen: 32 + uint32(p.Bits()), Family: familyV6}
	if p.Addr().Is4() {
		k.Family = familyV4
	}
	var b [16]byte
	copy(b[:], p.Addr().AsSlice())
	k.Addr = addrWords(b)
	return k
}

// addrWords and addrBytes convert between an address's bytes (network
// order) and the programs' u32 words holding those bytes in memory.
func addrWords(b [16]byte) (w [4]uint32) {
	for i := range w {
		w[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return w
}

func addrBytes(w [4]uint32) (b [16]byte) {
	for i := range w {
		binary.NativeEndian.PutUint32(b[4*i:], w[i])
	}
	return b
}

// policyKey encodes k; it refuses keys the programs cannot express.
func policyKey(k policy.Key) (bpf.EndpointPolicyKey, error) {
	switch {
	case uint32(k.Identity) == enforceIdentity:
		return bpf.EndpointPolicyKey{}, fmt.Errorf("policy key %+v: identity %d is reserved: %w", k, k.Identity, ErrInvalidPolicy)
	case k.Proto == policy.ProtoAny && k.Port != 0:
		return bpf.EndpointPolicyKey{}, fmt.Errorf("policy key %+v: port without protocol: %w", k, ErrInvalidPolicy)
	case k.Dir != policy.Ingress && k.Dir != policy.Egress:
		return bpf.EndpointPolicyKey{}, fmt.Errorf("policy key %+v: bad direction: %w", k, ErrInvalidPolicy)
	}
	return encodePolicyKey(k), nil
}

// encodePolicyKey is k as an LPM key: wildcards are shorter prefixes.
func encodePolicyKey(k policy.Key) bpf.EndpointPolicyKey {
	plen := uint32(policyPrefixFull)
	switch {
	case k.Proto == policy.ProtoAny:
		plen = policyPrefixL3
	case k.Port == 0:
		plen = policyPrefixProto
	}
	return bpf.EndpointPolicyKey{Prefixlen: plen, Identity: uint32(k.Identity), Dir: uint8(k.Dir), Proto: k.Proto, Dport: k.Port}
}

func enforceKey(dir policy.Direction) bpf.EndpointPolicyKey {
	return bpf.EndpointPolicyKey{Prefixlen: policyPrefixFull, Identity: enforceIdentity, Dir: uint8(dir)}
}

// openEndpointMap opens endpoint dir's map pinned as pin (pinPolicy or
// pinCIDR), or creates and pins it. created reports a new (empty) map.
func openEndpointMap(spec *ebpf.MapSpec, dir, pin string) (m *ebpf.Map, created bool, err error) {
	path := filepath.Join(dir, pin)
	if m, err := ebpf.LoadPinnedMap(path, nil); err == nil {
		if spec.Compatible(m) == nil {
			return m, false, nil
		}
		m.Close()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, false, fmt.Errorf("create %s: %w", dir, err)
	}
	if err := unpin(path); err != nil {
		return nil, false, err
	}
	m, err = ebpf.NewMap(spec)
	if err != nil {
		return nil, false, fmt.Errorf("create %s map: %w", pin, err)
	}
	if err := m.Pin(path); err != nil {
		m.Close()
		return nil, false, fmt.Errorf("pin %s map %s: %w", pin, path, err)
	}
	return m, true, nil
}

// dumpPolicyMap reads a policy map: its entries sorted by
// policy.Compare and the enforcement per direction.
func dumpPolicyMap(m *ebpf.Map) (entries []PolicyEntry, ingress, egress bool, err error) {
	var k bpf.EndpointPolicyKey
	var v bpf.EndpointPolicyValue
	it := m.Iterate()
	for it.Next(&k, &v) {
		if k.Identity == enforceIdentity {
			if policy.Direction(k.Dir) == policy.Egress {
				egress = true
			} else {
				ingress = true
			}
			continue
		}
		pk := policy.Key{Identity: identity.NumericIdentity(k.Identity), Dir: policy.Direction(k.Dir)}
		if k.Prefixlen >= policyPrefixProto {
			pk.Proto = k.Proto
		}
		if k.Prefixlen >= policyPrefixFull {
			pk.Port = k.Dport
		}
		entries = append(entries, PolicyEntry{
			Key:     pk,
			Packets: v.Packets, Bytes: v.Bytes,
			ProxyPort: v.ProxyPort,
			Deny:      v.Deny != 0,
		})
	}
	if err := it.Err(); err != nil {
		return nil, false, false, fmt.Errorf("dump policy map: %w", err)
	}
	slices.SortFunc(entries, func(a, b PolicyEntry) int { return policy.Compare(a.Key, b.Key) })
	return entries, ingress, egress, nil
}

// realisedState rebuilds what a policy map and a CIDR policy map
// enforce as a MapState, and the proxy ports of its redirected entries.
func realisedState(m, cm *ebpf.Map) (*policy.MapState, map[policy.Key]uint16, error) {
	entries, in, eg, err := dumpPolicyMap(m)
	if err != nil {
		return nil, nil, err
	}
	cidrs, err := dumpCIDRMap(cm)
	if err != nil {
		return nil, nil, err
	}
	keys := make([]policy.Key, len(entries))
	var ports map[policy.Key]uint16
	var deny []policy.Key
	for i, e := range entries {
		keys[i] = e.Key
		if e.Deny {
			deny = append(deny, e.Key)
		}
		if e.ProxyPort != 0 {
			if ports == nil {
				ports = map[policy.Key]uint16{}
			}
			ports[e.Key] = e.ProxyPort
		}
	}
	ms := policy.NewMapState(0, in, eg, keys)
	ms.Deny = deny // sorted: entries are
	for _, c := range cidrs {
		ms.CIDR = append(ms.CIDR, c.Entry)
	}
	return ms, ports, nil
}

// policyTarget is what a policy map is synced to: the entries and the
// proxy port of each redirected one (policy.MapState.Redirects).
type policyTarget struct {
	state *policy.MapState
	ports map[policy.Key]uint16
}

// syncPolicyMap makes m (identity entries) and cm (CIDR entries) enforce
// want, given that they enforce have, by difference. Order keeps every
// intermediate state between the two: enforcement turned off first,
// kept entries turned into denies, additions (with their proxy ports and
// deny flags), proxy port changes of kept entries, kept denies turned
// into allows, the CIDR entries (syncCIDRMap), removals, and enforcement
// turned on last.
func syncPolicyMap(m, cm *ebpf.Map, haveT, wantT policyTarget) error {
	have, want := haveT.state, wantT.state
	add, remove := policy.Diff(have, want)
	addKeys := make([]bpf.EndpointPolicyKey, 0, len(add))
	for _, k := range add {
		bk, err := policyKey(k)
		if err != nil {
			return err
		}
		addKeys = append(addKeys, bk)
	}
	for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
		if have.Enforced(dir) && !want.Enforced(dir) {
			if err := deleteKey(m, enforceKey(dir)); err != nil {
				return err
			}
		}
	}
	if err := syncDeny(m, have, want, true); err != nil {
		return err
	}
	var zero bpf.EndpointPolicyValue
	for i, bk := range addKeys {
		// NoExist keeps the counters of an entry that is already there
		// (its port is then set below).
		v := bpf.EndpointPolicyValue{ProxyPort: wantT.ports[add[i]]}
		if want.Denies(add[i]) {
			v.Deny = 1
		}
		if err := m.Update(bk, v, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			return fmt.Errorf("update policy map: %w", err)
		}
	}
	if err := syncProxyPorts(m, haveT, wantT); err != nil {
		return err
	}
	if err := syncDeny(m, have, want, false); err != nil {
		return err
	}
	if err := syncCIDRMap(cm, have, want); err != nil {
		return err
	}
	for _, k := range remove {
		if err := deleteKey(m, encodePolicyKey(k)); err != nil {
			return err
		}
	}
	for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
		if want.Enforced(dir) && !have.Enforced(dir) {
			if err := m.Update(enforceKey(dir), zero, ebpf.UpdateAny); err != nil {
				return fmt.Errorf("update policy map: enforce %s: %w", dir, err)
			}
		}
	}
	return nil
}

// syncProxyPorts sets the proxy port of every entry of want whose port
// differs from have's (redirect turned on, off, or moved), keeping its
// counters. New entries got theirs with the addition.
func syncProxyPorts(m *ebpf.Map, haveT, wantT policyTarget) error {
	changed := func(k policy.Key) error {
		if haveT.ports[k] == wantT.ports[k] {
			return nil
		}
		if _, ok := slices.BinarySearchFunc(wantT.state.Allow, k, policy.Compare); !ok {
			return nil // removed
		}
		bk := encodePolicyKey(k)
		var v bpf.EndpointPolicyValue
		if err := m.Lookup(bk, &v); err != nil {
			return fmt.Errorf("read policy map entry %+v: %w", k, err)
		}
		v.ProxyPort = wantT.ports[k]
		if err := m.Update(bk, v, ebpf.UpdateExist); err != nil {
			return fmt.Errorf("set proxy port of policy map entry %+v: %w", k, err)
		}
		return nil
	}
	for k := range wantT.ports {
		if err := changed(k); err != nil {
			return err
		}
	}
	for k := range haveT.ports {
		if _, ok := wantT.ports[k]; !ok {
			if err := changed(k); err != nil {
				return err
			}
		}
	}
	return nil
}

// syncDeny sets the deny flag (on true) or clears it (on false) of the
// entries kept from have to want whose flag differs, keeping their
// counters.
func syncDeny(m *ebpf.Map, have, want *policy.MapState, on bool) error {
	from, to := have, want
	if !on {
		from, to = want, have
	}
	if to == nil {
		return nil
	}
	// Entries denying in to and not in from, kept in both (to.Deny is
	// a subset of to's entries).
	for _, k := range to.Deny {
		if from.Denies(k) || !from.Has(k) {
			continue
		}
		bk := encodePolicyKey(k)
		var v bpf.EndpointPolicyValue
		if err := m.Lookup(bk, &v); err != nil {
			return fmt.Errorf("read policy map entry %+v: %w", k, err)
		}
		v.Deny = 0
		if on {
			v.Deny = 1
		}
		if err := m.Update(bk, v, ebpf.UpdateExist); err != nil {
			return fmt.Errorf("set deny of policy map entry %+v: %w", k, err)
		}
	}
	return nil
}

func deleteKey(m *ebpf.Map, k bpf.EndpointPolicyKey) error {
	if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete from policy map: %w", err)
	}
	return nil
}

// dropCounters reads the drop counter map.
func dropCounters(m *ebpf.Map) (map[DropKey]Counter, error) {
	out := map[DropKey]Counter{}
	var k bpf.EndpointDropKey
	var v bpf.EndpointDropValue
	it := m.Iterate()
	for it.Next(&k, &v) {
		out[DropKey{Endpoint: endpoint.ID(k.Ep), Reason: dropReasonName(k.Reason), Dir: policy.Direction(k.Dir)}] = Counter{Packets: v.Packets, Bytes: v.Bytes}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read drop counters: %w", err)
	}
	return out, nil
}

// endpointDropCounters reads endpoint id's drop counters.
func endpointDropCounters(m *ebpf.Map, id endpoint.ID) (map[DropKey]Counter, error) {
	out := map[DropKey]Counter{}
	var v bpf.EndpointDropValue
	for reason, name := range dropReasons {
		for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
			k := bpf.EndpointDropKey{Ep: uint16(id), Reason: reason, Dir: uint8(dir)}
			err := m.Lookup(k, &v)
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("read drop counters of endpoint %d: %w", id, err)
			}
			out[DropKey{Endpoint: id, Reason: name, Dir: dir}] = Counter{Packets: v.Packets, Bytes: v.Bytes}
		}
	}
	return out, nil
}

// deleteDropCounters removes endpoint id's drop counters.
func deleteDropCounters(m *ebpf.Map, id endpoint.ID) error {
	for reason := range dropReasons {
		for _, dir := range []uint8{uint8(policy.Ingress), uint8(policy.Egress)} {
			k := bpf.EndpointDropKey{Ep: uint16(id), Reason: reason, Dir: dir}
			if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("delete drop counters of endpoint %d: %w", id, err)
			}
		}
	}
	return nil
}

// syncPatch makes m enforce want, patched from haveT's policy with the
// entries of peers replaced (policy.MapState.PatchedFrom), by writing
// those entries alone (syncPolicyPeers): a DNS answer's new address
// costs the same however large the policy. It returns want's proxy
// ports, haveT.ports changed in place, or an error: policy.ErrNoProxy
// before anything is written, else a write's (partly applied).
func syncPatch(m *ebpf.Map, haveT policyTarget, want *policy.MapState, peers []identity.NumericIdentity, pp policy.ProxyPorts) (map[policy.Key]uint16, error) {
	keys, haveKeys := want.PeerKeys(peers), haveT.state.PeerKeys(peers)
	sub, err := want.RedirectsOf(keys, pp)
	if err != nil {
		return nil, err
	}
	if err := syncPolicyPeers(m, haveT, policyTarget{want, sub}, haveKeys, keys); err != nil {
		return nil, err
	}
	return patchPorts(haveT.ports, haveKeys, sub), nil
}

// syncPolicyPeers is syncPolicyMap for a want patched from have
// (policy.MapState.PatchedFrom): they differ only in the entries of the
// patch's peers, haveKeys in have and wantKeys in want (sorted), and
// only those are written, in syncPolicyMap's order (their CIDR entries
// and enforcement are the same). wantT.ports holds the proxy ports of
// wantKeys alone, haveT.ports those of all of have's entries.
func syncPolicyPeers(m *ebpf.Map, haveT, wantT policyTarget, haveKeys, wantKeys []policy.Key) error {
	have, want := haveT.state, wantT.state
	add, remove := policy.Diff(&policy.MapState{Allow: haveKeys}, &policy.MapState{Allow: wantKeys})
	setDeny := func(k policy.Key, deny uint8) error {
		bk := encodePolicyKey(k)
		var v bpf.EndpointPolicyValue
		if err := m.Lookup(bk, &v); err != nil {
			return fmt.Errorf("read policy map entry %+v: %w", k, err)
		}
		v.Deny = deny
		if err := m.Update(bk, v, ebpf.UpdateExist); err != nil {
			return fmt.Errorf("set deny of policy map entry %+v: %w", k, err)
		}
		return nil
	}
	// Kept entries turned into denies.
	for _, k := range wantKeys {
		if want.Denies(k) && have.Has(k) && !have.Denies(k) {
			if err := setDeny(k, 1); err != nil {
				return err
			}
		}
	}
	for _, k := range add {
		bk, err := policyKey(k)
		if err != nil {
			return err
		}
		v := bpf.EndpointPolicyValue{ProxyPort: wantT.ports[k]}
		if want.Denies(k) {
			v.Deny = 1
		}
		if err := m.Update(bk, v, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			return fmt.Errorf("update policy map: %w", err)
		}
	}
	// Proxy ports of kept entries.
	for _, k := range wantKeys {
		if !have.Has(k) || haveT.ports[k] == wantT.ports[k] {
			continue
		}
		bk := encodePolicyKey(k)
		var v bpf.EndpointPolicyValue
		if err := m.Lookup(bk, &v); err != nil {
			return fmt.Errorf("read policy map entry %+v: %w", k, err)
		}
		v.ProxyPort = wantT.ports[k]
		if err := m.Update(bk, v, ebpf.UpdateExist); err != nil {
			return fmt.Errorf("set proxy port of policy map entry %+v: %w", k, err)
		}
	}
	// Kept denies turned into allows.
	for _, k := range haveKeys {
		if have.Denies(k) && want.Has(k) && !want.Denies(k) {
			if err := setDeny(k, 0); err != nil {
				return err
			}
		}
	}
	for _, k := range remove {
		if err := deleteKey(m, encodePolicyKey(k)); err != nil {
			return err
		}
	}
	return nil
}

// patchPorts returns ports (the proxy ports of a policy's entries) with
// those of the entries removed replaced by add, changed in place.
func patchPorts(ports map[policy.Key]uint16, removed []policy.Key, add map[policy.Key]uint16) map[policy.Key]uint16 {
	for _, k := range removed {
		delete(ports, k)
	}
	if len(add) > 0 && ports == nil {
		ports = make(map[policy.Key]uint16, len(add))
	}
	maps.Copy(ports, add)
	return ports
}
