package datapath

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// UpsertIPCache implements Datapath: the shared ipcache LPM trie maps
// prefix to id (and the remote node hosting it, for tunnel mode) for
// every endpoint program (a miss is world).
func (l *Linux) UpsertIPCache(ctx context.Context, prefix netip.Prefix, id identity.NumericIdentity, tunnel netip.Addr) error {
	return l.ApplyIPCache(ctx, []IPCacheChange{{Prefix: prefix, Value: IPCacheValue{Identity: id, TunnelEndpoint: tunnel}}})[0]
}

// DeleteIPCache implements Datapath; a missing entry is success.
func (l *Linux) DeleteIPCache(ctx context.Context, prefix netip.Prefix) error {
	return l.ApplyIPCache(ctx, []IPCacheChange{{Prefix: prefix, Delete: true}})[0]
}

// ApplyIPCache implements IPCacheBatcher: the map writes in one guarded
// section, then the L7 proxy's mirror once for the changes done.
func (l *Linux) ApplyIPCache(_ context.Context, changes []IPCacheChange) []error {
	errs := make([]error, len(changes))
	done := make([]IPCacheChange, 0, len(changes))
	err := l.guardBPF(func(b *bpfState) error {
		for i, c := range changes {
			if errs[i] = l.applyIPCacheChange(b, c); errs[i] == nil {
				done = append(done, c)
			}
		}
		l.ipcacheL7(done)
		return nil
	})
	if err != nil {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
	}
	return errs
}

// applyIPCacheChange writes one change to the ipcache map.
func (l *Linux) applyIPCacheChange(b *bpfState, c IPCacheChange) error {
	if !c.Prefix.IsValid() {
		if c.Delete {
			return fmt.Errorf("delete ipcache: invalid prefix: %w", ErrInvalidConfig)
		}
		return fmt.Errorf("upsert ipcache: invalid prefix: %w", ErrInvalidConfig)
	}
	if c.Delete {
		err := b.maps.ipcache.Delete(ipcacheKey(c.Prefix))
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete ipcache %s: %w", c.Prefix, err)
		}
		return nil
	}
	if err := b.maps.ipcache.Update(ipcacheKey(c.Prefix), ipcacheValue(c.Value), ebpf.UpdateAny); err != nil {
		if mapFullErr(err) {
			l.mapFull.add(mapIPCache)
			return fmt.Errorf("upsert ipcache %s: ipcache full (%d entries, --ipcache-max): %w: %w", c.Prefix, b.maps.ipcache.MaxEntries(), ErrMapFull, err)
		}
		return fmt.Errorf("upsert ipcache %s: %w", c.Prefix, err)
	}
	return nil
}

// DumpIPCache returns what the pinned ipcache map holds (IPv4 prefixes
// as IPv4), for tests and diagnostics.
func (l *Linux) DumpIPCache(context.Context) (out map[netip.Prefix]identity.NumericIdentity, err error) {
	err = l.guardBPF(func(b *bpfState) error {
		held, err := dumpIPCacheMap(b.maps.ipcache)
		out = make(map[netip.Prefix]identity.NumericIdentity, len(held))
		for k, v := range held {
			out[ipcachePrefix(k)] = identity.NumericIdentity(v.Identity)
		}
		return err
	})
	return out, err
}

// DumpIPCacheValues is DumpIPCache with the tunnel endpoints.
func (l *Linux) DumpIPCacheValues(context.Context) (out map[netip.Prefix]IPCacheValue, err error) {
	err = l.guardBPF(func(b *bpfState) error {
		held, err := dumpIPCacheMap(b.maps.ipcache)
		out = make(map[netip.Prefix]IPCacheValue, len(held))
		for k, v := range held {
			out[ipcachePrefix(k)] = IPCacheValue{Identity: identity.NumericIdentity(v.Identity), TunnelEndpoint: tunnelAddr(v.Tunnel)}
		}
		return err
	})
	return out, err
}

// ipcacheValue encodes v.
func ipcacheValue(v IPCacheValue) bpf.EndpointIpcacheValue {
	return bpf.EndpointIpcacheValue{Identity: uint32(v.Identity), Tunnel: tunnelEndpoint(v.TunnelEndpoint)}
}

// tunnelEndpoint encodes a node address (invalid: none).
func tunnelEndpoint(a netip.Addr) bpf.EndpointTunnelEndpoint {
	a = a.Unmap()
	if !a.IsValid() {
		return bpf.EndpointTunnelEndpoint{}
	}
	var b [16]byte
	copy(b[:], a.AsSlice())
	t := bpf.EndpointTunnelEndpoint{Family: familyV6, Addr: addrWords(b)}
	if a.Is4() {
		t.Family = familyV4
	}
	return t
}

// tunnelAddr decodes tunnelEndpoint's encoding.
func tunnelAddr(t bpf.EndpointTunnelEndpoint) netip.Addr {
	b := addrBytes(t.Addr)
	switch t.Family {
	case familyV4:
		return netip.AddrFrom4([4]byte(b[:4]))
	case familyV6:
		return netip.AddrFrom16(b)
	}
	return netip.Addr{}
}

