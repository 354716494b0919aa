package kvstore

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// EndpointSource lists the agent's local endpoints (*index.Index).
type EndpointSource interface {
	Endpoints(f index.EndpointFilter) []*endpoint.Endpoint
	Endpoint(id endpoint.ID) (*endpoint.Endpoint, bool)
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
	// comparisons without any event (default 1 min). Changes are written
	// by comparing only the endpoints their events name, and FullEvery
	// (default 1 s) after such a write the index is compared in full.
	Coalesce, Resync, FullEvery time.Duration
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
	node nodeRecord // this node's record, but its health addresses
	ctx  context.Context
	stop context.CancelFunc
	done chan struct{}
	kick chan struct{}

	// mu guards published, records, lease and the counters.
	mu        sync.Mutex
	published map[string]string // key -> value as etcd holds it
	// records caches each endpoint's record as last encoded: a sync
	// encodes only the endpoints that changed, and an unchanged value is
	// the very string published holds (compared without reading it).
	records map[endpoint.ID]pubRecord
	gen     uint64 // the sync that last saw a record
	// healthID and health are the local health endpoint (identity health)
	// and its addresses, published in the node record, never as an
	// endpoint record (the other nodes refuse reserved identities there).
	healthID endpoint.ID
	health   []netip.Addr
	lease    clientv3.LeaseID // the lease published was written under
	writes   int
	lastErr  error
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
	if cfg.FullEvery <= 0 {
		cfg.FullEvery = time.Second
	}
	node := nodeRecord{Name: c.cfg.NodeName, Addrs: nonNil(cfg.Addrs), PodCIDRs: nonNil(cfg.PodCIDRs)}
	ctx, stop := context.WithCancel(c.ctx)
	p := &Publisher{c: c, cfg: cfg, node: node, ctx: ctx, stop: stop, done: make(chan struct{}),
		kick: make(chan struct{}, 1), published: map[string]string{}, records: map[endpoint.ID]pubRecord{}}
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
	full, backoff := true, 100*time.Millisecond
	dirty := map[endpoint.ID]struct{}{}
	var owed <-chan time.Time // a full comparison after incremental ones
	// An event reaches the publisher before the index commits its change:
	// expect holds what the latest event of each dirty endpoint says, and
	// an endpoint whose index row does not say it yet (lagging) is
	// compared again after Coalesce, at most maxLagTries times (then the
	// full comparison finds it), instead of waiting FullEvery for it.
	expect := map[endpoint.ID]evExpect{}
	lagging := map[endpoint.ID]lagState{}
	var lagRetry <-chan time.Time
	for {
		if full || len(dirty) > 0 {
			resumed := p.c.Resumed()
			if err := p.sync(full, dirty, expect, lagging); err != nil {
				full = true // what failed is found again by comparing everything
				// A new lease (kick) or etcd back ends the wait.
				if !sleepOr(p.ctx, backoff, resumed, p.kick) {
					return
				}
				backoff = min(2*backoff, 2*time.Second)
				continue
			}
			if !full && owed == nil {
				owed = time.After(p.cfg.FullEvery)
			}
			if !full && len(lagging) > 0 && lagRetry == nil {
				lagRetry = time.After(p.cfg.Coalesce)
			}
			full, backoff = false, 100*time.Millisecond
			clear(dirty)
			clear(expect)
		}
		select {
		case <-p.ctx.Done():
			return
		case <-p.kick:
			full = true
		case <-resync.C:
			full = true
		case <-owed:
			full, owed = true, nil
		case <-lagRetry:
			lagRetry = nil
			for id := range lagging {
				dirty[id] = struct{}{}
			}
		case <-ready:
			if drain(sub, dirty, expect) {
				full = true
			}
			if (full || len(dirty) > 0) && !sleep(p.ctx, p.cfg.Coalesce) {
				return
			}
			if drain(sub, dirty, expect) {
				full = true
			}
		}
	}
}

// drain reads every pending event and adds the endpoints they concern to
// dirty, and what the latest event of each says to expect; it reports
// whether events were missed (compare everything).
func drain(sub *events.Subscription, dirty map[endpoint.ID]struct{}, expect map[endpoint.ID]evExpect) (missed bool) {
	for {
		ev, ok := sub.TryNext()
		if !ok {
			return missed
		}
		switch ev.Type {
		case events.EndpointCreated, events.EndpointStateChanged, events.EndpointDeleted:
			id := endpoint.ID(ev.Endpoint)
			dirty[id] = struct{}{}
			expect[id] = evExpect{gone: ev.Type == events.EndpointDeleted, state: endpoint.State(ev.State)}
		case events.Missed:
			missed = true
		}
	}
}

