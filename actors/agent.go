package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
)

// EndpointConfig tunes the endpoint actors.
type EndpointConfig struct {
	// ProxyWaitTimeout bounds the wait for proxy acknowledgements of a
	// revision; the endpoint becomes ready without them after it.
	ProxyWaitTimeout time.Duration
	// DatapathTimeout bounds one datapath operation.
	DatapathTimeout time.Duration
	// RequestTimeout bounds an actor-to-actor request (IPAM, identity).
	RequestTimeout time.Duration
	// RetryMin and RetryMax bound the backoff between failed regenerations.
	RetryMin, RetryMax time.Duration
	// RestartBudget is how many panics within 10 s an endpoint actor
	// survives (restart, state rebuilt from the index) before it is stopped.
	RestartBudget int
}

// StateStore persists endpoint state (restore.Store). Both calls must not
// block: done is called once the change is durable.
type StateStore interface {
	Write(ep *endpoint.Endpoint, done func(error))
	Remove(id endpoint.ID, done func(error))
}

// Config configures the actor system.
type Config struct {
	// State persists endpoints; nil keeps them in memory only.
	State    StateStore
	IPAM     IPAMConfig
	Identity identity.LocalConfig
	Pool     PoolConfig
	Endpoint EndpointConfig
	Policy   PolicyConfig
	// Events receives endpoint and identity events (nil: none).
	Events *events.Hub
	// Observer receives regeneration phase durations (nil: none).
	Observer Observer
	GC       GCConfig
	// HostAddrs are the host's own addresses besides the gateways (the
	// Linux datapath's host netns at start): the host identity in the
	// ipcache, so traffic the host sends from them is not world.
	HostAddrs []netip.Addr
}

// withDefaults fills zero fields.
func (c Config) withDefaults() Config {
	if c.IPAM.Expiry == 0 {
		c.IPAM.Expiry = 10 * time.Minute
	}
	e := &c.Endpoint
	e.ProxyWaitTimeout = orDefault(e.ProxyWaitTimeout, 5*time.Second)
	e.DatapathTimeout = orDefault(e.DatapathTimeout, 30*time.Second)
	e.RequestTimeout = orDefault(e.RequestTimeout, 10*time.Second)
	e.RetryMin = orDefault(e.RetryMin, 100*time.Millisecond)
	e.RetryMax = orDefault(e.RetryMax, 30*time.Second)
	if e.RestartBudget == 0 {
		e.RestartBudget = 5
	}
	if c.Pool.Workers == 0 {
		c.Pool.Workers = max(4, 2*runtime.GOMAXPROCS(0))
	}
	c.Pool.DefaultTimeout = orDefault(c.Pool.DefaultTimeout, 30*time.Second)
	c.GC.Interval = orDefault(c.GC.Interval, time.Minute)
	if c.Policy.ImportStep == 0 {
		c.Policy.ImportStep = 1000
	}
	return c
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// gateways returns the gateway of each configured range and the host's
// addresses: the host in the ipcache.
func (c Config) gateways() []netip.Addr {
	out, _ := ipam.Gateways(c.IPAM.IPv4, c.IPAM.IPv6) // Validate checked the ranges
	for _, a := range c.HostAddrs {
		a = a.Unmap()
		// An address inside a pod range is an endpoint's to claim.
		if a.IsValid() && !slices.Contains(out, a) && !c.IPAM.IPv4.Contains(a) && !c.IPAM.IPv6.Contains(a) {
			out = append(out, a)
		}
	}
	return out
}

// podRanges returns the configured pod ranges.
func (c Config) podRanges() []netip.Prefix {
	var out []netip.Prefix
	for _, p := range []netip.Prefix{c.IPAM.IPv4, c.IPAM.IPv6} {
		if p.IsValid() {
			out = append(out, p)
		}
	}
	return out
}

// Validate names the bad field.
func (c Config) Validate() error {
	if err := c.IPAM.Validate(); err != nil {
		return err
	}
	if err := c.Identity.Validate(); err != nil {
		return fmt.Errorf("identity config: %w", err)
	}
	e := c.Endpoint
	for name, d := range map[string]time.Duration{"ProxyWaitTimeout": e.ProxyWaitTimeout, "DatapathTimeout": e.DatapathTimeout,
		"RequestTimeout": e.RequestTimeout, "RetryMin": e.RetryMin, "RetryMax": e.RetryMax} {
		if d < 0 {
			return fmt.Errorf("endpoint config: %s is negative: %w", name, ErrInvalidConfig)
		}
	}
	if c.Policy.ImportStep < 0 {
		return fmt.Errorf("policy config: ImportStep %d is negative: %w", c.Policy.ImportStep, ErrInvalidConfig)
	}
	if c.Pool.Workers < 0 || c.Pool.Workers > 1024 {
		return fmt.Errorf("pool config: Workers %d outside 1..1024: %w", c.Pool.Workers, ErrInvalidConfig)
	}
	return nil
}

// Counters are the actor system's cumulative counters.
type Counters struct {
	regenRequested, regenRun, regenFailed, proxyTimeouts atomic.Uint64
	indexTxns, indexRows                                 atomic.Uint64
}

// CounterValues is a snapshot of Counters.
type CounterValues struct {
	RegenerationsRequested, RegenerationsRun, RegenerationsFailed, ProxyTimeouts uint64
	// IndexTransactions and IndexRows count the index writer's commits
	// and the row changes they held.
	IndexTransactions, IndexRows uint64
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
}

func (d *endpointDeps) stats(id string) *MailboxStats {
	if s := d.registry.slot(id); s != nil {
		return s.stats
	}
	return nil
}

// System is a running actor system: the agent root actor and its
// children. Callers outside actors drive it only through its typed
// methods (frontdoor.go); readers use the index directly.
type System struct {
	Actors *actor.ActorSystem
	// The children's PIDs; endpoints is the endpoint manager.
	agent, pool, ipam, identity, policy, ipcache, endpoints, gc *actor.PID

	Index    *index.Index
	Datapath datapath.Datapath
	Config   Config

	deps  *endpointDeps
	asker *asker // answers Ask
	log   *slog.Logger
}

// agentActor is the root supervisor. It spawns the datapath pool, IPAM,
// identity and endpoint manager actors in Started. Its strategy restarts
// a failing child (which rebuilds from its index table), except the
// endpoint manager, which is resumed: protoactor stops all children of a
// restarting actor, and stopping every endpoint actor would release their
// leases.
type agentActor struct {
	deps     *endpointDeps
	strategy *agentStrategy
	cfg      Config
	log      *slog.Logger
	newAlloc func() (identity.Allocator, error)
	children map[string]*actor.PID
}

type getChildren struct{}

// restartChildren is commitThenRestart's deferred restart, sent to the
// agent actor by the index writer once the failed children's index
// changes are committed.
type restartChildren struct {
	sup  actor.Supervisor
	pids []*actor.PID
}

// Receive implements actor.Actor.
func (a *agentActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		a.spawnChildren(ctx)
	case *getChildren:
		ctx.Respond(a.children)
	case *restartChildren:
		msg.sup.RestartChildren(msg.pids...)
	}
}