// dumpIPCacheMap reads the ipcache map by key.
func dumpIPCacheMap(m *ebpf.Map) (map[bpf.EndpointIpcacheKey]bpf.EndpointIpcacheValue, error) {
	held := map[bpf.EndpointIpcacheKey]bpf.EndpointIpcacheValue{}
	var k bpf.EndpointIpcacheKey
	var v bpf.EndpointIpcacheValue
	it := m.Iterate()
	for it.Next(&k, &v) {
		held[k] = v
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("dump ipcache: %w", err)
	}
	return held, nil
}

// SyncIPCache implements IPCacheSyncer: entries of the pinned ipcache
// not in desired are deleted, desired ones that are missing or differ
// are written. Prefixes are compared masked, IPv4-mapped IPv6 as IPv4
// (as UpsertIPCache stores them).
func (l *Linux) SyncIPCache(ctx context.Context, desired map[netip.Prefix]IPCacheValue) (st IPCacheSyncStats, err error) {
	want := make(map[bpf.EndpointIpcacheKey]bpf.EndpointIpcacheValue, len(desired))
	for p, v := range desired {
		if !p.IsValid() {
			return st, fmt.Errorf("sync ipcache: invalid prefix: %w", ErrInvalidConfig)
		}
		want[ipcacheKey(p)] = ipcacheValue(v)
	}
	err = l.guardBPF(func(b *bpfState) error {
		m := b.maps.ipcache
		held, err := dumpIPCacheMap(m)
		if err != nil {
			return fmt.Errorf("sync ipcache: %w", err)
		}
		for k := range held {
			if _, ok := want[k]; ok {
				continue
			}
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("sync ipcache: %w", err)
			}
			if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("sync ipcache: delete %s: %w", ipcachePrefix(k), err)
			}
			st.Deleted++
		}
		// A full map refuses new entries only: changed ones are still
		// written (an address that moved to another identity).
		var full int
		var fullErr error
		for k, v := range want {
			if cur, ok := held[k]; ok && cur == v {
				continue
			}
			if err := m.Update(k, v, ebpf.UpdateAny); err != nil {
				if !mapFullErr(err) {
					return fmt.Errorf("sync ipcache: write %s: %w", ipcachePrefix(k), err)
				}
				l.mapFull.add(mapIPCache)
				if full++; fullErr == nil {
					fullErr = fmt.Errorf("write %s: %w", ipcachePrefix(k), err)
				}
				continue
			}
			st.Written++
		}
		// The proxy's mirror follows the whole desired set: entries the
		// pinned map already held (an agent restart) are written to no
		// map, yet a new proxy knows nothing of them.
		l.replaceIPCacheL7(desired)
		if full > 0 {
			return fmt.Errorf("sync ipcache: ipcache full (%d entries, --ipcache-max): %d entries not written: %w: %w", m.MaxEntries(), full, ErrMapFull, fullErr)
		}
		return nil
	})
	return st, err
}

// ipcachePrefix decodes an ipcache key (for errors and tests).
func ipcachePrefix(k bpf.EndpointIpcacheKey) netip.Prefix {
	b := addrBytes(k.Addr)
	bits := int(k.Prefixlen) - 32
	if k.Family == familyV4 {
		return netip.PrefixFrom(netip.AddrFrom4([4]byte(b[:4])), bits)
	}
	return netip.PrefixFrom(netip.AddrFrom16(b), bits)
}

var _ IPCacheSyncer = (*Linux)(nil)

// HostAddrs returns the host netns's own unicast addresses (global and
// private, not link-local or loopback): the host identity in the
// ipcache, because traffic the host sends to a pod (kubelet probes) has
// one of them as its source, not a gateway.
func (l *Linux) HostAddrs(context.Context) (out []netip.Addr, err error) {
	err = l.guard(func() error {
		addrs, err := l.nl.AddrList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("list host addresses: %w", err)
		}
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if ok && ip.Unmap().IsGlobalUnicast() {
				out = append(out, ip.Unmap())
			}
		}
		return nil
	})
	return out, err
}

// ReadPinnedIPCache reads the ipcache map an agent pinned under its
// bpffs directory (LinuxConfig.BPFFS, the agent's --bpffs) without a
// Linux datapath of its own: tests and diagnostics that look at another
// process's kernel state.
func ReadPinnedIPCache(bpffs string) (map[netip.Prefix]IPCacheValue, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(bpffs, pinIPCache), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("open pinned ipcache under %s: %w", bpffs, err)
	}
	defer m.Close()
	held, err := dumpIPCacheMap(m)
	if err != nil {
		return nil, err
	}
	out := make(map[netip.Prefix]IPCacheValue, len(held))
	for k, v := range held {
		out[ipcachePrefix(k)] = IPCacheValue{Identity: identity.NumericIdentity(v.Identity), TunnelEndpoint: tunnelAddr(v.Tunnel)}
	}
	return out, nil
}