// evExpect is what an endpoint's latest event says the index holds: no
// endpoint (gone), or the endpoint in state (empty: any).
type evExpect struct {
	gone  bool
	state endpoint.State
}

// maxLagTries bounds the comparisons again of an endpoint whose index row
// lags its event (each Coalesce apart).
const maxLagTries = 20

// lagState is a lagging endpoint's expectation and its tries so far.
type lagState struct {
	want  evExpect
	tries int
}

// checkLag updates lagging for endpoint id as the comparison read its
// index row (ep, held: the very read the comparison used; a later read
// may say more than what was written): an endpoint whose row does not
// say what its latest event (in expect, else the one it lagged behind)
// said yet is compared again, up to maxLagTries times; one that does,
// or that was tried enough, is done.
func checkLag(id endpoint.ID, ep *endpoint.Endpoint, held bool, expect map[endpoint.ID]evExpect, lagging map[endpoint.ID]lagState) {
	l, was := lagging[id]
	if e, ok := expect[id]; ok {
		l.want = e
	} else if !was {
		return // compared for another reason: nothing to expect
	}
	e := l.want
	lags := e.gone && held || !e.gone && (!held || e.state != "" && ep.State != e.state)
	if l.tries++; !lags || l.tries > maxLagTries {
		delete(lagging, id)
		return
	}
	lagging[id] = l
}

// pubRecord is an endpoint's record as last encoded.
type pubRecord struct {
	identity   identity.NumericIdentity
	ip4, ip6   netip.Addr
	key, value string
	gen        uint64
}

// nodeIP is the address other nodes reach this one at (IPv4 first).
func (p *Publisher) nodeIP() netip.Addr {
	var nodeIP netip.Addr
	for _, a := range p.cfg.Addrs {
		if !nodeIP.IsValid() || (a.Is4() && !nodeIP.Is4()) {
			nodeIP = a
		}
	}
	return nodeIP
}

// nodeValue is this node's record with the health endpoint's addresses;
// p.mu is held.
func (p *Publisher) nodeValue() string {
	r := p.node
	r.HealthIPs = p.health
	v, _ := json.Marshal(r) // names, addresses and prefixes always marshal
	return string(v)
}

// recordOf returns ep's record (from the cache when ep did not change);
// false when ep is not published (no identity, a reserved one, no
// address, going away). The health endpoint's addresses go to the node
// record instead. p.mu is held.
func (p *Publisher) recordOf(ep *endpoint.Endpoint, nodeIP netip.Addr) (pubRecord, bool) {
	gone := ep.State == endpoint.StateDisconnecting || ep.State == endpoint.StateDisconnected
	if ep.Identity == identity.ReservedHealth && !gone {
		p.healthID, p.health = ep.ID, nil
		for _, ip := range []netip.Addr{ep.IPv4, ep.IPv6} {
			if ip.IsValid() {
				p.health = append(p.health, ip)
			}
		}
	} else if ep.ID == p.healthID {
		p.healthID, p.health = 0, nil
	}
	if ep.Identity == 0 || ep.Identity.IsReserved() || gone || (!ep.IPv4.IsValid() && !ep.IPv6.IsValid()) {
		return pubRecord{}, false
	}
	r, ok := p.records[ep.ID]
	if ok && r.identity == ep.Identity && r.ip4 == ep.IPv4 && r.ip6 == ep.IPv6 {
		return r, true
	}
	node := p.c.cfg.NodeName
	rec := endpointRecord{Identity: uint32(ep.Identity), Node: node, NodeIP: nodeIP}
	for _, np := range ep.NamedPorts {
		rec.NamedPorts = append(rec.NamedPorts, policy.NamedPorts{np}.String())
	}
	for _, ip := range []netip.Addr{ep.IPv4, ep.IPv6} {
		if ip.IsValid() {
			rec.IPs = append(rec.IPs, ip)
		}
	}
	v, _ := json.Marshal(rec) // addresses and numbers always marshal
	r = pubRecord{identity: ep.Identity, ip4: ep.IPv4, ip6: ep.IPv6, key: p.c.keys.endpoint(node, uint16(ep.ID)), value: string(v)}
	p.records[ep.ID] = r
	return r, true
}

