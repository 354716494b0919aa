package datapath

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/service"
)

// bpf/lb.h's LB_FLAG_AFFINITY, LB_FLAG_EXTERNAL, LB_FLAG_HOSTNS,
// LB_FLAG_TWO_SCOPES and LB_BACKEND_LOCAL.
const (
	lbFlagAffinity  = 1
	lbFlagExternal  = 2
	lbFlagHostNS    = 4
	lbFlagTwoScopes = 8
	lbBackendLocal  = 1
)

// lbMaps are the shared service maps (bpf/lb.h), pinned under the bpffs
// directory by their names.
type lbMaps struct {
	frontends, backends, ct, revnat, affinity *ebpf.Map
	nat, natRev, sock                         *ebpf.Map // nodeport.h, sock.c
	progs                                     *ebpf.Map // lb_progs: nodeport_reply's slot
}

func (m *lbMaps) named() []namedMap {
	return []namedMap{
		{name: bpf.EndpointMapLbFrontends, dst: &m.frontends},
		{name: bpf.EndpointMapLbBackends, dst: &m.backends},
		{name: bpf.EndpointMapLbCt, dst: &m.ct},
		{name: bpf.EndpointMapLbRevnat, dst: &m.revnat},
		{name: bpf.EndpointMapLbAffinity, dst: &m.affinity},
		{name: bpf.EndpointMapLbNat, dst: &m.nat},
		{name: bpf.EndpointMapLbNatRev, dst: &m.natRev},
		{name: bpf.EndpointMapLbSock, dst: &m.sock},
		{name: bpf.EndpointMapLbProgs, dst: &m.progs},
	}
}

func (m *lbMaps) all() []*ebpf.Map {
	return []*ebpf.Map{m.frontends, m.backends, m.ct, m.revnat, m.affinity, m.nat, m.natRev, m.sock, m.progs}
}

var _ ServiceDatapath = (*Linux)(nil)

// lbKey encodes a frontend (its scope is lb.h's LB_SCOPE_*: the same
// numbers).
func lbKey(f service.Frontend) bpf.EndpointLbKey {
	k := bpf.EndpointLbKey{Dport: htons(f.Port), Proto: f.Proto, Family: familyV6, Scope: f.Scope}
	if f.Addr.Is4() {
		k.Family = familyV4
	}
	k.Addr = addrWords(addr16(f.Addr))
	return k
}

// oldLBKeySize is the size of an lb_frontends key before the scope:
// {addr, dport, proto, family}, the first 20 bytes of today's.
const oldLBKeySize = 20

// openFrontendsMap opens the lb_frontends map pinned at path like
// openSharedMap. The entries of a map of the layout before the scope are
// carried over as internal-scope frontends (today's key with scope 0;
// the values are unchanged): the services actor finds the previous
// agent's IDs again, so the connections it translated (lb_ct, lb_nat,
// whose entries name the ID) keep their backends across the upgrade.
func openFrontendsMap(spec *ebpf.MapSpec, path string) (*ebpf.Map, error) {
	return openCarriedMap(spec, path,
		func(old *ebpf.Map) bool { return old.KeySize() == oldLBKeySize && old.ValueSize() == spec.ValueSize },
		oldFrontendEntries,
		func(_ bpf.EndpointLbKey, v bpf.EndpointLbService) string {
			return fmt.Sprintf("lb_frontends entry of service %d", v.Id)
		})
}

// oldFrontendEntries reads an lb_frontends map of the layout before the
// scope.
func oldFrontendEntries(old *ebpf.Map) (map[bpf.EndpointLbKey]bpf.EndpointLbService, error) {
	out := map[bpf.EndpointLbKey]bpf.EndpointLbService{}
	k := make([]byte, oldLBKeySize)
	var v bpf.EndpointLbService
	it := old.Iterate()
	for it.Next(&k, &v) {
		var nk bpf.EndpointLbKey
		for i := range nk.Addr {
			nk.Addr[i] = binary.NativeEndian.Uint32(k[4*i:])
		}
		nk.Dport = binary.NativeEndian.Uint16(k[16:])
		nk.Proto, nk.Family = k[18], k[19]
		out[nk] = v
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read lb_frontends of the old layout: %w", err)
	}
	return out, nil
}

