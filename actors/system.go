package actors

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// System is a running actor system: the agent root actor and its
// children. Callers outside actors drive it only through its typed
// methods (frontdoor.go); readers use the index directly.
type System struct {
	Actors *actor.ActorSystem
	// The children's PIDs; endpoints is the endpoint manager.
	agent, pool, ipam, identity, policy, ipcache, endpoints, gc, nodes *actor.PID
	services                                                           *actor.PID

	Index    *index.Index
	Datapath datapath.Datapath
	Config   Config

	deps  *endpointDeps
	asker *asker // answers Ask
	log   *slog.Logger
	// fqdnSeen spares LearnFQDN the wait for answers realised already.
	fqdnSeen fqdnRealised
}

// Counters are the actor system's cumulative counters.
type Counters struct {
	regenRequested, regenRun, regenFailed, proxyTimeouts, proxyRejects atomic.Uint64
	indexTxns, indexRows                                               atomic.Uint64
	indexCommitNs                                                      atomic.Int64
	// healthRefused counts the remote nodes' health endpoint addresses
	// the nodes actor refused, by node source: source -> *atomic.Uint64.
	healthRefused sync.Map
}

// refusedHealth counts one refused health endpoint address of source.
func (c *Counters) refusedHealth(source string) {
	v, _ := c.healthRefused.LoadOrStore(source, new(atomic.Uint64))
	v.(*atomic.Uint64).Add(1)
}

// CounterValues is a snapshot of Counters.
type CounterValues struct {
	RegenerationsRequested, RegenerationsRun, RegenerationsFailed, ProxyTimeouts, ProxyRejects uint64
	// IndexTransactions and IndexRows count the index writer's commits
	// and the row changes they held.
	IndexTransactions, IndexRows uint64
	// IndexCommitTime is the index writer's time in those commits (the
	// transactions and the replies they release).
	IndexCommitTime time.Duration
	// NodeHealthRefused counts, by node source ("k8s", "kvstore"), the
	// other nodes' health endpoint addresses refused (outside the node's
	// pod CIDRs: endpoint.CheckHealthIPs), each (node, address) once.
	NodeHealthRefused map[string]uint64
}

// endpointDeps is what the manager and every endpoint actor share. Only
// immutable values and goroutine-safe registries live here.
type endpointDeps struct {
	cfg      EndpointConfig
	ix       *index.Index
	writer   *indexWriter // commits every table owner's index changes
	dp       datapath.Datapath
	log      *slog.Logger
	ipam     *actor.PID
	identity *actor.PID
	pool     *actor.PID
	policy   *actor.PID
	ipcache  *actor.PID
	counters *Counters
	store    StateStore
	registry *Registry // every actor's snapshot slot, with its mailbox counters
	events   *events.Hub
	observer Observer
	// backend runs the cluster identity backend's calls (nil: local
	// allocator); clusterStatus is what the identity actor publishes.
	backend       *backendWorkers
	clusterStatus atomic.Pointer[ClusterIdentityStatus]
	// hostLabels are the host identity's labels (the node's, SetHostLabels;
	// nil until known), kept here so that a restarted policy actor has
	// them.
	hostLabels atomic.Pointer[labels.Labels]
	// hostAudit is the host endpoint's policy audit mode (the node's
	// audit annotation, SetHostLabels).
	hostAudit atomic.Bool
	// nodeSelectorLabels: other nodes get identities of their own
	// (Config.NodeSelectorLabels); nodeIDs is their allocation, kept
	// here by the nodes actor so that a restarted nodes or policy actor
	// has it (nodeidentity.go).
	nodeSelectorLabels bool
	nodeLabels         *labels.Filter
	nodeIDs            atomic.Pointer[nodeIdentities]
}

// stopBackend stops the cluster identity backend's workers and watch.
func (d *endpointDeps) stopBackend() {
	if d.backend != nil {
		d.backend.stop()
	}
}

func (d *endpointDeps) stats(id string) *MailboxStats {
	if s := d.registry.slot(id); s != nil {
		return s.stats
	}
	return nil
}

