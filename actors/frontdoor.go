package actors

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// The front door: the only way code outside this package drives the
// agent. Each method sends one message and waits for its answer through
// System.ask, bounded by ctx (default 30 s); none may be called from
// inside an actor. Reads go to the index (System.Index), not here.

// ErrEndpointGone is returned for a request on an endpoint whose actor
// stopped between the caller's lookup and the request: the endpoint is
// gone. errors.Is(ErrEndpointGone, ErrEndpointNotFound) holds.
var ErrEndpointGone = fmt.Errorf("endpoint is gone: %w", ErrEndpointNotFound)

// CreateEndpoint creates an endpoint from spec (ID 0 picks one). Without
// sync it returns once the endpoint is on disk and in the index; with
// sync, once its first regeneration finished. A failed sync creation
// leaves no endpoint behind and keeps the addresses allocated (the
// caller owns them).
func (s *System) CreateEndpoint(ctx context.Context, spec *endpoint.Endpoint, sync bool) (*endpoint.Endpoint, error) {
	return endpointAnswer(s.ask(ctx, s.endpoints, &messages.CreateEndpoint{Spec: spec, Sync: sync}))
}

// DeleteEndpoint deletes endpoint id and returns its last record once it
// is disconnected and out of the index.
func (s *System) DeleteEndpoint(ctx context.Context, id endpoint.ID, opts endpoint.DeleteOptions) (*endpoint.Endpoint, error) {
	return endpointAnswer(s.ask(ctx, s.endpoints, &messages.DeleteEndpoint{ID: id, Options: opts}))
}

// PatchLabels adds and deletes labels of endpoint id; it returns once the
// new identity is resolved and the labels are durable.
func (s *System) PatchLabels(ctx context.Context, id endpoint.ID, add, del labels.Labels) (*endpoint.Endpoint, error) {
	return endpointAnswer(s.ask(ctx, s.endpoints, &messages.PatchLabels{ID: id, Add: add, Delete: del}))
}

// PatchPodLabels is PatchLabels that also sets the endpoint's named
// ports and policy audit mode (its pod's; Kubernetes mode), and returns
// as soon as the endpoint has taken the change (messages.PatchLabels
// Async): the new identity and the regeneration follow in the endpoint.
// The watcher's workers would otherwise each wait out one identity and
// one regeneration, and a burst of relabels would queue behind them
// (BENCHMARKS.md); the API server keeps the pod's labels, so a restart
// applies them again.
func (s *System) PatchPodLabels(ctx context.Context, id endpoint.ID, add, del labels.Labels, ports policy.NamedPorts, audit bool) (*endpoint.Endpoint, error) {
	return endpointAnswer(s.ask(ctx, s.endpoints, &messages.PatchLabels{ID: id, Add: add, Delete: del, SetPorts: true, NamedPorts: ports,
		SetAudit: true, Audit: audit, Async: true}))
}

// Regenerate requests a regeneration of endpoint id and returns once one
// that started after the request completed (or failed).
func (s *System) Regenerate(ctx context.Context, id endpoint.ID, reason string) (*endpoint.Endpoint, error) {
	return endpointAnswer(s.ask(ctx, s.endpoints, &messages.Regenerate{ID: id, Reason: reason}))
}

// RestoreResult is what RestoreEndpoints did.
type RestoreResult struct {
	Restored []endpoint.ID
	// Failed maps endpoints that could not be restored to why; they were
	// deleted without releasing their addresses.
	Failed map[endpoint.ID]error
}

// RestoreEndpoints re-creates endpoints read from the state directory and
// returns once every one holds its leases again (IP and identity) or
// failed; their regeneration continues afterwards.
func (s *System) RestoreEndpoints(ctx context.Context, eps []*endpoint.Endpoint) (RestoreResult, error) {
	r, err := answer[*messages.RestoreResult](s.ask(ctx, s.endpoints, &messages.RestoreEndpoints{Endpoints: eps}))
	if err != nil {
		return RestoreResult{}, err
	}
	return RestoreResult{Restored: r.Restored, Failed: r.Failed}, nil
}