// lbBackend encodes a backend.
func lbBackend(b service.Backend) bpf.EndpointLbBackend {
	v := bpf.EndpointLbBackend{Port: htons(b.Port), Family: familyV6}
	if b.Addr.Is4() {
		v.Family = familyV4
	}
	v.Addr = addrWords(addr16(b.Addr))
	if b.Local {
		v.Flags = lbBackendLocal
	}
	return v
}

// addr16 is a's bytes, IPv4 in the first four.
func addr16(a netip.Addr) (b [16]byte) {
	copy(b[:], a.AsSlice())
	return b
}

// addrOf decodes an address of family from the programs' words.
func addrOf(family uint8, w [4]uint32) netip.Addr {
	b := addrBytes(w)
	if family == familyV4 {
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrFrom16(b)
}

// htons and ntohs convert a port to and from the programs' network byte
// order as it sits in a native-endian u16.
func htons(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

func ntohs(p uint16) uint16 { return htons(p) }

func lbServiceValue(s LBService) bpf.EndpointLbService {
	v := bpf.EndpointLbService{Id: s.ID, Count: uint32(len(s.Backends))}
	if s.Affinity > 0 {
		v.Flags = lbFlagAffinity
		v.Affinity = uint32(min(math.Ceil(s.Affinity.Seconds()), math.MaxUint32))
	}
	if s.External {
		v.Flags |= lbFlagExternal
	}
	if s.TwoScopes {
		v.Flags |= lbFlagTwoScopes
	}
	if s.Frontend.Addr.IsLoopback() {
		v.Flags |= lbFlagHostNS // the node's localhost, not a pod's
	}
	return v
}

// UpsertService implements ServiceDatapath: slots first, then the
// frontend (its count), then the slots beyond the new count.
func (l *Linux) UpsertService(_ context.Context, s LBService, prevBackends int) error {
	if err := s.Frontend.Validate(); err != nil || s.ID == 0 {
		return fmt.Errorf("upsert service %s (id %d): %w", s.Frontend, s.ID, ErrInvalidConfig)
	}
	return l.guardBPF(func(b *bpfState) error {
		return writeLBService(&b.maps.lb, s, prevBackends)
	})
}

func writeLBService(m *lbMaps, s LBService, prevBackends int) error {
	for i, be := range s.Backends {
		k := bpf.EndpointLbSlotKey{Id: s.ID, Slot: uint32(i + 1)}
		if err := m.backends.Update(k, lbBackend(be), ebpf.UpdateAny); err != nil {
			return fmt.Errorf("upsert service %s: backend slot %d: %w", s.Frontend, i+1, err)
		}
	}
	if err := m.frontends.Update(lbKey(s.Frontend), lbServiceValue(s), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("upsert service %s: frontend: %w", s.Frontend, err)
	}
	return deleteSlots(m, s.ID, len(s.Backends)+1, prevBackends)
}

// deleteSlots deletes service id's slots from..to; missing ones are fine.
func deleteSlots(m *lbMaps, id uint32, from, to int) error {
	for slot := from; slot <= to; slot++ {
		err := m.backends.Delete(bpf.EndpointLbSlotKey{Id: id, Slot: uint32(slot)})
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete service %d slot %d: %w", id, slot, err)
		}
	}
	return nil
}

// DeleteService implements ServiceDatapath: the frontend first, so no new
// connection looks at the slots being deleted.
func (l *Linux) DeleteService(_ context.Context, f service.Frontend, id uint32, prevBackends int) error {
	return l.guardBPF(func(b *bpfState) error {
		err := b.maps.lb.frontends.Delete(lbKey(f))
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete service %s: %w", f, err)
		}
		return deleteSlots(&b.maps.lb, id, 1, prevBackends)
	})
}

