package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/index"
)

// ErrAgentDown is returned by Target.Snapshot while the agent is crashed.
var ErrAgentDown = errors.New("agent is down")

// Target is the agent under test: started, crashed and restarted by the
// harness, and observed for the invariant checks. The in-process target
// reads the index directly; a target running the agent as a process would
// build its Snapshot from the API.
type Target interface {
	// Start starts the agent the first time; Restart starts it again on the
	// same state (socket, state dir, datapath) after Crash. Both return once
	// the agent takes mutating calls.
	Start(ctx context.Context) error
	Restart(ctx context.Context) error
	// Crash kills the agent abruptly (agent.Agent.Crash in-process).
	Crash() error
	// Stop stops the agent gracefully and closes the client.
	Stop(ctx context.Context) error
	// Client talks to the agent's API, across restarts.
	Client() *client.Client
	// Snapshot reads the agent's state. deep adds what only means something
	// on a quiescent agent: actors, worker pool, datapath. Returns
	// ErrAgentDown while crashed.
	Snapshot(ctx context.Context, deep bool) (*Snapshot, error)
	// Counters are the actor system's counters, summed over restarts.
	Counters() actors.CounterValues
	// SetFaults applies datapath faults (the zero Faults turns them off).
	SetFaults(f Faults)
	// ProcessCount is how many actor processes (actors and futures) exist.
	ProcessCount() (int, error)
}

// Snapshot is what the invariant checks read from the agent. The index
// tables come from one read transaction.
type Snapshot struct {
	Endpoints  []*endpoint.Endpoint
	IPs        []*index.IP
	Identities []*index.Identity
	Leases     []*index.IdentityLease
	// PoolSize is the size of each address family's pool ("ipv4").
	PoolSize map[string]int

	// Deep parts (nil unless asked for).
	Actors []actors.ActorInfo
	Pool   *actors.PoolStats
	// Realized is the datapath's realised revision per endpoint.
	Realized map[endpoint.ID]uint64
	// LeftToGC are endpoints whose datapath removal the agent gave up on
	// (left to garbage collection).
	LeftToGC map[endpoint.ID]bool
}

// inProcess runs the agent in this process with the fake datapath, which
// survives crashes as the kernel's state would.
type inProcess struct {
	cfg  agent.Config
	log  *slog.Logger
	hook *logHook
	fake *datapath.Fake
	c    *client.Client
	seed uint64

	mu   sync.RWMutex // guards a and base
	a    *agent.Agent // nil while crashed
	base actors.CounterValues
}

var _ Target = (*inProcess)(nil)

func newInProcess(cfg agent.Config, agentLog slog.Handler, seed uint64) *inProcess {
	hook := newLogHook(agentLog)
	cfg.Fake = datapath.NewFake(seed)
	return &inProcess{cfg: cfg, log: slog.New(hook), hook: hook, fake: cfg.Fake, c: client.New(cfg.Socket), seed: seed}
}

func (t *inProcess) Start(context.Context) error {
	a, err := agent.Start(t.cfg, t.log)
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.a = a
	t.mu.Unlock()
	return nil
}

func (t *inProcess) Restart(ctx context.Context) error {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		if err = t.Start(ctx); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("restart agent: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("restart agent: %w", err)
}

func (t *inProcess) Crash() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.a == nil {
		return fmt.Errorf("crash agent: %w", ErrAgentDown)
	}
	t.a.Crash()
	t.base = addCounters(t.base, t.a.System.Counters())
	t.a = nil
	return nil
}

func (t *inProcess) Stop(ctx context.Context) error {
	t.mu.Lock()
	a := t.a
	if a != nil {
		t.base = addCounters(t.base, a.System.Counters())
	}
	t.a = nil
	t.mu.Unlock()
	t.c.Close()
	if a == nil {
		return nil
	}
	return a.Stop(ctx)
}

func (t *inProcess) Client() *client.Client { return t.c }

// RunGC runs one garbage collection pass on the running agent.
func (t *inProcess) RunGC(ctx context.Context) error {
	a, err := t.current()
	if err != nil {
		return err
	}
	_, err = a.System.RunGC(ctx)
	return err
}

func (t *inProcess) Counters() actors.CounterValues {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.a == nil {
		return t.base
	}
	return addCounters(t.base, t.a.System.Counters())
}

