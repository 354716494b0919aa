package datapath

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/membrane-cni/membrane/pkg/identity"
)

// UpsertIPCache implements Datapath. The ipcache is a BPF map; until the
// BPF programs are loaded there is nothing to enforce with it.
func (l *Linux) UpsertIPCache(_ context.Context, prefix netip.Prefix, _ identity.NumericIdentity) error {
	if !prefix.IsValid() {
		return fmt.Errorf("upsert ipcache: invalid prefix: %w", ErrInvalidConfig)
	}
	return nil
}

// DeleteIPCache implements Datapath.
func (l *Linux) DeleteIPCache(_ context.Context, prefix netip.Prefix) error {
	if !prefix.IsValid() {
		return fmt.Errorf("delete ipcache: invalid prefix: %w", ErrInvalidConfig)
	}
	return nil
}
