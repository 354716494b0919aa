package sim

import (
	"context"
	"encoding/json"
	"net/netip"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// The per-phase clock: for a sample of the created endpoints (addresses
// whose last byte is a multiple of phaseSample), the time each passes
// every phase from its node's answer to the other nodes' ipcaches:
//
//	writing    the writer's publish transaction was sent (kvstore.Trace.Published)
//	published  it was answered
//	seen       a bare etcd watch in the simulator received it (etcd's fan-out
//	           to a watcher that does nothing else)
//	received   the node's mirror read the watch response (Trace.Received)
//	queued     its change was queued for the mirror's send loop
//	taken      the send loop took it to hand it over (Trace.Taken)
//	applied    the ipcache (the index) holds it: the convergence clock
//
// Each is timed from the creation's answer (a phase passed before it
// counts as 0), per pair (endpoint, other node) and, for an endpoint, at
// the last of the other nodes.
const phaseSample = 4

// convPhaseNames are the phases in order (PhaseReport's keys).
var convPhaseNames = [...]string{"writing", "published", "seen", "received", "queued", "taken", "applied"}

const (
	phWriting = iota
	phPublished
	phSeen
	phReceived
	phQueued
	phTaken
	phApplied
	nPhases
)

// epPhases is a sampled endpoint's clock: when it passed each phase,
// per node for the per-node ones (zero: not yet).
type epPhases struct {
	id   identity.NumericIdentity // 0: not yet published
	ep   *convEP                  // nil until created
	once [3]time.Time             // writing, published, seen
	node [][4]time.Time           // received, queued, taken, applied per node
}

// phaseHists are the phases' distributions.
type phaseHists struct {
	pair, last, steadyPair, steadyLast [nPhases]histogram
}

// sampled says whether ip is in the per-phase sample.
func sampled(ip netip.Addr) bool { return ip.Is4() && ip.As4()[3]%phaseSample == 0 }

// phaseLocked is ip's clock if ip is sampled and id (0: any) is its
// identity.
func (t *convTracker) phaseLocked(ip netip.Addr, id identity.NumericIdentity) *epPhases {
	ph := t.ph[ip]
	if ph == nil || (id != 0 && ph.id != 0 && ph.id != id) {
		return nil
	}
	return ph
}

// nodeTrace is node j's kvstore.Trace.
type nodeTrace struct {
	t *convTracker
	j int
}

var _ kvstore.Trace = nodeTrace{}

// sampledOf keeps the sampled addresses of eps (nil: none).
func sampledOf(eps []endpoint.Remote) []endpoint.Remote {
	var out []endpoint.Remote
	for _, r := range eps {
		for _, ip := range r.IPs {
			if sampled(ip) {
				out = append(out, endpoint.Remote{IPs: []netip.Addr{ip}, Identity: r.Identity})
			}
		}
	}
	return out
}

func (n nodeTrace) Published(eps []endpoint.Remote, start, done time.Time) {
	if eps = sampledOf(eps); len(eps) == 0 {
		return
	}
	n.t.mu.Lock()
	defer n.t.mu.Unlock()
	for _, r := range eps {
		if ph := n.t.phaseLocked(r.IPs[0], r.Identity); ph != nil && ph.once[phPublished].IsZero() {
			ph.id, ph.once[phWriting], ph.once[phPublished] = r.Identity, start, done
		}
	}
}

func (n nodeTrace) Received(eps []endpoint.Remote, got, queued time.Time) {
	n.stamp(eps, phReceived, got, queued)
}

func (n nodeTrace) Taken(eps []endpoint.Remote, at time.Time) { n.stamp(eps, phTaken, at) }

// stamp records the per-node phases from phase on at ats.
func (n nodeTrace) stamp(eps []endpoint.Remote, phase int, ats ...time.Time) {
	if eps = sampledOf(eps); len(eps) == 0 {
		return
	}
	n.t.mu.Lock()
	defer n.t.mu.Unlock()
	for _, r := range eps {
		ph := n.t.phaseLocked(r.IPs[0], r.Identity)
		if ph == nil {
			continue
		}
		for k, at := range ats {
			if s := &ph.node[n.j][phase-phReceived+k]; s.IsZero() {
				*s = at
			}
		}
	}
}

// seen records a bare watch's sight of ip with identity id at at.
func (t *convTracker) seen(ip netip.Addr, id identity.NumericIdentity, at time.Time) {
	if !sampled(ip) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if ph := t.phaseLocked(ip, id); ph != nil && ph.once[phSeen].IsZero() {
		ph.once[phSeen] = at
	}
}

// phaseArrivedLocked records ep's arrival (ip) at node j at now; once it
// arrived everywhere, its clock goes to the histograms.
func (t *convTracker) phaseArrivedLocked(j int, ip netip.Addr, ep *convEP, now time.Time) {
	ph := t.ph[ip]
	if ph == nil || ph.ep != ep {
		return
	}
	ph.node[j][3] = now
	at := func(k int) time.Time { // phase k at node j
		if k < phReceived {
			return ph.once[k]
		}
		return ph.node[j][k-phReceived]
	}
	for k := range nPhases {
		if a := at(k); !a.IsZero() {
			t.phases.pair[k].observe(a.Sub(ep.created))
			if ep.steady {
				t.phases.steadyPair[k].observe(a.Sub(ep.created))
			}
		}
	}
	if ep.remaining > 1 {
		return
	}
	delete(t.ph, ip)
	if ep.abandoned {
		return
	}
	for k := range nPhases {
		var last time.Time
		missing := false
		for o := range ph.node {
			if o == ep.origin {
				continue
			}
			a := ph.node[o][max(k-phReceived, 0)]
			if k < phReceived {
				a = ph.once[k]
			}
			if a.IsZero() {
				missing = true
				break
			}
			if a.After(last) {
				last = a
			}
		}
		if missing {
			continue
		}
		t.phases.last[k].observe(last.Sub(ep.created))
		if ep.steady {
			t.phases.steadyLast[k].observe(last.Sub(ep.created))
		}
	}
}

// PhaseReport is the per-phase clock (ms from the creation's answer;
// phases as convPhaseNames): Pair over (endpoint, other node) pairs, Last
// the last of the other nodes to pass each phase, for the sampled
// endpoints (one in phaseSample addresses); Steady* after the ramp-up.
type PhaseReport struct {
	Sample     int                 `json:"sample"`
	Pair       map[string]*OpStats `json:"pair"`
	Last       map[string]*OpStats `json:"last"`
	SteadyPair map[string]*OpStats `json:"steady-pair"`
	SteadyLast map[string]*OpStats `json:"steady-last"`
}

// phaseReportLocked summarises the per-phase clock.
func (t *convTracker) phaseReportLocked() *PhaseReport {
	r := &PhaseReport{Sample: phaseSample, Pair: map[string]*OpStats{}, Last: map[string]*OpStats{}, SteadyPair: map[string]*OpStats{},
		SteadyLast: map[string]*OpStats{}}
	for k, name := range convPhaseNames {
		for _, x := range []struct {
			m map[string]*OpStats
			h *histogram
		}{{r.Pair, &t.phases.pair[k]}, {r.Last, &t.phases.last[k]}, {r.SteadyPair, &t.phases.steadyPair[k]}, {r.SteadyLast, &t.phases.steadyLast[k]}} {
			s := histStats(x.h)
			s.Histogram = nil
			x.m[name] = s
		}
	}
	return r
}

// watchSeen watches the endpoint records with a bare etcd client until
// ctx ends, telling t when each sampled one arrives (the "seen" phase).
func watchSeen(ctx context.Context, endpoint, prefix string, t *convTracker) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	go func() {
		defer cli.Close()
		for ctx.Err() == nil {
			for resp := range cli.Watch(ctx, prefix, clientv3.WithPrefix()) {
				now := time.Now()
				for _, ev := range resp.Events {
					if ev.Type != clientv3.EventTypePut {
						continue
					}
					var rec struct {
						Identity uint32       `json:"identity"`
						IPs      []netip.Addr `json:"ips"`
					}
					if json.Unmarshal(ev.Kv.Value, &rec) != nil {
						continue
					}
					for _, ip := range rec.IPs {
						t.seen(ip, identity.NumericIdentity(rec.Identity), now)
					}
				}
			}
		}
	}()
	return nil
}
