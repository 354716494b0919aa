package datapath

import (
	"context"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// Collector is implemented by datapaths that can find and remove kernel
// objects no endpoint owns (the agent's periodic garbage collector runs
// it in the worker pool).
type Collector interface {
	// GC removes orphans: objects of endpoints that are not in live. An
	// object becomes an orphan only when two consecutive passes saw it
	// without an endpoint (a CNI ADD creates its veth before its endpoint
	// exists), so the interval between passes must exceed the longest ADD.
	// It also reports the endpoints of live whose host interface was
	// missing in two consecutive passes; the caller deletes them.
	GC(ctx context.Context, live []*endpoint.Endpoint) (GCReport, error)
}

// GCReport says what one GC pass found and did.
type GCReport struct {
	// Links are the host interfaces deleted (orphan lxc veths).
	Links []string `json:"links,omitempty"`
	// Pins are the pin directories removed (under <bpffs>/endpoints).
	Pins []string `json:"pins,omitempty"`
	// Suspects is how many orphans this pass saw for the first time; the
	// next pass removes those still orphaned.
	Suspects int `json:"suspects,omitempty"`
	// Missing are live endpoints whose host interface was missing in this
	// pass and the one before.
	Missing []endpoint.ID `json:"missing,omitempty"`
	// Tombstones is how many tombstone veths (a removed endpoint's, see
	// ifname.Tombstone) this pass found with no deletion pending, left
	// by an agent killed before its deferred deletion; their deletion is
	// deferred now.
	Tombstones int `json:"tombstones,omitempty"`
}

// Empty reports whether the pass removed and found nothing.
func (r GCReport) Empty() bool {
	return len(r.Links) == 0 && len(r.Pins) == 0 && r.Suspects == 0 && len(r.Missing) == 0 && r.Tombstones == 0
}

// sweep is the two-pass bookkeeping of one kind of object: a key is
// reported once it was seen orphaned in two consecutive passes.
type sweep[K comparable] struct {
	seen map[K]bool // orphans of the previous pass
}

// pass takes this pass's orphans and returns those also orphaned in the
// previous pass (to remove) and how many are new (suspects). Confirmed
// orphans stay remembered: one whose removal failed is confirmed again
// by the next pass.
func (s *sweep[K]) pass(orphans []K) (confirmed []K, suspects int) {
	next := make(map[K]bool, len(orphans))
	for _, k := range orphans {
		if s.seen[k] {
			confirmed = append(confirmed, k)
		} else {
			suspects++
		}
		next[k] = true
	}
	s.seen = next
	return confirmed, suspects
}

var (
	_ Collector = (*Fake)(nil)
	_ Collector = (*Linux)(nil)
)
