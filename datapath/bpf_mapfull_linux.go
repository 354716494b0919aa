package datapath

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/bpf"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// denyAll is what an endpoint whose policy cannot be written enforces:
// both directions enforced, no entry, so that no new connection passes
// (replies of connections conntrack holds still do).
var denyAll = &policy.MapState{IngressEnforced: true, EgressEnforced: true}

// policyFits returns an error wrapping ErrMapFull if want has more
// entries than an endpoint's policy maps hold.
func (b *bpfState) policyFits(want *policy.MapState) error {
	size := int(b.tmpl.policySpec().MaxEntries)
	// Two entries are the enforcement flags.
	if n := len(want.Allow); n > size-2 {
		return fmt.Errorf("policy map full: the policy has %d entries, at most %d fit (--policy-map-max %d): %w", n, size-2, size, ErrMapFull)
	}
	if size := int(b.tmpl.cidrSpec().MaxEntries); len(want.CIDR) > size {
		return fmt.Errorf("cidr policy map full: the policy has %d CIDR entries, at most %d fit (--policy-map-max %d): %w", len(want.CIDR), size, size, ErrMapFull)
	}
	return nil
}

// failClosed makes e enforce denyAll. Only removals and the enforcement
// flags are written (two entries always fit), so it fails only if the
// kernel refuses a write.
func (l *Linux) failClosed(e *bpfEndpoint, id endpoint.ID) error {
	// Both directions' enforce entries are about to be written: the
	// endpoints entry says so first (ENDPOINT_F_ENFORCE_*).
	if e.attached && e.enf != endpointFlagsEnforce {
		if err := l.bpf.raiseEnforceFlags(id, e.ifindex); err != nil {
			return fmt.Errorf("fail closed: %w", err)
		}
		e.enf = endpointFlagsEnforce
	}
	err := syncPolicyMap(e.policyMap, e.cidrMap, policyTarget{e.have, e.ports}, policyTarget{denyAll, nil})
	if err == nil {
		e.have, e.ports = denyAll, nil
		l.log.Warn("endpoint policy not realised: failed closed, every new connection denied", "endpoint", id)
		return nil
	}
	if have, hports, rerr := realisedState(e.policyMap, e.cidrMap); rerr == nil {
		e.have, e.ports = have, hports
	}
	return fmt.Errorf("fail closed: %w", err)
}

// mapFullErr reports whether err is a map's refusal of a new entry for
// lack of room (a hash map's E2BIG, an LPM trie's ENOSPC).
func mapFullErr(err error) bool {
	return errors.Is(err, unix.E2BIG) || errors.Is(err, unix.ENOSPC) || errors.Is(err, ErrMapFull)
}

// The maps whose refusals mapFullCounts counts.
const (
	mapPolicy = iota
	mapIPCache
	mapCount
)

// MapFullNames name the maps of MapFullCounts.
var MapFullNames = [mapCount]string{mapPolicy: "policy", mapIPCache: "ipcache"}

// mapFullCounts counts writes a full map refused, by map.
type mapFullCounts [mapCount]atomic.Uint64

func (c *mapFullCounts) add(m int) { c[m].Add(1) }

// MapFull returns how many writes each map refused for lack of room since
// the start, by MapFullNames: "policy" counts regenerations of an
// endpoint whose policy did not fit its policy maps (each failed closed),
// "ipcache" entries the ipcache refused.
func (l *Linux) MapFull() map[string]uint64 {
	out := make(map[string]uint64, mapCount)
	for i, name := range MapFullNames {
		out[name] = l.mapFull[i].Load()
	}
	return out
}

// MapUsage counts the entries of the shared maps that fill with the
// cluster's load, by name: "ct" (an LRU: at MaxEntries it evicts) and
// "ipcache" (at MaxEntries it refuses new prefixes). Each call reads the
// maps (conntrack in batches of ctBatch, the ipcache key by key), for a
// metrics scrape.
func (l *Linux) MapUsage() (out map[string]MapUsage, err error) {
	err = l.guardBPF(func(b *bpfState) error {
		ct, err := countCT(b.maps.ct)
		if err != nil {
			return err
		}
		n := 0
		var k bpf.EndpointIpcacheKey
		for key := any(nil); ; n++ {
			if err := b.maps.ipcache.NextKey(key, &k); errors.Is(err, ebpf.ErrKeyNotExist) {
				break
			} else if err != nil {
				return fmt.Errorf("count ipcache: %w", err)
			}
			key = k
		}
		out = map[string]MapUsage{
			"ct":      {Entries: ct, MaxEntries: int(b.maps.ct.MaxEntries())},
			"ipcache": {Entries: n, MaxEntries: int(b.maps.ipcache.MaxEntries())},
		}
		return nil
	})
	return out, err
}

// countCT counts the conntrack entries (batch lookups, or key by key on
// kernels without them).
func countCT(m *ebpf.Map) (int, error) {
	keys := make([]bpf.EndpointCtKey, ctBatch)
	vals := make([]bpf.EndpointCtValue, ctBatch)
	var cursor ebpf.MapBatchCursor
	total := 0
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		total += n
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return total, nil
		case errors.Is(err, ebpf.ErrNotSupported):
			total = 0
			var k bpf.EndpointCtKey
			var v bpf.EndpointCtValue
			it := m.Iterate()
			for it.Next(&k, &v) {
				total++
			}
			return total, it.Err()
		case err != nil:
			return 0, fmt.Errorf("count conntrack: %w", err)
		}
	}
}
