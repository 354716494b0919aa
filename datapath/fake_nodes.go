package datapath

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

var _ NodeRouter = (*Fake)(nil)

// SyncNodes implements NodeRouter: the Fake records the set (sorted by
// name). FakeHooks.BeforeSyncNodes may fail it.
func (f *Fake) SyncNodes(ctx context.Context, nodes []RemoteNode) error {
	f.mu.Lock()
	hook := f.hooks.BeforeSyncNodes
	f.mu.Unlock()
	if hook != nil {
		if err := hook(ctx, nodes); err != nil {
			return fmt.Errorf("sync nodes: %w", err)
		}
	}
	if err := ValidateNodes(nodes); err != nil {
		return fmt.Errorf("sync nodes: %w", err)
	}
	set := slices.Clone(nodes)
	slices.SortFunc(set, func(a, b RemoteNode) int { return strings.Compare(a.Name, b.Name) })
	f.mu.Lock()
	f.nodes = set
	f.nodeSyncs++
	f.mu.Unlock()
	return nil
}

// Nodes returns the last set SyncNodes recorded (sorted by name) and how
// many syncs ran.
func (f *Fake) Nodes() ([]RemoteNode, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.nodes), f.nodeSyncs
}