// SyncServices implements ServiceDatapath.
func (l *Linux) SyncServices(_ context.Context, desired []LBService) error {
	return l.guardBPF(func(b *bpfState) error {
		m := &b.maps.lb
		want := make(map[bpf.EndpointLbKey]bool, len(desired))
		slots := make(map[bpf.EndpointLbSlotKey]bool)
		for _, s := range desired {
			want[lbKey(s.Frontend)] = true
			for i := range s.Backends {
				slots[bpf.EndpointLbSlotKey{Id: s.ID, Slot: uint32(i + 1)}] = true
			}
			if err := writeLBService(m, s, 0); err != nil {
				return err
			}
		}
		if err := pruneMap(m.frontends, func(k bpf.EndpointLbKey) bool { return want[k] }); err != nil {
			return fmt.Errorf("sync services: %w", err)
		}
		if err := pruneMap(m.backends, func(k bpf.EndpointLbSlotKey) bool { return slots[k] }); err != nil {
			return fmt.Errorf("sync services: %w", err)
		}
		return nil
	})
}

// pruneMap deletes m's keys that keep refuses.
func pruneMap[K comparable](m *ebpf.Map, keep func(K) bool) error {
	var (
		k    K
		dead []K
	)
	it := m.Iterate()
	var v []byte
	for it.Next(&k, &v) {
		if !keep(k) {
			dead = append(dead, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate %s: %w", m, err)
	}
	for _, k := range dead {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete from %s: %w", m, err)
		}
	}
	return nil
}

// DumpServices implements ServiceDatapath.
func (l *Linux) DumpServices(context.Context) (out LBMaps, err error) {
	err = l.guardBPF(func(b *bpfState) error {
		m := &b.maps.lb
		var (
			fk bpf.EndpointLbKey
			fv bpf.EndpointLbService
		)
		it := m.frontends.Iterate()
		for it.Next(&fk, &fv) {
			out.Frontends = append(out.Frontends, LBFrontendEntry{
				Frontend: service.Frontend{Addr: addrOf(fk.Family, fk.Addr), Port: ntohs(fk.Dport), Proto: fk.Proto, Scope: fk.Scope},
				ID:       fv.Id, Count: fv.Count, Affinity: fv.Affinity, External: fv.Flags&lbFlagExternal != 0,
				TwoScopes: fv.Flags&lbFlagTwoScopes != 0,
			})
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("dump services: %w", err)
		}
		var (
			sk bpf.EndpointLbSlotKey
			sv bpf.EndpointLbBackend
		)
		it = m.backends.Iterate()
		for it.Next(&sk, &sv) {
			out.Backends = append(out.Backends, LBBackendEntry{ID: sk.Id, Slot: sk.Slot,
				Backend: service.Backend{Addr: addrOf(sv.Family, sv.Addr), Port: ntohs(sv.Port), Local: sv.Flags&lbBackendLocal != 0}})
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("dump services: %w", err)
		}
		for _, c := range []struct {
			m *ebpf.Map
			n *int
		}{{m.ct, &out.Connections}, {m.revnat, &out.ReverseNAT}, {m.affinity, &out.Affinity},
			{m.nat, &out.NodePortNAT}, {m.natRev, &out.NodePortSNAT}, {m.sock, &out.Sockets}} {
			n, err := countEntries(c.m)
			if err != nil {
				return fmt.Errorf("dump services: %w", err)
			}
			*c.n = n
		}
		return nil
	})
	sortLBMaps(&out)
	out.Hooks = l.serviceHooks()
	return out, err
}

// countEntries counts m's keys.
func countEntries(m *ebpf.Map) (int, error) {
	var k, v []byte
	n := 0
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	return n, it.Err()
}
