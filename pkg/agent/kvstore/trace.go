package kvstore

import (
	"net/netip"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// Trace is told when a remote endpoint change passes each phase between
// its writer and the other nodes' ipcaches (Config.Trace; nil: none): the
// simulator's per-phase clock. Its methods are called from the publisher
// and the mirror's goroutines, some with the mirror's lock held: they
// must return at once.
type Trace interface {
	// Published: this node's transaction writing eps' records was sent at
	// start and answered at done.
	Published(eps []endpoint.Remote, start, done time.Time)
	// Received: a watch response carrying eps' records was read from the
	// client at got, and the changes were queued for the send loop at
	// queued.
	Received(eps []endpoint.Remote, got, queued time.Time)
	// Taken: the send loop took eps (their latest state) to hand them over.
	Taken(eps []endpoint.Remote, at time.Time)
}

// tracePublished tells the trace of a publish transaction's puts.
func (p *Publisher) tracePublished(batch []clientv3.Op, keys []string, want map[string]string, start, done time.Time) {
	t := p.c.cfg.Trace
	if t == nil {
		return
	}
	var eps []endpoint.Remote
	for i, op := range batch {
		if op.IsDelete() || keys[i] == p.c.keys.node(p.c.cfg.NodeName) {
			continue
		}
		dec, err := decodeEndpoint([]byte(want[keys[i]]))
		if err != nil {
			continue
		}
		eps = append(eps, endpoint.Remote{IPs: dec.IPs, Identity: identity.NumericIdentity(dec.Identity)})
	}
	if len(eps) > 0 {
		t.Published(eps, start, done)
	}
}

// traceTaken tells the trace what the send loop took.
func (m *Mirror) traceTaken(ups []endpoint.Remote, at time.Time) {
	if t := m.c.cfg.Trace; t != nil && len(ups) > 0 {
		t.Taken(ups, at)
	}
}

// traceReceived tells the trace what a watch response queued.
func (m *Mirror) traceReceived(final finalChanges, got time.Time) {
	t := m.c.cfg.Trace
	if t == nil {
		return
	}
	var eps []endpoint.Remote
	for ip, r := range final {
		if r != nil {
			eps = append(eps, endpoint.Remote{IPs: []netip.Addr{ip}, Identity: r.Identity})
		}
	}
	if len(eps) > 0 {
		t.Received(eps, got, time.Now())
	}
}
