package datapath

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// FakeHooks shape the Fake's behaviour; change them at any time with Set.
type FakeHooks struct {
	// RealizeDelay and RemoveDelay are slept (honouring ctx) per operation.
	RealizeDelay, RemoveDelay time.Duration
	// ErrorRate is the probability (0..1) that Realize or Remove fails
	// with an error wrapping ErrInjected.
	ErrorRate float64
	// BeforeRealize and BeforeRemove run first; a non-nil error fails the
	// operation. They may block (tests use them to hold a regeneration).
	BeforeRealize func(ctx context.Context, ep *endpoint.Endpoint, rev uint64) error
	BeforeRemove  func(ctx context.Context, ep *endpoint.Endpoint) error
	// BeforeIPCache runs first in UpsertIPCache and DeleteIPCache; a
	// non-nil error fails the write.
	BeforeIPCache func(ctx context.Context, prefix netip.Prefix) error
	// BeforeSyncNodes runs first in SyncNodes; a non-nil error fails it.
	BeforeSyncNodes func(ctx context.Context, nodes []RemoteNode) error
	// ProxyAcks is how many proxies must acknowledge each revision.
	ProxyAcks int
	// ProxyAckDelay is how long after Realize each acknowledgement arrives.
	ProxyAckDelay time.Duration
	// ProxyAckDropRate is the probability (0..1) an acknowledgement is lost.
	ProxyAckDropRate float64
}

// Fake is an in-memory Datapath for the simulator and unprivileged tests.
type Fake struct {
	// mu guards everything below.
	mu        sync.Mutex
	hooks     FakeHooks
	rng       *rand.Rand
	endpoints map[endpoint.ID]uint64 // realised revision per endpoint
	policies  map[endpoint.ID]*policy.MapState
	// ipcache is the ipcache map: one entry per prefix (identity and
	// tunnel endpoint together, as the BPF map's value; heap per remote
	// endpoint is measured with this fake).
	ipcache   map[netip.Prefix]IPCacheValue
	gone      map[endpoint.ID]bool // forgotten: their "interface" vanished
	ack       ProxyAckFunc
	realizes  uint64
	removes   uint64
	gcPasses  int
	gcOrphans sweep[endpoint.ID] // realised, not live
	gcMissing sweep[endpoint.ID] // live, Forgotten
	nodes     []RemoteNode       // the last SyncNodes set
	nodeSyncs int
	lb        fakeLB // fake_services.go
}

var _ Datapath = (*Fake)(nil)

// NewFake returns a Fake whose random faults derive from seed.
func NewFake(seed uint64) *Fake {
	return &Fake{
		rng:       rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		endpoints: make(map[endpoint.ID]uint64),
		policies:  make(map[endpoint.ID]*policy.MapState),
		ipcache:   make(map[netip.Prefix]IPCacheValue),
		gone:      make(map[endpoint.ID]bool),
	}
}

// Set replaces the hooks.
func (f *Fake) Set(h FakeHooks) {
	f.mu.Lock()
	f.hooks = h
	f.mu.Unlock()
}

// Hooks returns the current hooks.
func (f *Fake) Hooks() FakeHooks {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hooks
}

// Name implements Datapath.
func (f *Fake) Name() string { return "fake" }

// Init implements Datapath.
func (f *Fake) Init(context.Context) error { return nil }

// Close implements Datapath.
func (f *Fake) Close() error { return nil }

// SetProxyAck implements Datapath.
func (f *Fake) SetProxyAck(fn ProxyAckFunc) {
	f.mu.Lock()
	f.ack = fn
	f.mu.Unlock()
}

// Realize implements Datapath.
func (f *Fake) Realize(ctx context.Context, ep *endpoint.Endpoint, rev uint64) (Realized, error) {
	h, fail := f.draw()
	if h.BeforeRealize != nil {
		if err := h.BeforeRealize(ctx, ep, rev); err != nil {
			return Realized{}, fmt.Errorf("realize endpoint %d: %w", ep.ID, err)
		}
	}
	if err := sleep(ctx, h.RealizeDelay); err != nil {
		return Realized{}, fmt.Errorf("realize endpoint %d: %w", ep.ID, err)
	}
	if fail {
		return Realized{}, fmt.Errorf("realize endpoint %d: %w", ep.ID, ErrInjected)
	}
	f.mu.Lock()
	f.endpoints[ep.ID] = rev
	f.policies[ep.ID] = ep.Policy
	delete(f.gone, ep.ID)
	f.realizes++
	ack := f.ack
	f.mu.Unlock()
	var r Realized
	for i := 0; i < h.ProxyAcks; i++ {
		proxy := "proxy-" + strconv.Itoa(i)
		r.ProxyWaits = append(r.ProxyWaits, proxy)
		if ack != nil && !f.chance(h.ProxyAckDropRate) {
			id := ep.ID
			time.AfterFunc(h.ProxyAckDelay, func() { ack(id, rev, proxy) })
		}
	}
	return r, nil
}

