package datapath

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// The host firewall (bpf/hostfw.h): from_netdev and to_netdev on the
// uplinks enforce the host endpoint's policy, whose maps are pinned at
// <bpffs>/host/ (apart from endpoints/, which the orphan GC sweeps) and
// reached through the endpoints entry at key hostEndpointKey.
const (
	// pinNetdevEgressDir holds to_netdev's links, one per uplink.
	pinNetdevEgressDir = "netdev-egress"
	// pinHostDir holds the host endpoint's policy maps.
	pinHostDir = "host"
	// hostEndpointKey is bpf/hostfw.h's HOST_EP_KEY: no interface has
	// ifindex 0.
	hostEndpointKey = 0
	// HostEndpointID is the host endpoint's ID in the programs'
	// conntrack, drop counters and drop events (identity host tells its
	// drops from DropNoEndpoint's, also under endpoint 0). The endpoint
	// manager never hands out ID 0.
	HostEndpointID = 0
)

// hookNetdevEgress is to_netdev's attach point on an uplink.
func hookNetdevEgress(dev string) hook {
	return hook{pin: dev, tcx: ebpf.AttachTCXEgress, parent: netlink.HANDLE_MIN_EGRESS, name: "membrane-netdev-egress"}
}

// attachHostFirewall attaches from_netdev (with kpr, also the NodePort
// tail call) and to_netdev to devs and writes the safety net's peers.
func (l *Linux) attachHostFirewall(b *bpfState, devs []string, kpr bool) error {
	progs, err := loadNetdevFor(b, kpr)
	if err != nil {
		return err
	}
	defer progs.close()
	if err := writeSafePeers(b.maps.hostSafe, l.safePeers(nil)); err != nil {
		return err
	}
	// Egress first: the connections the host opens from now on are
	// recorded before ingress starts to decide.
	if err := l.attachDevices(b, pinNetdevEgressDir, hookNetdevEgress, devs, progs.to); err != nil {
		return err
	}
	if err := l.attachDevices(b, pinNetdevDir, hookNetdev, devs, progs.from); err != nil {
		return err
	}
	l.log.Info("host firewall attached", "devices", devs, "safe-peers", l.cfg.HostFirewall.SafePeers)
	return nil
}

// detachHostFirewall removes to_netdev's links (from_netdev's are the
// kube-proxy replacement's business) and the host endpoint's entry, so
// that a previous agent's host policy stops applying.
func (l *Linux) detachHostFirewall(b *bpfState) error {
	if err := l.prunePins(b, filepath.Join(b.dir, pinNetdevEgressDir), nil); err != nil {
		return err
	}
	b.releaseLinksUnder(filepath.Join(b.dir, pinNetdevEgressDir))
	if b.devLegacy {
		for _, d := range l.cfg.Services.Devices {
			if dev, err := l.nl.LinkByName(d); err == nil {
				if err := detachLegacy(l.nl, hookNetdevEgress(d), dev.Attrs().Index); err != nil {
					return err
				}
			}
		}
	}
	if err := b.maps.endpoints.Delete(uint32(hostEndpointKey)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("host firewall off: delete the host endpoint's entry: %w", err)
	}
	return nil
}

// safePeers is what host_safe holds: the configured peers and the
// latest SetHostSafePeers' (set: replaced by *set first).
func (l *Linux) safePeers(set *[]netip.AddrPort) []netip.AddrPort {
	l.hostSafeMu.Lock()
	defer l.hostSafeMu.Unlock()
	if set != nil {
		l.hostSafeExtra = slices.Clone(*set)
	}
	return append(slices.Clone(l.cfg.HostFirewall.SafePeers), l.hostSafeExtra...)
}

// SetHostSafePeers implements HostPolicyDatapath: host_safe holds the
// configured peers and peers (the API server's EndpointSlice), kept for
// the next Init too.
func (l *Linux) SetHostSafePeers(_ context.Context, peers []netip.AddrPort) error {
	all := l.safePeers(&peers)
	if !l.cfg.HostFirewall.Enabled {
		return nil
	}
	return l.guardBPF(func(b *bpfState) error {
		if err := writeSafePeers(b.maps.hostSafe, all); err != nil {
			return fmt.Errorf("host firewall safety net: %w", err)
		}
		return nil
	})
}

