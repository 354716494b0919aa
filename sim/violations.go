package sim

import (
	"sort"
	"sync"
)

// Invariants, as named in reports.
const (
	// invIPOwnedTwice: an address used or claimed by two endpoints, or
	// given to a pod while another pod held it.
	invIPOwnedTwice = "ip-owned-twice"
	// invIPAMAccounting: used plus free is not the pool, or an endpoint
	// uses an address IPAM does not hold.
	invIPAMAccounting = "ipam-accounting"
	// invIPLeaked: an address allocated that no live pod holds.
	invIPLeaked = "ip-leaked"
	// invIdentity: an identity's refcount does not match its endpoints and
	// leases, or an endpoint's identity does not match its labels.
	invIdentity = "identity-refcount"
	// invIndexActors: the index disagrees with the actors (missing or
	// extra actor, lease holder not the endpoint's actor, mailbox not
	// empty at quiescence).
	invIndexActors = "index-actors-disagree"
	// invEndpointLost: an endpoint whose ADD was acknowledged is gone
	// without a DEL (after a restart, or found missing by a DEL).
	invEndpointLost = "endpoint-lost"
	// invDeleteUndone: an endpoint exists whose DEL was acknowledged, or
	// that no pod accounts for.
	invDeleteUndone = "delete-undone"
	// invEndpointDiffers: an endpoint's address or labels differ from
	// what was acknowledged.
	invEndpointDiffers = "endpoint-differs"
	// invNotReady: an endpoint not ready at quiescence.
	invNotReady = "endpoint-not-ready"
	// invDatapath: the datapath disagrees with the index (revision, or
	// state left behind that was not handed to garbage collection).
	invDatapath = "datapath-disagrees"
	// invDeleteQueue: DELs or datapath work still pending at the end.
	invDeleteQueue = "delete-queue-not-empty"
	// invLeakedActors and invLeakedGoroutines: more actors (processes) or
	// goroutines at the end than before the load.
	invLeakedActors     = "leaked-actors"
	invLeakedGoroutines = "leaked-goroutines"
	// invAgent: the agent failed to restart or to settle.
	invAgent = "agent-failed"
)

// Violation is one broken invariant, with the endpoint and the events that
// led to it when there is one.
type Violation struct {
	Invariant string `json:"invariant"`
	// AtS is when it was found, in seconds since the run started.
	AtS   float64 `json:"at_s"`
	Phase string  `json:"phase"`
	// Endpoint names the pod's container ID and, when known, the endpoint ID.
	Endpoint string   `json:"endpoint,omitempty"`
	Message  string   `json:"message"`
	History  []string `json:"history,omitempty"`
}

// maxDetailed bounds the violations kept with details; the rest are counted.
const maxDetailed = 200

// violations collects a run's violations, once per invariant and subject.
type violations struct {
	mu    sync.Mutex // guards everything below
	list  []Violation
	byInv map[string]int
	seen  map[string]bool
	total int
}

func newViolations() *violations {
	return &violations{byInv: map[string]int{}, seen: map[string]bool{}}
}

// add records v unless the same invariant was already reported for the
// same subject (key); it reports whether v was new.
func (vs *violations) add(key string, v Violation) bool {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	k := v.Invariant + "|" + key
	if key != "" && vs.seen[k] {
		return false
	}
	vs.seen[k] = true
	vs.total++
	vs.byInv[v.Invariant]++
	if len(vs.list) < maxDetailed {
		vs.list = append(vs.list, v)
	}
	return true
}

func (vs *violations) count() int {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	return vs.total
}

func (vs *violations) snapshot() (list []Violation, byInv map[string]int, total int) {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	list = append([]Violation{}, vs.list...)
	sort.SliceStable(list, func(i, j int) bool { return list[i].AtS < list[j].AtS })
	byInv = make(map[string]int, len(vs.byInv))
	for k, v := range vs.byInv {
		byInv[k] = v
	}
	return list, byInv, vs.total
}
