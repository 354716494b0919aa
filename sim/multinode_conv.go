package sim

import (
	"net/netip"
	"sync"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// convTracker measures convergence through the real agents: for every
// endpoint created on one node, the time from its creation request's
// answer (the endpoint is in its node's index with its identity) until
// each other node's actor-system ipcache (its index) holds the address
// with that identity: the moment that node's kvstore mirror's call to the
// front door (ChangeRemoteEndpoints, ReplaceRemoteEndpoints) returned,
// which it does once the index holds them (agent.Config.KvstoreObserver). A pair is given up (not timed) when the endpoint is
// deleted first, or either node crashes while it waits; an endpoint with
// a pair given up has no "everywhere" time.
type convTracker struct {
	// mu guards everything below.
	mu      sync.Mutex
	pending []map[netip.Addr]*convEP // per observing node
	eps     map[netip.Addr]*convEP   // endpoints still waited for somewhere
	down    []bool
	// early holds, for endpoints being created, what nodes took before
	// the creation was answered (the answer and the first hand-over race).
	early map[netip.Addr]map[int]identity.NumericIdentity
	// perNode times the arrival at each node; everywhere the arrival at
	// the last of the other nodes.
	perNode    []histogram
	everywhere histogram
	abandoned  int
	// Once every worker has reached its endpoints (the ramp-up is over),
	// endpoints are timed in the steady histograms as well.
	toFull                         int
	steadyToNode, steadyEverywhere histogram
	// ph holds the sampled endpoints' per-phase clocks (multinode_phase.go)
	// from their creation on; phases their distributions.
	ph     map[netip.Addr]*epPhases
	phases phaseHists
}

// convEP is one created endpoint being waited for.
type convEP struct {
	origin    int
	id        identity.NumericIdentity
	created   time.Time
	remaining int  // nodes it has not reached yet
	abandoned bool // a pair was given up
	steady    bool // created after the ramp-up
}

// newConvTracker tracks nodes nodes whose workers drivers ramp up.
func newConvTracker(nodes, workers int) *convTracker {
	t := &convTracker{pending: make([]map[netip.Addr]*convEP, nodes), eps: map[netip.Addr]*convEP{},
		down: make([]bool, nodes), perNode: make([]histogram, nodes), toFull: workers, early: map[netip.Addr]map[int]identity.NumericIdentity{},
		ph: map[netip.Addr]*epPhases{}}
	for i := range t.pending {
		t.pending[i] = map[netip.Addr]*convEP{}
	}
	return t
}

// creating notes that an endpoint with address ip is being created
// (until created or failed).
func (t *convTracker) creating(ip netip.Addr) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dropLocked(ip) // an address reused before its old endpoint arrived everywhere
	t.early[ip] = map[int]identity.NumericIdentity{}
	if sampled(ip) {
		t.ph[ip] = &epPhases{node: make([][4]time.Time, len(t.pending))}
	}
}

// failed forgets an endpoint whose creation failed.
func (t *convTracker) failed(ip netip.Addr) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.early, ip)
	delete(t.ph, ip)
}

// created starts the clock for ip (identity id) created on node origin; a
// node that took it before the answer counts as 0.
func (t *convTracker) created(origin int, ip netip.Addr, id identity.NumericIdentity, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dropLocked(ip)
	early := t.early[ip]
	delete(t.early, ip)
	ep := &convEP{origin: origin, id: id, created: at, steady: t.toFull <= 0}
	if ph := t.ph[ip]; ph != nil {
		ph.ep, ph.id = ep, id
	}
	defer func() {
		for j, got := range early {
			if got == id && t.pending[j][ip] == ep {
				t.arrivedLocked(j, ip, ep, at)
			}
		}
	}()
	for j := range t.pending {
		if j == origin {
			continue
		}
		if t.down[j] {
			ep.abandoned = true
			t.abandoned++
			continue
		}
		t.pending[j][ip] = ep
		ep.remaining++
	}
	if ep.remaining > 0 {
		t.eps[ip] = ep
	}
}

// workerFull notes that a driver reached its endpoints.
func (t *convTracker) workerFull() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.toFull--
}

// deleted gives up ip's pairs still waiting (its endpoint is being
// deleted).
func (t *convTracker) deleted(ip netip.Addr) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dropLocked(ip)
}