// Allocation is the addresses AllocateIP handed out (invalid: none of
// that family).
type Allocation struct {
	IPv4, IPv6 netip.Addr
}

// AllocateIP allocates the next free address of family ("" allocates one
// of every configured family) to owner. The error satisfies
// errors.Is(err, ipam.ErrExhausted) when the pool is full.
func (s *System) AllocateIP(ctx context.Context, family ipam.Family, owner string) (Allocation, error) {
	return allocation(s.ask(ctx, s.ipam, &messages.IPAMAllocate{Family: family, Owner: owner}))
}

// AllocateSpecificIP allocates ip to owner.
func (s *System) AllocateSpecificIP(ctx context.Context, ip netip.Addr, owner string) (Allocation, error) {
	return allocation(s.ask(ctx, s.ipam, &messages.IPAMAllocateIP{IP: ip, Owner: owner}))
}

func allocation(res any, err error) (Allocation, error) {
	r, err := answer[*messages.IPAMAllocated](res, err)
	if err != nil {
		return Allocation{}, err
	}
	return Allocation{IPv4: r.IPv4, IPv6: r.IPv6}, r.Err
}

// Release is what ReleaseIP did.
type Release struct {
	Released bool
	// Owner is the released address's owner.
	Owner string
}

// ReleaseIP releases ip. Releasing a free address is a no-op; an owner
// other than "" must match the address's; an address a live endpoint
// claims is refused with ErrIPInUse.
func (s *System) ReleaseIP(ctx context.Context, ip netip.Addr, owner string) (Release, error) {
	r, err := answer[*messages.IPAMReleased](s.ask(ctx, s.ipam, &messages.IPAMRelease{IP: ip, Owner: owner}))
	if err != nil {
		return Release{}, err
	}
	return Release{Released: r.Released, Owner: r.Owner}, r.Err
}

// PolicyResult is what ImportPolicy and DeletePolicy did.
type PolicyResult struct {
	Revision uint64
	Names    []string // imported, "namespace/name"
	Deleted  int
}

// ImportPolicy adds or replaces policies, all in one revision, and
// returns after the index commit.
func (s *System) ImportPolicy(ctx context.Context, pols []*policy.Policy) (PolicyResult, error) {
	if s.Config.NoL7 {
		for _, p := range pols {
			if p.HasHTTPRules() {
				return PolicyResult{}, fmt.Errorf("policy %s: toPorts[].rules.http and rules.kafka need the L7 proxy (start the agent with --l7-proxy): %w", p.Key(), policy.ErrInvalidPolicy)
			}
		}
	}
	if s.Config.NoDNSProxy {
		for _, p := range pols {
			if p.HasDNSRules() {
				return PolicyResult{}, fmt.Errorf("policy %s: toFQDNs and toPorts[].rules.dns need the DNS proxy (start the agent with --dns-proxy): %w", p.Key(), policy.ErrInvalidPolicy)
			}
		}
	}
	return policyAnswer(s.ask(ctx, s.policy, &messages.PolicyImport{Policies: pols}))
}

// DeletePolicy deletes the policy name ("namespace/name"), or, with name
// "", every policy whose metadata labels include lbls. The error wraps
// policy.ErrNotFound when name matched nothing.
func (s *System) DeletePolicy(ctx context.Context, name string, lbls map[string]string) (PolicyResult, error) {
	return policyAnswer(s.ask(ctx, s.policy, &messages.PolicyDelete{Name: name, Labels: lbls}))
}

func policyAnswer(res any, err error) (PolicyResult, error) {
	r, err := answer[*messages.PolicyResult](res, err)
	if err != nil {
		return PolicyResult{}, err
	}
	return PolicyResult{Revision: r.Revision, Names: r.Names, Deleted: r.Deleted}, r.Err
}

// RunBlocking runs fn (netlink, BPF, disk) on one of the datapath pool's
// workers, bounded by the pool's default timeout, and returns its result.
// op names it in logs and metrics; ep (0: none) is the endpoint it
// concerns.
func (s *System) RunBlocking(ctx context.Context, op string, ep endpoint.ID, fn func(context.Context) (any, error)) (any, error) {
	r, err := answer[*messages.DatapathResult](s.ask(ctx, s.pool, &messages.DatapathWork{Op: op, Endpoint: ep, Run: fn}))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return r.Value, r.Err
}

