package l7proxy

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
)

// Tracker remembers which configuration versions endpoints wait for and
// completes the waits when the proxy acknowledges (or rejects) a version
// that covers them. Versions grow: an acknowledgement of version n
// acknowledges every version up to n. Safe for concurrent use; the
// callbacks run without the lock held and must not block.
type Tracker struct {
	mu      sync.Mutex
	acked   uint64
	waits   map[waitKey]uint64 // -> version needed
	onAck   func(ep, rev uint64)
	onNack  func(ep, rev uint64, reason string)
	nacks   uint64
	lastErr string
	// needs is the version of each endpoint's current configuration
	// (Wait), for the per-endpoint status.
	needs map[uint64]uint64
}

type waitKey struct{ ep, rev uint64 }

// NewTracker returns a tracker calling onAck when a wait is acknowledged
// and onNack when the version it needs is rejected.
func NewTracker(onAck func(ep, rev uint64), onNack func(ep, rev uint64, reason string)) *Tracker {
	return &Tracker{waits: map[waitKey]uint64{}, needs: map[uint64]uint64{}, onAck: onAck, onNack: onNack}
}

// maxWaits bounds the pending waits (one per endpoint revision in
// flight; older revisions of an endpoint are dropped by Wait).
const maxWaits = 1 << 16

// Wait registers that endpoint ep's revision rev needs version v. It
// reports false (no wait) when v is already acknowledged. A newer
// revision of ep replaces its older waits.
func (t *Tracker) Wait(ep, rev, v uint64) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.needs[ep] = v
	if v <= t.acked {
		return false, nil
	}
	for k := range t.waits {
		if k.ep == ep && k.rev < rev {
			delete(t.waits, k)
		}
	}
	if len(t.waits) >= maxWaits {
		return false, fmt.Errorf("proxy waits: %d pending, limit reached", len(t.waits))
	}
	t.waits[waitKey{ep, rev}] = v
	return true, nil
}

// Forget drops the waits of endpoint ep (deleted).
func (t *Tracker) Forget(ep uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.needs, ep)
	for k := range t.waits {
		if k.ep == ep {
			delete(t.waits, k)
		}
	}
}

// EndpointAck is one endpoint's configuration version and whether the
// proxy acknowledged it.
type EndpointAck struct {
	Endpoint uint64 `json:"endpoint"`
	Version  uint64 `json:"version"`
	Acked    bool   `json:"acked"`
}

// Endpoint returns endpoint ep's configuration version and whether it
// is acknowledged; false if ep never had L7 configuration.
func (t *Tracker) Endpoint(ep uint64) (EndpointAck, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.needs[ep]
	return EndpointAck{Endpoint: ep, Version: v, Acked: v <= t.acked}, ok
}

// Ack records that the proxy applied version v and completes the waits
// it covers.
func (t *Tracker) Ack(v uint64) {
	t.mu.Lock()
	if v > t.acked {
		t.acked = v
	}
	done := t.take(func(need uint64) bool { return need <= v })
	t.mu.Unlock()
	for _, k := range done {
		t.onAck(k.ep, k.rev)
	}
}

// Nack records that the proxy rejected version v: the waits needing a
// version in (acknowledged, v] fail with reason.
func (t *Tracker) Nack(v uint64, reason string) {
	t.mu.Lock()
	t.nacks++
	t.lastErr = reason
	acked := t.acked
	done := t.take(func(need uint64) bool { return need > acked && need <= v })
	t.mu.Unlock()
	for _, k := range done {
		t.onNack(k.ep, k.rev, reason)
	}
}

func (t *Tracker) take(match func(need uint64) bool) []waitKey {
	var out []waitKey
	for k, need := range t.waits {
		if match(need) {
			out = append(out, k)
			delete(t.waits, k)
		}
	}
	return out
}

// TrackerStatus is what a Tracker knows.
type TrackerStatus struct {
	// Acked is the highest version the proxy acknowledged.
	Acked uint64 `json:"acked"`
	// Pending counts the endpoint revisions waiting.
	Pending int `json:"pending"`
	// Nacks counts rejections; LastNack is the last one's reason.
	Nacks    uint64 `json:"nacks"`
	LastNack string `json:"lastNack,omitempty"`
	// Endpoints are the endpoints' configuration versions, by ID.
	Endpoints []EndpointAck `json:"endpoints,omitempty"`
}

// Status returns the tracker's state.
func (t *Tracker) Status() TrackerStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := TrackerStatus{Acked: t.acked, Pending: len(t.waits), Nacks: t.nacks, LastNack: t.lastErr}
	for ep, v := range t.needs {
		st.Endpoints = append(st.Endpoints, EndpointAck{Endpoint: ep, Version: v, Acked: v <= t.acked})
	}
	slices.SortFunc(st.Endpoints, func(a, b EndpointAck) int { return cmp.Compare(a.Endpoint, b.Endpoint) })
	return st
}
