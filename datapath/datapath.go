package datapath

import (
	"context"
	"errors"
	"net/netip"

	"github.com/membrane-cni/membrane/datapath/l7proxy"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

var (
	// ErrEndpointMissing is returned by Check when the endpoint's host-side
	// interface (or the fake's record of it) no longer exists.
	ErrEndpointMissing = errors.New("endpoint datapath missing")
	// ErrInjected is wrapped by errors the Fake injects.
	ErrInjected = errors.New("injected datapath fault")
	// ErrNotSupported is returned for a datapath kind this build cannot run.
	ErrNotSupported = errors.New("datapath not supported")
	// ErrForeignInterface is returned by Realize for a host interface
	// the agent does not manage (ifname.Managed: the plugin's veths and
	// the health endpoint's); Remove leaves such an interface alone.
	ErrForeignInterface = errors.New("interface not created by membrane")
)

// Realized is what realising one revision produced.
type Realized struct {
	// ProxyWaits names the proxies that must acknowledge this revision
	// before the endpoint is ready (see ProxyAckFunc).
	ProxyWaits []string
}

// ProxyAckFunc delivers a proxy's acknowledgement of an endpoint revision
// to the agent. It must not block.
type ProxyAckFunc func(id endpoint.ID, revision uint64, proxyID string)

// L7Status is the L7 proxy's state (see L7StatusReader).
type L7Status struct {
	Process l7proxy.SupervisorStatus `json:"process"`
	Version uint64                   `json:"version"`
	Acks    l7proxy.TrackerStatus    `json:"acks"`
	// Port is the proxy's listening port (the policy maps' proxy port).
	Port uint16 `json:"port"`
}

// L7AccessEvent is one request the L7 proxy decided (LinuxHooks.OnL7Access).
type L7AccessEvent = l7proxy.AccessRecord

// L7StatusReader is implemented by datapaths with an L7 proxy (the
// Linux datapath); L7Status is nil when L7 is off.
type L7StatusReader interface {
	L7Status() *L7Status
}

// ProxyNackFunc delivers a proxy's rejection of the configuration an
// endpoint revision needs. It must not block.
type ProxyNackFunc func(id endpoint.ID, revision uint64, proxyID, reason string)

// ProxyNacker is implemented by datapaths whose proxies can reject a
// configuration (the Linux datapath's L7 proxy).
type ProxyNacker interface {
	// SetProxyNack installs the function rejections are delivered with.
	SetProxyNack(fn ProxyNackFunc)
}

// Datapath realises endpoints in the kernel. Implementations are safe for
// concurrent use on different endpoints; the agent never runs two
// operations on the same endpoint at once.
type Datapath interface {
	// Name is "fake" or "linux".
	Name() string
	// Init prepares node-wide state (gateway, shared maps). Idempotent.
	Init(ctx context.Context) error
	// Realize makes the datapath match ep at revision rev, enforcing
	// ep.Policy (nil: nothing enforced). Idempotent.
	Realize(ctx context.Context, ep *endpoint.Endpoint, rev uint64) (Realized, error)
	// Remove tears the endpoint's datapath down. Removing a missing
	// endpoint is success.
	Remove(ctx context.Context, ep *endpoint.Endpoint) error
	// Check returns ErrEndpointMissing if the endpoint's datapath is gone.
	Check(ctx context.Context, ep *endpoint.Endpoint) error
	// UpsertIPCache maps prefix to the security identity id in the
	// node-wide ipcache (IP -> identity), replacing any previous entry.
	// tunnelEndpoint is the node hosting prefix when it is a remote
	// endpoint (index.IPCacheEntry.TunnelEndpoint; invalid: none): where
	// tunnel mode sends traffic for it.
	UpsertIPCache(ctx context.Context, prefix netip.Prefix, id identity.NumericIdentity, tunnelEndpoint netip.Addr) error
	// DeleteIPCache removes prefix from the ipcache; a missing entry is
	// success.
	DeleteIPCache(ctx context.Context, prefix netip.Prefix) error
	// SetProxyAck installs the function proxies acknowledge revisions with.
	SetProxyAck(fn ProxyAckFunc)
	// Close releases what Init acquired, leaving endpoints in place.
	Close() error
}

// HostPolicyDatapath is implemented by datapaths that enforce host
// policies (the Linux datapath's host firewall).
type HostPolicyDatapath interface {
	// HostFirewall reports whether the host firewall is on; off,
	// RealizeHostPolicy does nothing.
	HostFirewall() bool
	// RealizeHostPolicy makes the host endpoint enforce m (nil: no host
	// policy selects the node, everything passes); audit: what m would
	// drop passes, counted and reported as DropPolicyAudit under the
	// host endpoint. Idempotent.
	RealizeHostPolicy(ctx context.Context, m *policy.MapState, audit bool) error
	// SetHostSafePeers makes the safety net (host_safe) hold peers (the
	// API server's EndpointSlice, TCP) on top of the configured ones
	// (HostFirewallConfig.SafePeers), replacing the previous peers.
	// Idempotent; off, it does nothing.
	SetHostSafePeers(ctx context.Context, peers []netip.AddrPort) error
}

// PolicyEntry is one realised policy map entry with its counters and
// the L7 proxy port it redirects to (0: none).
type PolicyEntry struct {
	Key       policy.Key
	Packets   uint64
	Bytes     uint64
	ProxyPort uint16
	// Deny: the entry drops what it matches (policy.MapState.Deny).
	Deny bool
}

// CIDRPolicyEntry is one realised CIDR policy entry with its counters
// (what it allowed; a deny entry counts nothing).
type CIDRPolicyEntry struct {
	Entry   policy.CIDREntry
	Packets uint64
	Bytes   uint64
}

// CIDRPolicyDumper is implemented by datapaths that can read back an
// endpoint's realised CIDR policy (GET /v1/endpoint/{id}/policy).
type CIDRPolicyDumper interface {
	// DumpCIDRPolicy returns the endpoint's realised CIDR entries, sorted
	// by policy.CompareCIDR. Returns ErrEndpointMissing if nothing is
	// realised for id.
	DumpCIDRPolicy(ctx context.Context, id endpoint.ID) ([]CIDRPolicyEntry, error)
}

// PolicyDumper is implemented by datapaths that can read back an
// endpoint's realised policy (GET /v1/endpoint/{id}/policy).
type PolicyDumper interface {
	// DumpPolicy returns the endpoint's realised policy entries, sorted
	// by policy.Compare, and its enforcement per direction. Returns
	// ErrEndpointMissing if nothing is realised for id.
	DumpPolicy(ctx context.Context, id endpoint.ID) (entries []PolicyEntry, ingress, egress bool, err error)
}

// DropCounterReader is implemented by datapaths that count drops
// (GET /v1/endpoint/{id}/policy, GET /v1/drops).
type DropCounterReader interface {
	// DropCounters returns every endpoint's drop counters by reason and
	// direction.
	DropCounters(ctx context.Context) (map[DropKey]Counter, error)
	// EndpointDrops returns endpoint id's drop counters (none for an
	// endpoint that dropped nothing or does not exist).
	EndpointDrops(ctx context.Context, id endpoint.ID) (map[DropKey]Counter, error)
}

// IPCacheSyncStats is what a SyncIPCache changed.
type IPCacheSyncStats struct {
	// Deleted counts entries held that were not desired; Written counts
	// desired entries that were missing or mapped to another identity.
	Deleted, Written int
}

// IPCacheSyncer is implemented by datapaths whose ipcache outlives the
// agent (the Linux datapath's pinned map): SyncIPCache makes it hold
// exactly desired, removing what endpoints deleted while no agent ran
// left behind. The agent calls it once after restore.
type IPCacheSyncer interface {
	SyncIPCache(ctx context.Context, desired map[netip.Prefix]IPCacheValue) (IPCacheSyncStats, error)
}

// IPCacheBatcher is implemented by a datapath that applies a batch of
// ipcache changes at once (the Linux datapath: one guarded section, and
// one publication of its L7 proxy's ipcache mirror per batch instead of
// one per entry). ApplyIPCache returns one error per change (nil: done);
// each change is what UpsertIPCache or DeleteIPCache would do.
type IPCacheBatcher interface {
	ApplyIPCache(ctx context.Context, changes []IPCacheChange) []error
}

// IPCacheChange is one ipcache write of a batch: Value for Prefix, or
// Delete.
type IPCacheChange struct {
	Prefix netip.Prefix
	Value  IPCacheValue
	Delete bool
}

// IPCacheValue is what the ipcache holds for a prefix.
type IPCacheValue struct {
	Identity identity.NumericIdentity
	// TunnelEndpoint is the node hosting the prefix (remote endpoints;
	// invalid: none).
	TunnelEndpoint netip.Addr
}