func (t *convTracker) dropLocked(ip netip.Addr) {
	if ph := t.ph[ip]; ph != nil && ph.ep != nil {
		delete(t.ph, ip)
	}
	ep, ok := t.eps[ip]
	if !ok {
		return
	}
	delete(t.eps, ip)
	for j := range t.pending {
		if t.pending[j][ip] == ep {
			delete(t.pending[j], ip)
			t.abandoned++
		}
	}
}

// nodeDown gives up every pair node j observes or originated, until
// nodeUp.
func (t *convTracker) nodeDown(j int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.down[j] = true
	for ip, ep := range t.pending[j] {
		delete(t.pending[j], ip)
		t.abandoned++
		ep.abandoned = true
		if ep.remaining--; ep.remaining == 0 {
			delete(t.eps, ip)
		}
	}
	for ip, ep := range t.eps {
		if ep.origin == j {
			t.dropLocked(ip)
		}
	}
}

func (t *convTracker) nodeUp(j int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.down[j] = false
}

// arrivedLocked records that ep reached node j at now.
func (t *convTracker) arrivedLocked(j int, ip netip.Addr, ep *convEP, now time.Time) {
	t.phaseArrivedLocked(j, ip, ep, now)
	delete(t.pending[j], ip)
	d := now.Sub(ep.created)
	t.perNode[j].observe(d)
	if ep.steady {
		t.steadyToNode.observe(d)
	}
	if ep.remaining--; ep.remaining == 0 {
		delete(t.eps, ip)
		if !ep.abandoned {
			t.everywhere.observe(d)
			if ep.steady {
				t.steadyEverywhere.observe(d)
			}
		}
	}
}

// waitingAt lists the nodes where ip, created and tracked, has not
// arrived yet (none once it arrived everywhere, or when it is not
// tracked).
func (t *convTracker) waitingAt(ip netip.Addr) []int {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []int
	for j := range t.pending {
		if t.pending[j][ip] != nil {
			out = append(out, j)
		}
	}
	return out
}

// observe is node j's agent telling that its ipcache (the actor system's
// index) holds eps: the kvstore mirror's call to the front door returned.
func (t *convTracker) observe(j int, eps []endpoint.Remote) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range eps {
		for _, ip := range r.IPs {
			if ep := t.pending[j][ip]; ep != nil && ep.id == r.Identity {
				t.arrivedLocked(j, ip, ep, now)
			} else if e, ok := t.early[ip]; ok {
				e[j] = r.Identity
			}
		}
	}
}

// ConvergenceReport is what the convergence tracker measured (latencies
// in ms, histograms as the single-node report's).
type ConvergenceReport struct {
	// ToNode: the endpoint's arrival at one other node, over all (endpoint,
	// node) pairs; Everywhere: its arrival at the last of the other nodes.
	ToNode     *OpStats `json:"to-node"`
	Everywhere *OpStats `json:"everywhere"`
	// SteadyToNode and SteadyEverywhere are the same for the endpoints
	// created after every node reached its endpoints (the churn at full
	// size, without the ramp-up).
	SteadyToNode     *OpStats `json:"steady-to-node"`
	SteadyEverywhere *OpStats `json:"steady-everywhere"`
	// Abandoned counts pairs not timed: the endpoint was deleted, or a
	// node crashed, before it arrived; Pending pairs still waiting at the
	// end of the run (counted as violations when the run settled).
	Abandoned int `json:"abandoned-pairs"`
	Pending   int `json:"pending-pairs"`
	// Phases is the per-phase clock of a sample of the endpoints.
	Phases *PhaseReport `json:"phases,omitempty"`
}

// report summarises the tracker (nodeP99 per node, in ms).
func (t *convTracker) report() (*ConvergenceReport, []float64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var all histogram
	p99 := make([]float64, len(t.perNode))
	for j := range t.perNode {
		all.merge(&t.perNode[j])
		p99[j] = histStats(&t.perNode[j]).P99
	}
	r := &ConvergenceReport{ToNode: histStats(&all), Everywhere: histStats(&t.everywhere), SteadyToNode: histStats(&t.steadyToNode),
		SteadyEverywhere: histStats(&t.steadyEverywhere), Abandoned: t.abandoned,
		Phases: t.phaseReportLocked()}
	for j := range t.pending {
		r.Pending += len(t.pending[j])
	}
	return r, p99
}