// Remove implements Datapath.
func (f *Fake) Remove(ctx context.Context, ep *endpoint.Endpoint) error {
	h, fail := f.draw()
	if h.BeforeRemove != nil {
		if err := h.BeforeRemove(ctx, ep); err != nil {
			return fmt.Errorf("remove endpoint %d: %w", ep.ID, err)
		}
	}
	if err := sleep(ctx, h.RemoveDelay); err != nil {
		return fmt.Errorf("remove endpoint %d: %w", ep.ID, err)
	}
	if fail {
		return fmt.Errorf("remove endpoint %d: %w", ep.ID, ErrInjected)
	}
	f.mu.Lock()
	delete(f.endpoints, ep.ID)
	delete(f.policies, ep.ID)
	f.removes++
	f.mu.Unlock()
	return nil
}

// UpsertIPCache implements Datapath.
func (f *Fake) UpsertIPCache(ctx context.Context, prefix netip.Prefix, id identity.NumericIdentity, tunnel netip.Addr) error {
	if h := f.Hooks(); h.BeforeIPCache != nil {
		if err := h.BeforeIPCache(ctx, prefix); err != nil {
			return fmt.Errorf("upsert ipcache %s: %w", prefix, err)
		}
	}
	f.mu.Lock()
	f.ipcache[prefix.Masked()] = IPCacheValue{Identity: id, TunnelEndpoint: tunnel}
	f.mu.Unlock()
	return nil
}

// DeleteIPCache implements Datapath.
func (f *Fake) DeleteIPCache(ctx context.Context, prefix netip.Prefix) error {
	if h := f.Hooks(); h.BeforeIPCache != nil {
		if err := h.BeforeIPCache(ctx, prefix); err != nil {
			return fmt.Errorf("delete ipcache %s: %w", prefix, err)
		}
	}
	f.mu.Lock()
	delete(f.ipcache, prefix.Masked())
	f.mu.Unlock()
	return nil
}

// SyncIPCache implements IPCacheSyncer: the ipcache becomes desired.
func (f *Fake) SyncIPCache(_ context.Context, desired map[netip.Prefix]IPCacheValue) (IPCacheSyncStats, error) {
	want := make(map[netip.Prefix]IPCacheValue, len(desired))
	for p, v := range desired {
		want[p.Masked()] = v
	}
	var st IPCacheSyncStats
	f.mu.Lock()
	defer f.mu.Unlock()
	for p := range f.ipcache {
		if _, ok := want[p]; !ok {
			delete(f.ipcache, p)
			st.Deleted++
		}
	}
	for p, v := range want {
		if cur, ok := f.ipcache[p]; !ok || cur != v {
			f.ipcache[p] = v
			st.Written++
		}
	}
	return st, nil
}

// IPCacheTunnels returns the ipcache's tunnel endpoints by prefix.
func (f *Fake) IPCacheTunnels() map[netip.Prefix]netip.Addr {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out map[netip.Prefix]netip.Addr
	for p, v := range f.ipcache {
		if v.TunnelEndpoint.IsValid() {
			if out == nil {
				out = map[netip.Prefix]netip.Addr{}
			}
			out[p] = v.TunnelEndpoint
		}
	}
	return out
}

// IPCache returns a copy of the ipcache.
func (f *Fake) IPCache() map[netip.Prefix]identity.NumericIdentity {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[netip.Prefix]identity.NumericIdentity, len(f.ipcache))
	for p, v := range f.ipcache {
		out[p] = v.Identity
	}
	return out
}

// Policy returns the policy realised for an endpoint (nil: none or not
// realised).
func (f *Fake) Policy(id endpoint.ID) *policy.MapState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.policies[id]
}

// DumpPolicy implements PolicyDumper: the realised entries, with zero
// counters (the Fake forwards no packets).
func (f *Fake) DumpPolicy(_ context.Context, id endpoint.ID) ([]PolicyEntry, bool, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.endpoints[id]; !ok {
		return nil, false, false, fmt.Errorf("dump policy of endpoint %d: %w", id, ErrEndpointMissing)
	}
	m := f.policies[id]
	if m == nil {
		return []PolicyEntry{}, false, false, nil
	}
	out := make([]PolicyEntry, len(m.Allow))
	for i, k := range m.Allow {
		out[i] = PolicyEntry{Key: k, Deny: m.Denies(k)}
	}
	return out, m.IngressEnforced, m.EgressEnforced, nil
}