func (a *agentActor) spawnChildren(ctx actor.Context) {
	a.children = make(map[string]*actor.PID)
	spawn := func(name string, stats *MailboxStats, produce func() actor.Actor) *actor.PID {
		slot := newSlot(name, stats)
		opts := append(mailboxOptions(stats), actor.WithReceiverMiddleware(slot.trackReceive))
		pid, err := ctx.SpawnNamed(actor.PropsFromProducer(produce, opts...), name)
		if err != nil {
			panic(fmt.Sprintf("spawn %s: %v", name, err))
		}
		a.deps.registry.put(pid.Id, slot)
		a.children[name] = pid
		return pid
	}
	d := a.deps
	d.pool = spawn("datapath", &MailboxStats{}, func() actor.Actor { return newPoolActor(a.cfg.Pool, a.log) })
	d.ipam = spawn("ipam", &MailboxStats{}, func() actor.Actor { return newIPAMActor(a.cfg.IPAM, d.writer, a.log) })
	d.ipcache = spawn("ipcache", &MailboxStats{}, func() actor.Actor { return newIPCacheActor(d, a.cfg.gateways(), a.cfg.podRanges()) })
	// The manager is spawned after the policy actor; its PID is known by name.
	manager := actor.NewPID(ctx.ActorSystem().Address(), ctx.Self().Id+"/endpoints")
	d.policy = spawn("policy", &MailboxStats{}, func() actor.Actor {
		return newPolicyActor(d, a.cfg.Policy, manager, d.ipcache)
	})
	d.identity = spawn("identity", &MailboxStats{}, func() actor.Actor {
		ia := newIdentityActor(a.newAlloc, d.writer, d.policy, a.log)
		ia.events = d.events
		return ia
	})
	mgr := spawn("endpoints", &MailboxStats{}, func() actor.Actor { return newManagerActor(d) })
	a.strategy.resume = mgr
	gcOn := new(atomic.Bool)
	gc := spawn("gc", &MailboxStats{}, func() actor.Actor { return newGCActor(a.cfg.GC, d, mgr, gcOn, a.log) })
	// The answers processes of the children with a requester, registered
	// here rather than in their Started, so that every process of the
	// system exists once Start returns.
	for _, pid := range []*actor.PID{d.ipcache, d.policy, gc} {
		registerAnswers(ctx.ActorSystem(), pid)
	}
}