// Start validates cfg and starts the actor system on ix and dp.
func Start(cfg Config, ix *index.Index, dp datapath.Datapath, log *slog.Logger) (*System, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	newAlloc := func() (identity.Allocator, error) { return identity.NewLocalAllocator(cfg.Identity) }
	sys := NewSystem(log)
	counters := &Counters{}
	deps := &endpointDeps{nodeSelectorLabels: cfg.NodeSelectorLabels, nodeLabels: cfg.NodeLabels, cfg: cfg.Endpoint, ix: ix, writer: newIndexWriter(ix, sys.Root.Send, counters, log), dp: dp, log: log, counters: counters, store: cfg.State,
		registry: &Registry{}, events: cfg.Events, observer: cfg.Observer}
	if cfg.IdentityBackend != nil {
		target := identityPID(sys)
		deps.backend = newBackendWorkers(cfg.IdentityBackend, cfg.ClusterIdentity, func(m any) { sys.Root.Send(target, m) }, log)
	}
	strategy := &agentStrategy{restart: actor.NewOneForOneStrategy(10, 10*time.Second, actor.DefaultDecider), writer: deps.writer, log: log, registry: deps.registry}
	root := &agentActor{deps: deps, strategy: strategy, cfg: cfg, log: log, newAlloc: newAlloc}
	rootStats := &MailboxStats{}
	rootSlot := newSlot(KindAgent, rootStats)
	opts := append(mailboxOptions(rootStats), actor.WithSupervisor(strategy))
	agentPID, err := sys.Root.SpawnNamed(actor.PropsFromProducer(rootSlot.track(func() actor.Actor { return root }), opts...), "agent")
	if err != nil {
		sys.Shutdown()
		deps.stopBackend()
		deps.writer.stop()
		return nil, fmt.Errorf("start actor system: %w", err)
	}
	deps.registry.put(agentPID.Id, rootSlot)
	asks := newAsker(sys)
	children, err := answer[map[string]*actor.PID](asks.ask(sys, agentPID, &getChildren{}, 10*time.Second))
	if err != nil {
		sys.Shutdown()
		deps.stopBackend()
		deps.writer.stop()
		asks.stop()
		return nil, fmt.Errorf("start actor system: %w", err)
	}
	s := &System{Actors: sys, agent: agentPID, pool: children["datapath"], ipam: children["ipam"],
		identity: children["identity"], policy: children["policy"], ipcache: children["ipcache"],
		endpoints: children["endpoints"], gc: children["gc"], nodes: children["nodes"], services: children["services"], Index: ix, Datapath: dp,
		Config: cfg, deps: deps, asker: asks, log: log}
	dp.SetProxyAck(s.ProxyAck)
	if n, ok := dp.(datapath.ProxyNacker); ok {
		n.SetProxyNack(s.ProxyNack)
	}
	if deps.backend != nil {
		deps.backend.startWatch()
	}
	return s, nil
}

// ask sends msg to pid and waits for the reply, bounded by ctx (default
// 30 s). Never called from inside an actor.
func (s *System) ask(ctx context.Context, pid *actor.PID, msg any) (any, error) {
	timeout := 30 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	if timeout <= 0 {
		return nil, context.DeadlineExceeded
	}
	return s.asker.ask(s.Actors, pid, msg, timeout)
}

// Counters returns the cumulative counters.
func (s *System) Counters() CounterValues {
	c := s.deps.counters
	out := CounterValues{RegenerationsRequested: c.regenRequested.Load(), RegenerationsRun: c.regenRun.Load(),
		RegenerationsFailed: c.regenFailed.Load(), ProxyTimeouts: c.proxyTimeouts.Load(), ProxyRejects: c.proxyRejects.Load(),
		IndexTransactions: c.indexTxns.Load(), IndexRows: c.indexRows.Load(), IndexCommitTime: time.Duration(c.indexCommitNs.Load()),
		NodeHealthRefused: map[string]uint64{}}
	c.healthRefused.Range(func(k, v any) bool {
		out.NodeHealthRefused[k.(string)] = v.(*atomic.Uint64).Load()
		return true
	})
	return out
}

// Registry returns the snapshots every actor publishes (GET /v1/actors).
func (s *System) Registry() *Registry { return s.deps.registry }

// Events returns the event hub (nil if the system was started without one).
func (s *System) Events() *events.Hub { return s.deps.events }

// MailboxStats returns the mailbox counters of an actor by PID ID.
func (s *System) MailboxStats(pidID string) *MailboxStats { return s.deps.stats(pidID) }

// Stop stops every actor without deleting anything: endpoints, leases and
// datapath state stay as they are, for the next start to restore.
func (s *System) Stop() {
	s.Datapath.SetProxyAck(nil)
	if n, ok := s.Datapath.(datapath.ProxyNacker); ok {
		n.SetProxyNack(nil)
	}
	_ = s.Actors.Root.StopFuture(s.agent).Wait()
	s.deps.stopBackend()
	s.Actors.Shutdown()
	s.deps.writer.stop()
	s.asker.stop()
}