// DumpCIDRPolicy implements CIDRPolicyDumper: the realised CIDR
// entries, with zero counters.
func (f *Fake) DumpCIDRPolicy(_ context.Context, id endpoint.ID) ([]CIDRPolicyEntry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.endpoints[id]; !ok {
		return nil, fmt.Errorf("dump cidr policy of endpoint %d: %w", id, ErrEndpointMissing)
	}
	m := f.policies[id]
	out := []CIDRPolicyEntry{}
	if m != nil {
		for _, e := range m.CIDR {
			out = append(out, CIDRPolicyEntry{Entry: e})
		}
	}
	return out, nil
}

// DropCounters implements DropCounterReader: the Fake forwards no
// packets, so it never drops any (an empty map).
func (f *Fake) DropCounters(context.Context) (map[DropKey]Counter, error) {
	return map[DropKey]Counter{}, nil
}

// EndpointDrops implements DropCounterReader: always empty (see
// DropCounters).
func (f *Fake) EndpointDrops(context.Context, endpoint.ID) (map[DropKey]Counter, error) {
	return map[DropKey]Counter{}, nil
}

var (
	_ PolicyDumper      = (*Fake)(nil)
	_ CIDRPolicyDumper  = (*Fake)(nil)
	_ DropCounterReader = (*Fake)(nil)
	_ IPCacheSyncer     = (*Fake)(nil)
)

// Check implements Datapath.
func (f *Fake) Check(_ context.Context, ep *endpoint.Endpoint) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.endpoints[ep.ID]; !ok {
		return fmt.Errorf("check endpoint %d: %w", ep.ID, ErrEndpointMissing)
	}
	return nil
}

// Forget drops an endpoint as if its interface vanished underneath the agent.
func (f *Fake) Forget(id endpoint.ID) {
	f.mu.Lock()
	delete(f.endpoints, id)
	delete(f.policies, id)
	f.gone[id] = true
	f.mu.Unlock()
}

// Validate reports, at restore, whether an endpoint survived the agent's
// absence: a fresh Fake (a new process) remembers nothing, so only
// endpoints explicitly Forgotten fail with ErrEndpointMissing.
func (f *Fake) Validate(_ context.Context, ep *endpoint.Endpoint) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gone[ep.ID] {
		return fmt.Errorf("validate endpoint %d: %w", ep.ID, ErrEndpointMissing)
	}
	return nil
}

// Realized returns the revision realised for an endpoint, if any.
func (f *Fake) Realized(id endpoint.ID) (uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rev, ok := f.endpoints[id]
	return rev, ok
}

// Stats returns how many endpoints are realised and how many Realize and
// Remove calls succeeded.
func (f *Fake) Stats() (live int, realizes, removes uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.endpoints), f.realizes, f.removes
}

func (f *Fake) draw() (FakeHooks, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hooks, f.hooks.ErrorRate > 0 && f.rng.Float64() < f.hooks.ErrorRate
}

func (f *Fake) chance(p float64) bool {
	if p <= 0 {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.Float64() < p
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// GC implements Collector: realised endpoints that are not in live are
// forgotten (reported as links "fake-<id>") once two consecutive passes
// saw them orphaned, and live endpoints that were Forgotten are reported
// missing after two passes.
func (f *Fake) GC(_ context.Context, live []*endpoint.Endpoint) (GCReport, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gcPasses++
	isLive := make(map[endpoint.ID]bool, len(live))
	var gone []endpoint.ID
	for _, ep := range live {
		isLive[ep.ID] = true
		if f.gone[ep.ID] {
			gone = append(gone, ep.ID)
		}
	}
	var orphans []endpoint.ID
	for id := range f.endpoints {
		if !isLive[id] {
			orphans = append(orphans, id)
		}
	}
	var r GCReport
	confirmed, suspects := f.gcOrphans.pass(orphans)
	for _, id := range confirmed {
		delete(f.endpoints, id)
		r.Links = append(r.Links, "fake-"+strconv.Itoa(int(id)))
	}
	missing, missSuspects := f.gcMissing.pass(gone)
	r.Missing, r.Suspects = missing, suspects+missSuspects
	return r, nil
}

// GCPasses returns how many GC passes ran.
func (f *Fake) GCPasses() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gcPasses
}