func addCounters(a, b actors.CounterValues) actors.CounterValues {
	return actors.CounterValues{RegenerationsRequested: a.RegenerationsRequested + b.RegenerationsRequested,
		RegenerationsRun: a.RegenerationsRun + b.RegenerationsRun, RegenerationsFailed: a.RegenerationsFailed + b.RegenerationsFailed,
		ProxyTimeouts: a.ProxyTimeouts + b.ProxyTimeouts, IndexTransactions: a.IndexTransactions + b.IndexTransactions,
		IndexRows: a.IndexRows + b.IndexRows}
}

func (t *inProcess) SetFaults(f Faults) {
	if t.fake == nil {
		return // the linux datapath: its faults come from the kernel
	}
	h := datapath.FakeHooks{RealizeDelay: f.DatapathDelay.D(), RemoveDelay: f.DatapathDelay.D(), ErrorRate: f.DatapathErrorRate,
		ProxyAcks: f.ProxyAcks, ProxyAckDelay: f.ProxyAckDelay.D(), ProxyAckDropRate: f.ProxyAckDropRate}
	if f.SlowDatapathRate > 0 && f.SlowDatapathDelay > 0 {
		s := &slowHook{rate: f.SlowDatapathRate, delay: f.SlowDatapathDelay.D(), rng: rand.New(rand.NewPCG(t.seed, 0x51041))}
		h.BeforeRealize = func(ctx context.Context, _ *endpoint.Endpoint, _ uint64) error { return s.maybeSleep(ctx) }
		h.BeforeRemove = func(ctx context.Context, _ *endpoint.Endpoint) error { return s.maybeSleep(ctx) }
	}
	t.fake.Set(h)
}

// slowHook delays a share of datapath operations.
type slowHook struct {
	rate  float64
	delay time.Duration
	mu    sync.Mutex // guards rng
	rng   *rand.Rand
}

func (s *slowHook) maybeSleep(ctx context.Context) error {
	s.mu.Lock()
	slow := s.rng.Float64() < s.rate
	s.mu.Unlock()
	if !slow {
		return nil
	}
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (t *inProcess) current() (*agent.Agent, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.a == nil {
		return nil, ErrAgentDown
	}
	return t.a, nil
}

func (t *inProcess) ProcessCount() (int, error) {
	a, err := t.current()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, bucket := range a.System.Actors.ProcessRegistry.LocalPIDs.LocalPIDs {
		n += bucket.Count()
	}
	return n, nil
}

// ProcessNames lists the actor processes (for a leak's report).
func (t *inProcess) ProcessNames() []string {
	a, err := t.current()
	if err != nil {
		return nil
	}
	var names []string
	for _, bucket := range a.System.Actors.ProcessRegistry.LocalPIDs.LocalPIDs {
		names = append(names, bucket.Keys()...)
	}
	slices.Sort(names)
	return names
}

func (t *inProcess) Snapshot(ctx context.Context, deep bool) (*Snapshot, error) {
	a, err := t.current()
	if err != nil {
		return nil, err
	}
	s := readIndex(a.Index)
	s.PoolSize = map[string]int{}
	for fam, p := range map[string]netip.Prefix{"ipv4": t.cfg.IPv4Range, "ipv6": t.cfg.IPv6Range} {
		if p.IsValid() {
			s.PoolSize[fam] = poolSize(p)
		}
	}
	if !deep {
		return s, nil
	}
	sys := a.System
	if s.Actors, err = sys.EndpointActors(ctx); err != nil {
		return nil, fmt.Errorf("snapshot: actors: %w", err)
	}
	if s.Pool, err = sys.PoolStats(ctx); err != nil {
		return nil, fmt.Errorf("snapshot: pool: %w", err)
	}
	if t.fake != nil { // the linux datapath is checked by linuxTarget
		s.Realized = make(map[endpoint.ID]uint64)
		for id := endpoint.ID(1); id != 0; id++ {
			if rev, ok := t.fake.Realized(id); ok {
				s.Realized[id] = rev
			}
		}
	}
	s.LeftToGC = t.hook.leftToGC()
	return s, nil
}

// readIndex reads the four tables in one read transaction.
func readIndex(ix *index.Index) *Snapshot {
	txn := ix.ReadTxn()
	s := &Snapshot{}
	each := func(table string, fn func(any)) {
		it, err := txn.Get(table, index.IndexID)
		if err != nil {
			return
		}
		for o := it.Next(); o != nil; o = it.Next() {
			fn(o)
		}
	}
	s.Endpoints = index.EndpointsIn(txn)
	s.IPs = index.IPsIn(txn)
	s.Identities = index.IdentitiesIn(txn)
	each(index.TableIdentityLeases, func(o any) { s.Leases = append(s.Leases, o.(*index.IdentityLease)) })
	return s
}
