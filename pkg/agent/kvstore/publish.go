package kvstore

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/index"
)

// EndpointSource lists the agent's local endpoints (*index.Index).
type EndpointSource interface {
	Endpoints(f index.EndpointFilter) []*endpoint.Endpoint
}

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Addrs are this node's underlay addresses, PodCIDRs its pod ranges
	// (what other nodes route to it).
	Addrs    []netip.Addr
	PodCIDRs []netip.Prefix
	// Source lists the local endpoints; Hub (may be nil) wakes the
	// publisher when one changes.
	Source EndpointSource
	Hub    *events.Hub
	// Coalesce is how long a change waits for more before the publisher
	// writes (default 50 ms); Resync is the time between full
	// comparisons without any event (default 1 min).
	Coalesce, Resync time.Duration
}

// maxTxnOps is how many operations one transaction carries (etcd's
// default --max-txn-ops is 128).
const maxTxnOps = 100

// Publisher writes this node (state/nodes/v1/<node>) and its local
// endpoints (state/endpoints/v1/<node>/<id>) under the node lease, from
// the agent's index: an endpoint is published once it has an identity
// and until it starts disconnecting. Endpoint events only wake it, and a
// burst of them costs one comparison of the index against what etcd was
// last told; writes failed while etcd is unreachable are retried.
type Publisher struct {
	c    *Client
	cfg  PublisherConfig
	self string // this node's record
	ctx  context.Context
	stop context.CancelFunc
	done chan struct{}
	kick chan struct{}

	// mu guards published, lease and the counters.
	mu        sync.Mutex
	published map[string]string // key -> value as etcd holds it
	lease     clientv3.LeaseID  // the lease published was written under
	writes    int
	lastErr   error
}

// StartPublisher starts publishing.
func StartPublisher(c *Client, cfg PublisherConfig) (*Publisher, error) {
	if cfg.Source == nil {
		return nil, fmt.Errorf("start publisher: no endpoint source: %w", ErrInvalidConfig)
	}
	if cfg.Coalesce <= 0 {
		cfg.Coalesce = 50 * time.Millisecond
	}
	if cfg.Resync <= 0 {
		cfg.Resync = time.Minute
	}
	self, err := json.Marshal(nodeRecord{Name: c.cfg.NodeName, Addrs: nonNil(cfg.Addrs), PodCIDRs: nonNil(cfg.PodCIDRs)})
	if err != nil {
		return nil, fmt.Errorf("start publisher: %w", err)
	}
	ctx, stop := context.WithCancel(c.ctx)
	p := &Publisher{c: c, cfg: cfg, self: string(self), ctx: ctx, stop: stop, done: make(chan struct{}),
		kick: make(chan struct{}, 1), published: map[string]string{}}
	c.OnLease(func(clientv3.LeaseID) { p.poke() })
	go p.run()
	return p, nil
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func (p *Publisher) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Stop stops publishing; the keys stay until the lease expires (a
// restarted agent writes them again).
func (p *Publisher) Stop() {
	p.stop()
	<-p.done
}

// PublisherStats is what a Publisher has done.
type PublisherStats struct {
	Published int
	Writes    int
	LastError string
}

// Stats returns what the publisher has done.
func (p *Publisher) Stats() PublisherStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := PublisherStats{Published: len(p.published), Writes: p.writes}
	if p.lastErr != nil {
		st.LastError = p.lastErr.Error()
	}
	return st
}

func (p *Publisher) run() {
	defer close(p.done)
	var sub *events.Subscription
	var ready <-chan struct{}
	if p.cfg.Hub != nil {
		sub = p.cfg.Hub.Subscribe(0)
		defer sub.Close()
		ready = sub.Ready()
	}
	resync := time.NewTicker(p.cfg.Resync)
	defer resync.Stop()
	dirty, backoff := true, 100*time.Millisecond
	for {
		if dirty {
			resumed := p.c.Resumed()
			if err := p.sync(); err != nil {
				// A new lease (kick) or etcd back ends the wait.
				if !sleepOr(p.ctx, backoff, resumed, p.kick) {
					return
				}
				backoff = min(2*backoff, 2*time.Second)
				continue
			}
			dirty, backoff = false, 100*time.Millisecond
		}
		select {
		case <-p.ctx.Done():
			return
		case <-p.kick:
			dirty = true
		case <-resync.C:
			dirty = true
		case <-ready:
			dirty = drain(sub)
			if dirty && !sleep(p.ctx, p.cfg.Coalesce) {
				return
			}
			drain(sub)
		}
	}
}

// drain reads every pending event; it reports whether one concerns
// endpoints (or events were missed).
func drain(sub *events.Subscription) bool {
	relevant := false
	for {
		ev, ok := sub.TryNext()
		if !ok {
			return relevant
		}
		switch ev.Type {
		case events.EndpointCreated, events.EndpointStateChanged, events.EndpointDeleted, events.Missed:
			relevant = true
		}
	}
}

// desired is what etcd should hold for this node.
func (p *Publisher) desired() map[string]string {
	node := p.c.cfg.NodeName
	var nodeIP netip.Addr
	for _, a := range p.cfg.Addrs {
		if !nodeIP.IsValid() || (a.Is4() && !nodeIP.Is4()) {
			nodeIP = a
		}
	}
	want := map[string]string{p.c.keys.node(node): p.self}
	for _, ep := range p.cfg.Source.Endpoints(index.EndpointFilter{}) {
		if ep.Identity == 0 || ep.State == endpoint.StateDisconnecting || ep.State == endpoint.StateDisconnected {
			continue
		}
		rec := endpointRecord{Identity: uint32(ep.Identity), Node: node, NodeIP: nodeIP}
		for _, ip := range []netip.Addr{ep.IPv4, ep.IPv6} {
			if ip.IsValid() {
				rec.IPs = append(rec.IPs, ip)
			}
		}
		if len(rec.IPs) == 0 {
			continue
		}
		v, _ := json.Marshal(rec) // addresses and numbers always marshal
		want[p.c.keys.endpoint(node, uint16(ep.ID))] = string(v)
	}
	return want
}

// sync writes the difference between the index and what etcd holds.
func (p *Publisher) sync() error {
	lease, ok := p.c.Lease()
	if !ok {
		return ErrUnavailable
	}
	p.mu.Lock()
	if p.lease != lease { // a new lease: everything is written again
		clear(p.published)
		p.lease = lease
	}
	var ops []clientv3.Op
	want := p.desired()
	for k, v := range want {
		if p.published[k] != v {
			ops = append(ops, clientv3.OpPut(k, v, clientv3.WithLease(lease)))
		}
	}
	for k := range p.published {
		if _, ok := want[k]; !ok {
			ops = append(ops, clientv3.OpDelete(k))
		}
	}
	p.mu.Unlock()
	for batch := range slices.Chunk(ops, maxTxnOps) {
		err := p.c.call(p.ctx, "publish endpoints", func(ctx context.Context) error {
			_, err := p.c.cli.Txn(ctx).Then(batch...).Commit()
			return err
		})
		p.record(batch, want, err)
		if err != nil {
			return err
		}
	}
	if cur, _ := p.c.Lease(); cur != lease {
		p.poke()
	}
	return nil
}

// record notes a batch's outcome.
func (p *Publisher) record(batch []clientv3.Op, want map[string]string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastErr = err
	if err != nil {
		return
	}
	p.writes++
	for _, op := range batch {
		k := string(op.KeyBytes())
		if op.IsDelete() {
			delete(p.published, k)
		} else {
			p.published[k] = want[k]
		}
	}
}