// agentStrategy resumes the endpoint manager and restarts other children
// within a budget of 10 failures per 10 s, then stops them.
type agentStrategy struct {
	// resume is the endpoint manager, set when the agent actor spawned
	// it (its Started runs before any child can fail).
	resume   *actor.PID
	restart  actor.SupervisorStrategy
	writer   *indexWriter
	log      *slog.Logger
	registry *Registry
}

// HandleFailure implements actor.SupervisorStrategy.
func (s *agentStrategy) HandleFailure(sys *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, rs *actor.RestartStatistics, reason, msg any) {
	s.log.Error("actor failed", "actor", child.Id, "reason", reason, "message", fmt.Sprintf("%T", msg))
	if slot := s.registry.slot(child.Id); slot != nil {
		slot.failed(reason)
	}
	if child.Equal(s.resume) {
		sup.ResumeChildren(child)
		return
	}
	s.restart.HandleFailure(sys, &commitThenRestart{Supervisor: sup, writer: s.writer}, child, rs, reason, msg)
}

// commitThenRestart restarts children only after the index writer
// committed every group handed over before (a failing owner flushed its
// batch as it panicked: batcher.flushOnPanic), so the next incarnation
// rebuilds from its predecessor's writes. The failed child's mailbox
// stays suspended meanwhile; nobody blocks.
type commitThenRestart struct {
	actor.Supervisor
	writer *indexWriter
}

// RestartChildren implements actor.Supervisor.
func (c *commitThenRestart) RestartChildren(pids ...*actor.PID) {
	parent, ok := c.Supervisor.(interface{ Self() *actor.PID })
	if !ok {
		c.Supervisor.RestartChildren(pids...)
		return
	}
	c.writer.submit(writeGroup{replies: []messages.Reply{{To: parent.Self(), Message: &restartChildren{sup: c.Supervisor, pids: pids}}}})
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
	deps := &endpointDeps{cfg: cfg.Endpoint, ix: ix, writer: newIndexWriter(ix, sys.Root.Send, counters, log), dp: dp, log: log, counters: counters, store: cfg.State,
		registry: &Registry{}, events: cfg.Events, observer: cfg.Observer}
	strategy := &agentStrategy{restart: actor.NewOneForOneStrategy(10, 10*time.Second, actor.DefaultDecider), writer: deps.writer, log: log, registry: deps.registry}
	root := &agentActor{deps: deps, strategy: strategy, cfg: cfg, log: log, newAlloc: newAlloc}
	rootStats := &MailboxStats{}
	rootSlot := newSlot(KindAgent, rootStats)
	opts := append(mailboxOptions(rootStats), actor.WithSupervisor(strategy), actor.WithReceiverMiddleware(rootSlot.trackReceive))
	agentPID, err := sys.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return root }, opts...), "agent")
	if err != nil {
		sys.Shutdown()
		deps.writer.stop()
		return nil, fmt.Errorf("start actor system: %w", err)
	}
	deps.registry.put(agentPID.Id, rootSlot)
	asks := newAsker(sys)
	res, err := asks.ask(sys, agentPID, &getChildren{}, 10*time.Second)
	children, ok := res.(map[string]*actor.PID)
	if err != nil || !ok {
		sys.Shutdown()
		deps.writer.stop()
		asks.stop()
		return nil, fmt.Errorf("start actor system: %w", errors.Join(err, unexpected(res)))
	}
	s := &System{Actors: sys, agent: agentPID, pool: children["datapath"], ipam: children["ipam"],
		identity: children["identity"], policy: children["policy"], ipcache: children["ipcache"],
		endpoints: children["endpoints"], gc: children["gc"], Index: ix, Datapath: dp,
		Config: cfg, deps: deps, asker: asks, log: log}
	dp.SetProxyAck(s.ProxyAck)
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
	return CounterValues{RegenerationsRequested: c.regenRequested.Load(), RegenerationsRun: c.regenRun.Load(),
		RegenerationsFailed: c.regenFailed.Load(), ProxyTimeouts: c.proxyTimeouts.Load(),
		IndexTransactions: c.indexTxns.Load(), IndexRows: c.indexRows.Load()}
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
	_ = s.Actors.Root.StopFuture(s.agent).Wait()
	s.Actors.Shutdown()
	s.deps.writer.stop()
	s.asker.stop()
}
