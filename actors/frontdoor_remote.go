package actors

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// RemoteBatch is the most remote endpoints (or deleted addresses) one
// message to the ipcache actor carries: a larger call is sent as several
// messages, so one mailbox pass stays short.
const RemoteBatch = 512

// ErrInvalidSource is returned for a remote endpoint source that is
// empty or longer than 64 bytes.
var ErrInvalidSource = errors.New("invalid remote endpoint source")

// replaceTokens numbers replacement runs (never 0).
var replaceTokens atomic.Uint64

// UpsertRemoteEndpoints sets source's view of endpoints on other nodes:
// each address of each endpoint maps to its identity (and node) in the
// ipcache, unless a local endpoint claims the address (a local endpoint
// always wins). It returns once the index holds them; the datapath
// follows. An endpoint whose addresses changed must have its old ones
// deleted (DeleteRemoteEndpoints) or be replaced.
func (s *System) UpsertRemoteEndpoints(ctx context.Context, source string, eps []endpoint.Remote) error {
	if err := validateRemotes(source, eps); err != nil {
		return err
	}
	for len(eps) > 0 {
		n := min(len(eps), RemoteBatch)
		if err := s.remoteAsk(ctx, &messages.IPCacheRemote{Origin: source, Upserts: eps[:n]}); err != nil {
			return fmt.Errorf("upsert remote endpoints: %w", err)
		}
		eps = eps[n:]
	}
	return nil
}

// DeleteRemoteEndpoints drops source's claims on ips (an address source
// never claimed is no error).
func (s *System) DeleteRemoteEndpoints(ctx context.Context, source string, ips []netip.Addr) error {
	if err := validateSource(source); err != nil {
		return err
	}
	for len(ips) > 0 {
		n := min(len(ips), RemoteBatch)
		if err := s.remoteAsk(ctx, &messages.IPCacheRemote{Origin: source, Deletes: ips[:n]}); err != nil {
			return fmt.Errorf("delete remote endpoints: %w", err)
		}
		ips = ips[n:]
	}
	return nil
}

// ChangeRemoteEndpoints drops source's claims on dels and then sets
// ups, as DeleteRemoteEndpoints followed by UpsertRemoteEndpoints would,
// in one message to the ipcache actor per RemoteBatch changes (deletions
// first): one pass of the actor and one index transaction for both, and
// one wait for the caller (the kvstore mirror's hand-over, which carries
// both under churn). An address must not be in both.
func (s *System) ChangeRemoteEndpoints(ctx context.Context, source string, ups []endpoint.Remote, dels []netip.Addr) error {
	if err := validateRemotes(source, ups); err != nil {
		return err
	}
	for len(ups) > 0 || len(dels) > 0 {
		nd := min(len(dels), RemoteBatch)
		nu := min(len(ups), RemoteBatch-nd)
		if err := s.remoteAsk(ctx, &messages.IPCacheRemote{Origin: source, Deletes: dels[:nd], Upserts: ups[:nu]}); err != nil {
			return fmt.Errorf("change remote endpoints: %w", err)
		}
		dels, ups = dels[nd:], ups[nu:]
	}
	return nil
}

// ReplaceRemoteEndpoints makes eps source's full set of remote
// endpoints: it sets them (in batches of RemoteBatch) and then drops
// every claim of source on an address none of them has (mark and
// sweep). Other sources' claims are untouched. A concurrent replacement
// by the same source makes the earlier one fail; repeat it.
func (s *System) ReplaceRemoteEndpoints(ctx context.Context, source string, eps []endpoint.Remote) error {
	if err := validateRemotes(source, eps); err != nil {
		return err
	}
	token := replaceTokens.Add(1)
	first := true
	for {
		n := min(len(eps), RemoteBatch)
		msg := &messages.IPCacheRemote{Origin: source, Upserts: eps[:n], Replace: token, First: first, Last: n == len(eps)}
		if err := s.remoteAsk(ctx, msg); err != nil {
			return fmt.Errorf("replace remote endpoints: %w", err)
		}
		if msg.Last {
			return nil
		}
		eps, first = eps[n:], false
	}
}

func (s *System) remoteAsk(ctx context.Context, msg *messages.IPCacheRemote) error {
	r, err := answer[*messages.IPCacheRemoteResult](s.ask(ctx, s.ipcache, msg))
	if err != nil {
		return err
	}
	return r.Err
}

func validateSource(source string) error {
	if source == "" || len(source) > 64 {
		return fmt.Errorf("%w: %q", ErrInvalidSource, source)
	}
	return nil
}

func validateRemotes(source string, eps []endpoint.Remote) error {
	if err := validateSource(source); err != nil {
		return err
	}
	for i := range eps {
		if err := eps[i].Validate(); err != nil {
			return fmt.Errorf("remote endpoint %d: %w", i, err)
		}
	}
	return nil
}