// SubmitBlocking queues fn in the datapath pool without waiting for it.
func (s *System) SubmitBlocking(op string, fn func(context.Context) error) {
	s.Actors.Root.Send(s.pool, &messages.DatapathWork{Op: op, Run: func(ctx context.Context) (any, error) { return nil, fn(ctx) }})
}

// CheckEndpoint checks ep's datapath in the pool.
func (s *System) CheckEndpoint(ctx context.Context, ep *endpoint.Endpoint) error {
	dp := s.Datapath
	_, err := s.RunBlocking(ctx, "check", ep.ID, func(c context.Context) (any, error) { return nil, dp.Check(c, ep) })
	return err
}

// ErrNotSupported is returned for a datapath operation the running
// datapath does not offer.
var ErrNotSupported = errors.New("not supported by this datapath")

// DropCounters reads the drop counters of endpoint id (every endpoint's
// when id is 0) in the pool.
func (s *System) DropCounters(ctx context.Context, id endpoint.ID) (map[datapath.DropKey]datapath.Counter, error) {
	d, ok := s.Datapath.(datapath.DropCounterReader)
	if !ok {
		return nil, fmt.Errorf("drop counters of the %s datapath: %w", s.Datapath.Name(), ErrNotSupported)
	}
	v, err := s.RunBlocking(ctx, "read-drops", id, func(c context.Context) (any, error) {
		if id == 0 {
			return d.DropCounters(c)
		}
		return d.EndpointDrops(c, id)
	})
	counters, _ := v.(map[datapath.DropKey]datapath.Counter)
	return counters, err
}

// RealizedPolicy is an endpoint's policy maps as the datapath holds them.
type RealizedPolicy struct {
	Entries []datapath.PolicyEntry
	// CIDR is the address-keyed part (CIDR rules decided on the address).
	CIDR []datapath.CIDRPolicyEntry
	// Ingress and Egress say whether the endpoint enforces that direction.
	Ingress, Egress bool
}

// DumpPolicy reads endpoint id's policy maps back from the datapath in
// the pool.
func (s *System) DumpPolicy(ctx context.Context, id endpoint.ID) (RealizedPolicy, error) {
	d, ok := s.Datapath.(datapath.PolicyDumper)
	cd, cok := s.Datapath.(datapath.CIDRPolicyDumper)
	if !ok || !cok {
		return RealizedPolicy{}, fmt.Errorf("read back policy of the %s datapath: %w", s.Datapath.Name(), ErrNotSupported)
	}
	v, err := s.RunBlocking(ctx, "dump-policy", id, func(c context.Context) (any, error) {
		e, in, eg, err := d.DumpPolicy(c, id)
		if err != nil {
			return nil, err
		}
		cidr, err := cd.DumpCIDRPolicy(c, id)
		return RealizedPolicy{Entries: e, CIDR: cidr, Ingress: in, Egress: eg}, err
	})
	rp, _ := v.(RealizedPolicy)
	return rp, err
}

// StartGC turns the garbage collector's periodic passes on (once restore
// has rebuilt the index, so restored endpoints are not taken for orphans).
func (s *System) StartGC() { s.Actors.Root.Send(s.gc, &messages.StartGC{}) }

// RunGC runs one garbage collection pass now.
func (s *System) RunGC(ctx context.Context) (datapath.GCReport, error) {
	r, err := answer[*messages.GCResult](s.ask(ctx, s.gc, &messages.RunGC{}))
	if err != nil {
		return datapath.GCReport{}, err
	}
	return r.Report, r.Err
}

// PruneIPCache makes the datapath's ipcache hold exactly the agent's
// entries (sent once restore re-created every endpoint).
func (s *System) PruneIPCache() { s.Actors.Root.Send(s.ipcache, &messages.IPCachePrune{}) }

