package actors

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
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
// actor learns the answer, the ipcache actor answers a barrier once the
// datapath holds the changes it had (the policy actor's precede it in
// its mailbox), and unless the endpoint's row shows it realised exactly
// the policy the answer produced, the endpoint actor regenerates and
// answers when that regeneration ended (its regeneration waiters).
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
	r, err := answer[*messages.PolicyFQDNLearned](s.ask(ctx, s.policy,
		&messages.PolicyFQDNLearn{Endpoint: id, Identity: row.Identity, Name: name, IPs: ips, TTL: ttl}))
	if err == nil {
		err = r.Err
	}
	if err != nil {
		return fmt.Errorf("learn fqdn %s: %w", name, err)
	}
	if _, err := answer[*messages.IPCacheBarrierDone](s.ask(ctx, s.ipcache, &messages.IPCacheBarrier{})); err != nil {
		return fmt.Errorf("learn fqdn %s: ipcache: %w", name, err)
	}
	if row, ok := s.deps.ix.Endpoint(id); ok && row.State == endpoint.StateReady && row.Policy == r.Policy {
		return nil // realised already
	}
	if _, err := endpointAnswer(s.ask(ctx, s.endpoints, &messages.RegeneratePolicy{ID: id, Wait: true})); err != nil {
		return fmt.Errorf("learn fqdn %s: %w", name, err)
	}
	return nil
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
