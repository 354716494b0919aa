package identitycrd

import (
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// SlotForTest is the first candidate number of ls.
func (b *Backend) SlotForTest(ls labels.Labels) identity.NumericIdentity {
	return b.cfg.MinID + identity.NumericIdentity(b.slot(ls.Key()))
}

// Synced reports whether the informer listed the identities.
func (b *Backend) SyncedForTest() bool { return b.informer.HasSynced() }

// CachedUsageForTest is the usage of id in the informer cache (nil, false
// when the cache does not hold id).
func (b *Backend) CachedUsageForTest(id identity.NumericIdentity) (map[string]string, bool) {
	mi, ok := b.get(id)
	if !ok {
		return nil, false
	}
	return mi.Usage, true
}
