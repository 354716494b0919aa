package actors

import (
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// agentActor is the root supervisor (config.go holds the system's
// Config, system.go the System handle, Start and Stop). It spawns every
// child actor in Started. Its strategy restarts
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
		pid, err := ctx.SpawnNamed(actor.PropsFromProducer(slot.track(produce), mailboxOptions(stats)...), name)
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
		if d.backend != nil {
			ia.cluster = newClusterMode(d.backend, a.cfg.ClusterIdentity, &d.clusterStatus)
		}
		return ia
	})
	nodes := spawn(KindNodes, &MailboxStats{}, func() actor.Actor { return newNodesActor(d, a.cfg.podRanges(), a.cfg.NodesResync) })
	mgr := spawn("endpoints", &MailboxStats{}, func() actor.Actor { return newManagerActor(d) })
	a.strategy.resume = mgr
	gcOn := new(atomic.Bool)
	gc := spawn("gc", &MailboxStats{}, func() actor.Actor { return newGCActor(a.cfg.GC, d, mgr, gcOn, a.log) })
	svcs := spawn("services", &MailboxStats{}, func() actor.Actor { return newServicesActor(d) })
	// The answers processes of the children with a requester, registered
	// here rather than in their Started, so that every process of the
	// system exists once Start returns.
	for _, pid := range []*actor.PID{d.ipcache, d.policy, gc, nodes, svcs} {
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