// desired is what etcd should hold for this node; p.mu is held.
func (p *Publisher) desired() map[string]string {
	nodeIP := p.nodeIP()
	p.gen++
	want := make(map[string]string, len(p.records)+1)
	p.healthID, p.health = 0, nil
	for _, ep := range p.cfg.Source.Endpoints(index.EndpointFilter{}) {
		if r, ok := p.recordOf(ep, nodeIP); ok {
			r.gen = p.gen
			p.records[ep.ID] = r
			want[r.key] = r.value
		}
	}
	want[p.c.keys.node(p.c.cfg.NodeName)] = p.nodeValue()
	for id, r := range p.records {
		if r.gen != p.gen {
			delete(p.records, id)
		}
	}
	return want
}

// changed is what etcd should hold for the endpoints in ids (a missing
// key: none), and updates lagging (checkLag) with what it read; p.mu is
// held.
func (p *Publisher) changed(ids map[endpoint.ID]struct{}, expect map[endpoint.ID]evExpect, lagging map[endpoint.ID]lagState) map[string]string {
	nodeIP := p.nodeIP()
	want := make(map[string]string, len(ids))
	for id := range ids {
		key := p.c.keys.endpoint(p.c.cfg.NodeName, uint16(id))
		ep, ok := p.cfg.Source.Endpoint(id)
		checkLag(id, ep, ok, expect, lagging)
		if ok {
			if r, ok := p.recordOf(ep, nodeIP); ok {
				want[r.key] = r.value
				continue
			}
		} else if id == p.healthID {
			p.healthID, p.health = 0, nil
		}
		if r, ok := p.records[id]; ok {
			key = r.key // the string published holds
		}
		delete(p.records, id)
		want[key] = ""
	}
	want[p.c.keys.node(p.c.cfg.NodeName)] = p.nodeValue()
	return want
}

// sync writes the difference between the index and what etcd holds: of
// every endpoint (full), or of the endpoints in ids. An event may reach
// the publisher before the index holds its change, so incremental syncs
// compare an endpoint whose index row lags its event again shortly
// (lagging, updated with what this comparison read) and are followed by
// a full one within FullEvery.
func (p *Publisher) sync(full bool, ids map[endpoint.ID]struct{}, expect map[endpoint.ID]evExpect, lagging map[endpoint.ID]lagState) error {
	lease, ok := p.c.Lease()
	if !ok {
		return ErrUnavailable
	}
	p.mu.Lock()
	if p.lease != lease { // a new lease: everything is written again
		clear(p.published)
		p.lease = lease
		full = true
	}
	var ops []clientv3.Op
	var opKeys []string // ops' keys as want holds them (published shares the strings)
	var want map[string]string
	if full {
		want = p.desired()
		for k := range p.published {
			if _, ok := want[k]; !ok {
				ops, opKeys = append(ops, clientv3.OpDelete(k)), append(opKeys, k)
			}
		}
	} else {
		want = p.changed(ids, expect, lagging)
	}
	for k, v := range want {
		_, was := p.published[k]
		switch {
		case v == "" && was:
			ops, opKeys = append(ops, clientv3.OpDelete(k)), append(opKeys, k)
		case v != "" && p.published[k] != v:
			ops, opKeys = append(ops, clientv3.OpPut(k, v, clientv3.WithLease(lease))), append(opKeys, k)
		}
	}
	p.mu.Unlock()
	for len(ops) > 0 {
		n := min(len(ops), maxTxnOps)
		batch := ops[:n]
		start := time.Now()
		err := p.c.call(p.ctx, "publish endpoints", func(ctx context.Context) error {
			_, err := p.c.cli.Txn(ctx).Then(batch...).Commit()
			return err
		})
		p.record(batch, opKeys[:n], want, err)
		if err != nil {
			return err
		}
		p.tracePublished(batch, opKeys[:n], want, start, time.Now())
		ops, opKeys = ops[n:], opKeys[n:]
	}
	if cur, _ := p.c.Lease(); cur != lease {
		p.poke()
	}
	return nil
}

// unknownValue stands in published for a key whose write failed: no
// record encodes to it.
const unknownValue = "?"

// record notes a batch's outcome (keys[i] is batch[i]'s key).
func (p *Publisher) record(batch []clientv3.Op, keys []string, want map[string]string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastErr = err
	if err != nil {
		// A failed transaction may still have been applied (etcd killed
		// before it answered): a put's key is then in etcd whatever this
		// map says. Marking it unknown makes the next comparison write it
		// again, or delete it if its endpoint went meanwhile, instead of
		// leaving it under the lease for as long as the node lives.
		for i, op := range batch {
			if !op.IsDelete() {
				p.published[keys[i]] = unknownValue
			}
		}
		return
	}
	p.writes++
	for i, op := range batch {
		k := keys[i]
		if op.IsDelete() {
			delete(p.published, k)
		} else {
			p.published[k] = want[k]
		}
	}
}
