package actors

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// maxFQDNAnswerIPs bounds the addresses of one DNS answer given to
// LearnFQDN.
const maxFQDNAnswerIPs = 256

// LearnFQDN tells the agent that endpoint id's DNS query for name was
// answered with ips and ttl (the DNS proxy calls it before it releases
// the answer to the pod). It returns once the addresses' identities are
// in the datapath's ipcache and the endpoint realised the policy that
// selects them (the proxy-completion wait of DNS answers), or when ctx
// ends: the caller bounds the wait. Each step is an ask: the policy
// actor learns the answer (and, when the answer changed the endpoint's
// policy, asks the endpoint to regenerate); then, at once, the ipcache
// actor answers a barrier once the datapath holds the changes it had
// (the policy actor's precede it in its mailbox), and the endpoint
// actor answers when the regeneration it owes or runs ended (which
// started after the policy actor's request); if its row does not show
// then that it realised exactly the policy the answer produced, it
// regenerates once more (awaitLearned).
//
// Returns ErrEndpointNotFound, ErrEndpointDeleting, ErrFQDNNoIdentity,
// fqdn.ErrLimit (too many learned addresses), a regeneration's error, or
// ctx's.
func (s *System) LearnFQDN(ctx context.Context, id endpoint.ID, name string, ips []netip.Addr, ttl time.Duration) error {
	if err := fqdn.ValidateName(name); err != nil {
		return fmt.Errorf("learn fqdn: %w", err)
	}
	if len(ips) > maxFQDNAnswerIPs {
		return fmt.Errorf("learn fqdn %s: %d addresses, more than %d", name, len(ips), maxFQDNAnswerIPs)
	}
	row, ok := s.deps.ix.Endpoint(id)
	switch {
	case !ok:
		return fmt.Errorf("learn fqdn %s: endpoint %d: %w", name, id, ErrEndpointNotFound)
	case row.State == endpoint.StateDisconnecting || row.State == endpoint.StateDisconnected:
		return fmt.Errorf("learn fqdn %s: endpoint %d: %w", name, id, ErrEndpointDeleting)
	case row.Identity == identity.IdentityUnknown:
		return fmt.Errorf("learn fqdn %s: endpoint %d: %w", name, id, ErrFQDNNoIdentity)
	}
	learn := &messages.PolicyFQDNLearn{Endpoint: id, Identity: row.Identity, Name: name, IPs: ips, TTL: ttl}
	now := time.Now()
	if s.fqdnSeen.realised(id, name, ips, row, now) {
		// Nothing to wait for: the policy actor only renews the TTL.
		s.Actors.Root.Send(s.policy, learn)
		return nil
	}
	r, err := answer[*messages.PolicyFQDNLearned](s.ask(ctx, s.policy, learn))
	if err == nil {
		err = r.Err
	}
	if err != nil {
		return fmt.Errorf("learn fqdn %s: %w", name, err)
	}
	// The barrier and the regeneration are independent (a policy map
	// entry for an identity no address maps to yet allows nothing more):
	// the barrier is awaited alongside.
	barrier := make(chan error, 1)
	go func() {
		_, err := answer[*messages.IPCacheBarrierDone](s.ask(ctx, s.ipcache, &messages.IPCacheBarrier{}))
		barrier <- err
	}()
	// The policy actor asked the endpoint to regenerate when the answer
	// changed its policy, before it answered: that regeneration is
	// joined, and another is asked for only if the endpoint still does
	// not hold the answer's policy.
	regenErr := s.awaitLearned(ctx, id, r.Policy)
	if regenErr != nil {
		regenErr = fmt.Errorf("learn fqdn %s: %w", name, regenErr)
	}
	if err := <-barrier; err != nil {
		return fmt.Errorf("learn fqdn %s: ipcache: %w", name, err)
	}
	if regenErr != nil {
		return regenErr
	}
	if row, ok := s.deps.ix.Endpoint(id); ok && row.State == endpoint.StateReady && row.Policy == r.Policy {
		s.fqdnSeen.record(id, name, ips, r.Policy, now.Add(ttl))
	}
	return nil
}

// awaitLearned waits until endpoint id realised p (a learn's policy):
// for the regeneration it owes or runs (the learn's), then, unless its
// row holds p, for one more.
func (s *System) awaitLearned(ctx context.Context, id endpoint.ID, p *policy.MapState) error {
	if _, err := endpointAnswer(s.ask(ctx, s.endpoints, &messages.RegeneratePolicy{ID: id, Join: true})); err != nil {
		return err
	}
	if row, ok := s.deps.ix.Endpoint(id); ok && row.State == endpoint.StateReady && row.Policy == p {
		return nil
	}
	_, err := endpointAnswer(s.ask(ctx, s.endpoints, &messages.RegeneratePolicy{ID: id, Wait: true}))
	return err
}

// fqdnRealisedMargin is how long before its TTL ends a realised answer
// stops sparing the next one the wait: the renewal the spared answer
// sends must reach the policy actor before the learned addresses expire.
const fqdnRealisedMargin = 2 * time.Second

// maxFQDNRealised bounds fqdnRealised's records (cleared when full).
const maxFQDNRealised = 16384

// fqdnRealised remembers, per endpoint and name, the addresses of the
// last answer LearnFQDN saw realised, the policy that held them and
// when their TTL ends. A later answer whose addresses are among them,
// for an endpoint that is ready with that very policy (a policy is never
// changed in place: any change of the repository, an expiry or a
// forgotten name included, gives the endpoint another one), is realised
// already, as Cilium's proxy releases an answer at once when it brings
// no new address: LearnFQDN then only renews the TTL, without waiting.
type fqdnRealised struct {
	mu sync.Mutex
	m  map[fqdnRealisedKey]fqdnRealisedVal
}

type fqdnRealisedKey struct {
	ep   endpoint.ID
	name string
}

type fqdnRealisedVal struct {
	ips    []netip.Addr
	policy *policy.MapState
	until  time.Time // the TTL's end, less nothing: renewals do not move it
}

// realised reports whether the answer needs no wait (see fqdnRealised).
func (f *fqdnRealised) realised(id endpoint.ID, name string, ips []netip.Addr, row *endpoint.Endpoint, now time.Time) bool {
	if row.State != endpoint.StateReady || row.Policy == nil {
		return false
	}
	f.mu.Lock()
	v, ok := f.m[fqdnRealisedKey{id, name}]
	f.mu.Unlock()
	if !ok || v.policy != row.Policy || !now.Add(fqdnRealisedMargin).Before(v.until) {
		return false
	}
	for _, ip := range ips {
		if !slices.Contains(v.ips, ip) {
			return false
		}
	}
	return true
}

// record remembers a realised answer.
func (f *fqdnRealised) record(id endpoint.ID, name string, ips []netip.Addr, p *policy.MapState, until time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil || len(f.m) >= maxFQDNRealised {
		f.m = map[fqdnRealisedKey]fqdnRealisedVal{}
	}
	f.m[fqdnRealisedKey{id, name}] = fqdnRealisedVal{ips: slices.Clone(ips), policy: p, until: until}
}

// FQDNCache returns the names learned from DNS answers, per endpoint,
// with their addresses and expiry.
func (s *System) FQDNCache(ctx context.Context) ([]fqdn.Entry, error) {
	r, err := answer[*messages.FQDNCacheEntries](s.ask(ctx, s.deps.policy, &messages.FQDNCacheDump{}))
	if err != nil {
		return nil, fmt.Errorf("fqdn cache: %w", err)
	}
	return r.Entries, nil
}
