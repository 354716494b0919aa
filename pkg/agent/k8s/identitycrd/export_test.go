package identitycrd

import (
	"strconv"

	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
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

// CachedForTest is the lowest number the informer cache holds ls at.
func (b *Backend) CachedForTest(ls labels.Labels) (identity.NumericIdentity, bool) {
	return b.cached(ls.Key())
}

// CachedObjectForTest is the informer cache's object of id (nil when
// absent).
func (b *Backend) CachedObjectForTest(id identity.NumericIdentity) *v2.MembraneIdentity {
	mi, _ := b.get(id)
	return mi
}

// GCVerdictForTest is the collector's last decision on id, with its
// reason.
func (b *Backend) GCVerdictForTest(id identity.NumericIdentity) string {
	v, ok := b.marks.Verdict(strconv.Itoa(int(id)))
	if !ok {
		return "no verdict (not seen by the last pass, or the collector has not run)"
	}
	return v.String()
}
