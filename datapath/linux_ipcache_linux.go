package datapath

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/identity"
)

// UpsertIPCache implements Datapath: the shared ipcache LPM trie maps
// prefix to id for every endpoint program (a miss is world).
func (l *Linux) UpsertIPCache(_ context.Context, prefix netip.Prefix, id identity.NumericIdentity) error {
	if !prefix.IsValid() {
		return fmt.Errorf("upsert ipcache: invalid prefix: %w", ErrInvalidConfig)
	}
	return l.guardBPF(func(b *bpfState) error {
		v := bpf.EndpointIpcacheValue{Identity: uint32(id)}
		if err := b.maps.ipcache.Update(ipcacheKey(prefix), v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("upsert ipcache %s: %w", prefix, err)
		}
		return nil
	})
}

// DeleteIPCache implements Datapath; a missing entry is success.
func (l *Linux) DeleteIPCache(_ context.Context, prefix netip.Prefix) error {
	if !prefix.IsValid() {
		return fmt.Errorf("delete ipcache: invalid prefix: %w", ErrInvalidConfig)
	}
	return l.guardBPF(func(b *bpfState) error {
		err := b.maps.ipcache.Delete(ipcacheKey(prefix))
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete ipcache %s: %w", prefix, err)
		}
		return nil
	})
}
