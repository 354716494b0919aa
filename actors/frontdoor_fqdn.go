package actors

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
)

// maxFQDNAnswerIPs bounds the addresses of one DNS answer given to
// LearnFQDN.
const maxFQDNAnswerIPs = 256

// LearnFQDN tells the agent that endpoint id's DNS query for name was
// answered with ips and ttl (the DNS proxy calls it before it releases
// the answer to the pod). It returns once the addresses' identities are
// in the datapath's ipcache and the endpoint realised the policy that
// selects them (the proxy-completion wait of DNS answers), or when ctx
// ends: the caller bounds the wait; the actors never block on it.
//
// Returns ErrEndpointNotFound, ErrEndpointDeleting, ErrFQDNNoIdentity,
// ErrFQDNBusy (too many answers held for the endpoint), fqdn.ErrLimit
// (too many learned addresses), a regeneration's error, or ctx's.
func (s *System) LearnFQDN(ctx context.Context, id endpoint.ID, name string, ips []netip.Addr, ttl time.Duration) error {
	if err := fqdn.ValidateName(name); err != nil {
		return fmt.Errorf("learn fqdn: %w", err)
	}
	if len(ips) > maxFQDNAnswerIPs {
		return fmt.Errorf("learn fqdn %s: %d addresses, more than %d", name, len(ips), maxFQDNAnswerIPs)
	}
	r, err := answer[*messages.EndpointFQDNResult](s.ask(ctx, s.endpoints,
		&messages.EndpointFQDN{ID: id, Name: name, IPs: ips, TTL: ttl}))
	if err != nil {
		return fmt.Errorf("learn fqdn %s: %w", name, err)
	}
	return r.Err
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