// writeSafePeers makes m hold exactly peers (TCP).
func writeSafePeers(m *ebpf.Map, peers []netip.AddrPort) error {
	want := map[bpf.EndpointHostSafeKey]bool{}
	for _, ap := range peers {
		want[safeKey(ap)] = true
	}
	var k bpf.EndpointHostSafeKey
	var v uint32
	var stale []bpf.EndpointHostSafeKey
	it := m.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read host_safe: %w", err)
	}
	for _, k := range stale {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete host_safe entry: %w", err)
		}
	}
	for k := range want {
		if err := m.Update(k, uint32(1), ebpf.UpdateAny); err != nil {
			return fmt.Errorf("write host_safe entry: %w", err)
		}
	}
	return nil
}

// safeKey is ap's host_safe key (TCP; port in network byte order).
func safeKey(ap netip.AddrPort) bpf.EndpointHostSafeKey {
	a := ap.Addr().Unmap()
	k := bpf.EndpointHostSafeKey{Family: familyV6, Proto: policy.ProtoTCP, Port: htons(ap.Port())}
	if a.Is4() {
		k.Family = familyV4
	}
	var b [16]byte
	copy(b[:], a.AsSlice())
	k.Addr = addrWords(b)
	return k
}

// HostFirewall reports whether the host firewall is on.
func (l *Linux) HostFirewall() bool { return l.cfg.HostFirewall.Enabled }

// RealizeHostPolicy implements HostPolicyDatapath: the host endpoint
// enforces m (nil: no host policy selects the node, its entry goes and
// everything passes), in audit mode with audit (the entry's
// endpointFlagAudit). The maps are written before the entry names them.
func (l *Linux) RealizeHostPolicy(_ context.Context, m *policy.MapState, audit bool) error {
	if !l.cfg.HostFirewall.Enabled {
		return nil
	}
	return l.guardBPF(func(b *bpfState) error {
		if m == nil {
			if err := b.maps.endpoints.Delete(uint32(hostEndpointKey)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("host policy: delete the host endpoint's entry: %w", err)
			}
			m = noPolicy
		}
		e, stale, err := l.hostEndpoint(b)
		if err != nil {
			return err
		}
		if err := syncPolicyMap(e.policyMap, e.cidrMap, policyTarget{e.have, e.ports}, policyTarget{m, nil}); err != nil {
			if have, hports, rerr := realisedState(e.policyMap, e.cidrMap); rerr == nil {
				e.have, e.ports = have, hports
			}
			return fmt.Errorf("host policy: %w", err)
		}
		e.have, e.ports = m, nil
		if m == noPolicy {
			return nil
		}
		info := endpointInfo(HostEndpointID, identity.ReservedHost, e.slot, epAddrs{})
		if audit {
			info.Flags |= endpointFlagAudit
		}
		if err := b.maps.endpoints.Update(uint32(hostEndpointKey), info, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("host policy: write the host endpoint's entry: %w", err)
		}
		if stale != 0 {
			return l.releaseStaleSlot(stale)
		}
		return nil
	})
}

// hostEndpoint returns the host endpoint's maps, opened (or made, or a
// previous agent's read back) on first use. stale is the slot a previous
// agent's entry named that does not hold them (released by the caller
// once the entry names the new one).
func (l *Linux) hostEndpoint(b *bpfState) (e *bpfEndpoint, stale uint32, err error) {
	b.mu.Lock()
	e = b.host
	b.mu.Unlock()
	if e != nil {
		return e, 0, nil
	}
	dir := filepath.Join(b.dir, pinHostDir)
	pm, cm := loadEndpointMaps(b.tmpl, dir)
	if pm == nil || cm == nil {
		if pm != nil {
			pm.Close()
		}
		if cm != nil {
			cm.Close()
		}
		if err := os.RemoveAll(dir); err != nil {
			return nil, 0, fmt.Errorf("host policy: %w", err)
		}
		if e, err = b.newEndpointMaps(dir); err != nil {
			return nil, 0, fmt.Errorf("host policy: %w", err)
		}
	} else {
		e = &bpfEndpoint{policyMap: pm, cidrMap: cm}
		if e.have, e.ports, err = realisedState(pm, cm); err != nil {
			e.close()
			return nil, 0, fmt.Errorf("host policy: %w", err)
		}
		var v bpf.EndpointEndpointInfo
		if b.maps.endpoints.Lookup(uint32(hostEndpointKey), &v) == nil && slotHolds(b.maps.policyMaps, v.Slot, pm) &&
			slotHolds(b.maps.cidrMaps, v.Slot, cm) {
			e.slot = v.Slot
		} else {
			if v.Slot != 0 {
				stale = v.Slot
			}
			if e.slot, _, err = b.endpointSlot(HostEndpointID, 0, pm, cm); err != nil {
				e.close()
				return nil, 0, fmt.Errorf("host policy: %w", err)
			}
		}
	}
	b.mu.Lock()
	b.host = e
	b.mu.Unlock()
	return e, stale, nil
}
