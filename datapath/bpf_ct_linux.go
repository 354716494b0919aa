package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// ctBatch is how many conntrack entries one batch lookup reads: 4096 x
// 60 bytes (key and value) is 240 KiB of buffers, 16 syscalls for a
// full map (65,536 entries).
const ctBatch = 4096

// flushConntrack deletes endpoint id's conntrack entries, so an
// endpoint that later gets the same ID (and address) inherits none. It
// reads the whole shared map once (bounded by its size; batch lookups,
// or key by key on kernels without batch operations) and then deletes
// the matches. Returns how many it deleted.
func flushConntrack(m *ebpf.Map, id endpoint.ID) (int, error) {
	victims, err := ctKeysOf(m, id)
	if err != nil {
		return 0, fmt.Errorf("flush conntrack of endpoint %d: %w", id, err)
	}
	n := 0
	for _, k := range victims {
		err := m.Delete(k)
		if errors.Is(err, ebpf.ErrKeyNotExist) { // expired or evicted meanwhile
			continue
		}
		if err != nil {
			return n, fmt.Errorf("flush conntrack of endpoint %d: %w", id, err)
		}
		n++
	}
	return n, nil
}

// ctKeysOf returns the conntrack keys of endpoint id.
func ctKeysOf(m *ebpf.Map, id endpoint.ID) ([]bpf.EndpointCtKey, error) {
	var out []bpf.EndpointCtKey
	keys := make([]bpf.EndpointCtKey, ctBatch)
	vals := make([]bpf.EndpointCtValue, ctBatch)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for _, k := range keys[:n] {
			if k.Ep == uint16(id) {
				out = append(out, k)
			}
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist): // the end
			return out, nil
		case errors.Is(err, ebpf.ErrNotSupported):
			return ctKeysIterate(m, id)
		case err != nil:
			return nil, err
		}
	}
}

// ctKeysIterate is ctKeysOf key by key.
func ctKeysIterate(m *ebpf.Map, id endpoint.ID) ([]bpf.EndpointCtKey, error) {
	var out []bpf.EndpointCtKey
	var k bpf.EndpointCtKey
	var v bpf.EndpointCtValue
	it := m.Iterate()
	for it.Next(&k, &v) {
		if k.Ep == uint16(id) {
			out = append(out, k)
		}
	}
	return out, it.Err()
}