// HostAddrChanged tells the ipcache that the host netns gained or lost an
// address (the datapath's address watcher calls it); it never blocks.
func (s *System) HostAddrChanged(addr netip.Addr, deleted bool) {
	s.Actors.Root.Send(s.ipcache, &messages.IPCacheHostAddr{Addr: addr, Deleted: deleted})
}

// EndpointActorPath is the registry path of endpoint actor name
// ("ep-12"), for System.Registry().Get.
func (s *System) EndpointActorPath(name string) string { return s.endpoints.Id + "/" + name }

// ProxyAck delivers a proxy's acknowledgement of an endpoint's revision
// (the datapath's proxy calls it); it never blocks.
func (s *System) ProxyAck(id endpoint.ID, revision uint64, proxyID string) {
	s.proxyAck(&messages.ProxyAck{ID: id, Revision: revision, ProxyID: proxyID})
}

// proxyAck sends an acknowledgement straight to the endpoint's actor (the
// registry holds the PID the manager spawned; two hops through the
// manager cost two mailbox passes per regeneration). With no actor
// for the ID it is dropped, as the manager drops it; an actor that
// stopped meanwhile drops it as a dead letter.
func (s *System) proxyAck(msg *messages.ProxyAck) {
	if pid := s.deps.registry.endpointPID(msg.ID); pid != nil {
		s.Actors.Root.Send(pid, msg)
	}
}

// ProxyNack delivers a proxy's rejection of the configuration an
// endpoint's revision needs: that regeneration fails (and is retried
// with backoff). It never blocks.
func (s *System) ProxyNack(id endpoint.ID, revision uint64, proxyID, reason string) {
	if reason == "" {
		reason = "rejected without a reason"
	}
	s.proxyAck(&messages.ProxyAck{ID: id, Revision: revision, ProxyID: proxyID, Rejected: reason})
}

// endpointAnswer turns an endpoint actor's answer into the endpoint or an
// error.
func endpointAnswer(res any, err error) (*endpoint.Endpoint, error) {
	if errors.Is(err, actor.ErrDeadLetter) {
		// The endpoint's actor stopped between the lookup and the request.
		return nil, ErrEndpointGone
	}
	r, err := answer[*messages.EndpointResult](res, err)
	if err != nil {
		return nil, err
	}
	return r.Endpoint, r.Err
}

// answer is an ask's answer as the type its request is answered with.
func answer[T any](res any, err error) (T, error) {
	var zero T
	if err != nil {
		return zero, err
	}
	r, ok := res.(T)
	if !ok {
		return zero, unexpected(res)
	}
	return r, nil
}

func unexpected(res any) error { return fmt.Errorf("unexpected answer %T", res) }

// EndpointActors lists the endpoint manager's children with their
// mailbox counters.
func (s *System) EndpointActors(ctx context.Context) ([]ActorInfo, error) {
	return answer[[]ActorInfo](s.ask(ctx, s.endpoints, &getActors{}))
}

// PoolStats returns a snapshot of the datapath pool.
func (s *System) PoolStats(ctx context.Context) (*PoolStats, error) {
	return answer[*PoolStats](s.ask(ctx, s.pool, &getPoolStats{}))
}

// SyncNodes replaces the set of remote nodes source ("k8s", "kvstore",
// "file", ...) knows with nodes (the full set; empty: none). It returns
// once the set is in the index (GET /v1/nodes); the union of every
// source's set reaches the datapath's NodeRouter asynchronously, retried
// until it succeeds. A malformed set is refused whole
// (datapath.CheckNodes). Conflicts are resolved, not refused: a node
// whose pod CIDRs overlap this node's own ranges, or another node's, is
// left out of the datapath's set with a warning (of two, the later by
// name); callers should leave this node out.
func (s *System) SyncNodes(ctx context.Context, source string, nodes []datapath.RemoteNode) error {
	if err := validateNodes(source, nodes); err != nil {
		return err
	}
	r, err := answer[*messages.NodesResult](s.ask(ctx, s.nodes, &messages.SyncNodes{Source: source, Nodes: nodes}))
	if err != nil {
		return err
	}
	return r.Err
}
