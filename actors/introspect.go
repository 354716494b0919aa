package actors

import (
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// Observer receives measurements from the actors; pkg/agent/metrics implements
// it. Calls come from inside actors and must not block.
type Observer interface {
	// RegenPhase records how long one phase of a regeneration took.
	RegenPhase(phase string, d time.Duration)
}

// Regeneration phases, in order; PhaseTotal spans all of them.
const (
	PhaseWriteState = "write-state"
	PhaseRealize    = "realize"
	PhaseProxyWait  = "proxy-wait"
	PhaseTotal      = "total"
	// PhaseComputePolicy is the policy actor's answer, the first part of
	// PhaseWriteState; only the Observer sees it.
	PhaseComputePolicy = "compute-policy"
	// PhaseAccept is a created endpoint's time from the manager's create
	// to its first regeneration's start (actor spawn, identity); only
	// the Observer sees it.
	PhaseAccept = "accept"
)

// RegenPhases lists the phases in the order of EndpointActorSnapshot.LastPhases.
var RegenPhases = [4]string{PhaseWriteState, PhaseRealize, PhaseProxyWait, PhaseTotal}

// Actor kinds.
const (
	KindAgent     = "agent"
	KindDatapath  = "datapath"
	KindIPAM      = "ipam"
	KindIdentity  = "identity"
	KindIPCache   = "ipcache"
	KindPolicy    = "policy"
	KindGC        = "gc"
	KindServices  = "services"
	KindEndpoints = "endpoints"
	KindEndpoint  = "endpoint"
)

// kindOrder sorts the tree: the root, its children, then the endpoints.
var kindOrder = map[string]int{KindAgent: 0, KindDatapath: 1, KindIPAM: 2, KindIPCache: 3, KindPolicy: 4, KindIdentity: 5,
	KindGC: 6, KindServices: 7, KindEndpoints: 8, KindEndpoint: 9}

// ActorSnapshot is what operators see of one actor. The actor publishes
// it without being asked (no mailbox round trip); MailboxDepth and
// Processed are read from its counting mailbox when the snapshot is taken.
type ActorSnapshot struct {
	Path string
	Kind string
	// State is the endpoint's lifecycle state, or "running".
	State      string
	StateSince time.Time
	// Operation is what the actor is doing: the asynchronous operation an
	// endpoint actor waits for (realize, write-state, claim-ips, ...) or the
	// message another actor is handling; "" when idle.
	Operation      string
	OperationSince time.Time
	MailboxDepth   int64
	Processed      int64
	// Restarts counts the actor's restarts by its supervisor.
	Restarts  int64
	LastError string
	// Endpoint is set for endpoint actors.
	Endpoint *EndpointActorSnapshot
	// Reconciler is set for the actors that write the datapath through a
	// reconciler (ipcache, nodes, services); shared, read-only.
	Reconciler *ReconcilerSnapshot
}

// ReconcilerSnapshot is what an actor's reconciler (reconciler.go) has
// not yet written to the datapath.
type ReconcilerSnapshot struct {
	// Pending counts the keys not yet written as desired: due, being
	// written or failed.
	Pending int
	// Failed counts the keys whose last write failed (retried).
	Failed int
	// Failures counts the consecutive failed jobs (a failed full sync
	// included), the backoff's attempt; LastError is the last one's first
	// error. Both are reset by a job that succeeds.
	Failures  int
	LastError string
}

// EndpointActorSnapshot adds what an endpoint actor knows.
type EndpointActorSnapshot struct {
	ID               endpoint.ID
	DesiredRevision  uint64
	RealizedRevision uint64
	// RegenerationsRun counts started regenerations; RegenerationsCoalesced
	// the requests merged into an already pending one; RegenerationsFailed
	// the failed ones.
	RegenerationsRun       uint64
	RegenerationsCoalesced uint64
	RegenerationsFailed    uint64
	// LastRegeneration is when the last successful regeneration ended;
	// LastPhases its phase durations, indexed like RegenPhases.
	LastRegeneration time.Time
	LastPhases       [4]time.Duration
}

// BusySince is when the actor started what it is doing: its operation, or
// for an endpoint that is not ready, the time it entered its state. Zero
// when idle. ActorFilter.StuckFor compares against it.
func (s *ActorSnapshot) BusySince() time.Time {
	if s.Operation != "" {
		return s.OperationSince
	}
	if s.Kind == KindEndpoint && s.State != string(endpoint.StateReady) {
		return s.StateSince
	}
	return time.Time{}
}

// report is what an endpoint actor publishes about itself: its record
// (immutable once reported, shared like the index row) and what the
// record does not hold. Small, because every live endpoint keeps one;
// comparable, so the actor republishes only when something changed.
type report struct {
	ep                      *endpoint.Endpoint
	operation               string
	operationSince          int64 // unix nanoseconds
	runs, coalesced, failed uint32
	lastAt                  int64     // unix nanoseconds; 0: none yet
	lastPhases              [4]uint32 // microseconds
}

// opNames interns the type names of the messages non-endpoint actors
// handle (reflect.Type -> *string), so that tracking the message an actor
// is handling allocates nothing per message.
var opNames sync.Map

func opName(msg any) *string {
	t := reflect.TypeOf(msg)
	if n, ok := opNames.Load(t); ok {
		return n.(*string)
	}
	name := t.String()
	n, _ := opNames.LoadOrStore(t, &name)
	return n.(*string)
}

// failure counts a supervisor's restarts of an actor and the last reason.
type failure struct {
	restarts int64
	reason   string
}

// actorSlot holds what one actor publishes. Written by the actor (report,
// op), its supervisor (fail) and its mailbox (stats); read by HTTP
// handlers. Every field is atomic or set before the slot is shared.
type actorSlot struct {
	path   string
	kind   string
	pid    *actor.PID // an endpoint actor's, set before the slot is shared
	stats  *MailboxStats
	report atomic.Pointer[report]
	// op names the message a non-endpoint actor is handling (nil: none),
	// since opSince (unix nanoseconds). Readers may pair a name with the
	// previous message's start: it is a diagnostic.
	op      atomic.Pointer[string]
	opSince atomic.Int64
	fail    atomic.Pointer[failure]
	// rec is what the actor's reconciler reports (nil: it has none),
	// replaced only when it changed.
	rec atomic.Pointer[ReconcilerSnapshot]
}

func newSlot(kind string, stats *MailboxStats) *actorSlot {
	return &actorSlot{kind: kind, stats: stats}
}

// publish stores r unless it equals the current report.
func (s *actorSlot) publish(r report) {
	if cur := s.report.Load(); cur != nil && *cur == r {
		return
	}
	s.report.Store(&r)
}

// failed records a supervisor's restart of the actor and the reason
// (called by the supervisor only, so load-then-store does not race).
func (s *actorSlot) failed(reason any) {
	f := &failure{restarts: 1, reason: "panic: " + anyString(reason)}
	if cur := s.fail.Load(); cur != nil {
		f.restarts = cur.restarts + 1
	}
	s.fail.Store(f)
}

// restarted reports whether the actor's supervisor restarted it before.
func (s *actorSlot) restarted() bool { return s.fail.Load() != nil }

func anyString(v any) string {
	switch x := v.(type) {
	case error:
		return x.Error()
	case string:
		return x
	}
	return reflect.TypeOf(v).String()
}

func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// snapshotInto fills out (and ep, for an endpoint actor; out.Endpoint
// then points to it).
func (s *actorSlot) snapshotInto(out *ActorSnapshot, ep *EndpointActorSnapshot) {
	*out = ActorSnapshot{Path: s.path, Kind: s.kind, State: "running"}
	if s.stats != nil {
		out.MailboxDepth, out.Processed = s.stats.Depth(), s.stats.Processed()
	}
	if f := s.fail.Load(); f != nil {
		out.Restarts, out.LastError = f.restarts, f.reason
	}
	if r := s.report.Load(); r != nil && r.ep != nil {
		e := r.ep
		out.State, out.StateSince = string(e.State), e.StateChanged
		if e.LastError != "" {
			out.LastError = e.LastError
		}
		out.Operation, out.OperationSince = r.operation, unixTime(r.operationSince)
		*ep = EndpointActorSnapshot{ID: e.ID, DesiredRevision: e.DesiredRevision, RealizedRevision: e.RealizedRevision,
			RegenerationsRun: uint64(r.runs), RegenerationsCoalesced: uint64(r.coalesced), RegenerationsFailed: uint64(r.failed),
			LastRegeneration: unixTime(r.lastAt)}
		for i, us := range r.lastPhases {
			ep.LastPhases[i] = time.Duration(us) * time.Microsecond
		}
		out.Endpoint = ep
	}
	out.Reconciler = s.rec.Load()
	if op := s.op.Load(); op != nil && out.Operation == "" {
		out.Operation, out.OperationSince = *op, time.Unix(0, s.opSince.Load())
	}
}

func (s *actorSlot) snapshot() ActorSnapshot {
	var out ActorSnapshot
	s.snapshotInto(&out, &EndpointActorSnapshot{})
	return out
}

// trackedActor records in its slot the message a non-endpoint actor is
// handling, so a stuck handler shows up. A wrapper of the actor rather
// than receiver middleware: protoactor wraps every message in a new
// envelope when an actor has middleware (an allocation per message, ~27
// per simulated lifecycle).
type trackedActor struct {
	actor.Actor
	slot *actorSlot
	rec  reconcileReporter // the actor, if an owner; nil otherwise
}

// reconcileReporter is an actor that may report a reconciler (owner).
type reconcileReporter interface {
	reconcileReport() (ReconcilerSnapshot, bool)
}

// Receive implements actor.Actor.
func (t *trackedActor) Receive(c actor.Context) {
	s := t.slot
	s.opSince.Store(time.Now().UnixNano())
	s.op.Store(opName(c.Message()))
	t.Actor.Receive(c)
	s.op.Store(nil)
	if t.rec != nil {
		s.publishReconcile(t.rec)
	}
}

// publishReconcile stores what rr's reconciler reports, if it has one
// and the report changed.
func (s *actorSlot) publishReconcile(rr reconcileReporter) {
	r, ok := rr.reconcileReport()
	if !ok {
		return
	}
	if cur := s.rec.Load(); cur != nil && *cur == r {
		return
	}
	s.rec.Store(&r)
}

// trackedSupervisor is a tracked actor that supervises its children
// itself: protoactor asks the actor for actor.SupervisorStrategy.
type trackedSupervisor struct {
	trackedActor
	strategy actor.SupervisorStrategy
}

// HandleFailure implements actor.SupervisorStrategy.
func (t *trackedSupervisor) HandleFailure(sys *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, rs *actor.RestartStatistics, reason, msg any) {
	t.strategy.HandleFailure(sys, sup, child, rs, reason, msg)
}

// track returns produce with every actor it makes tracked in s.
func (s *actorSlot) track(produce actor.Producer) actor.Producer {
	return func() actor.Actor {
		a := produce()
		rr, _ := a.(reconcileReporter)
		if st, ok := a.(actor.SupervisorStrategy); ok {
			return &trackedSupervisor{trackedActor: trackedActor{Actor: a, slot: s, rec: rr}, strategy: st}
		}
		return &trackedActor{Actor: a, slot: s, rec: rr}
	}
}

// ActorFilter selects actors; zero fields match everything.
type ActorFilter struct {
	Kind  string
	State string
	// MinMailbox keeps actors with at least this many queued messages.
	MinMailbox int64
	// StuckFor keeps actors busy (BusySince) for longer than this.
	StuckFor time.Duration
}

func (f ActorFilter) match(s *ActorSnapshot, now time.Time) bool {
	switch {
	case f.Kind != "" && s.Kind != f.Kind:
		return false
	case f.State != "" && s.State != f.State:
		return false
	case f.MinMailbox > 0 && s.MailboxDepth < f.MinMailbox:
		return false
	case f.StuckFor > 0:
		since := s.BusySince()
		return !since.IsZero() && now.Sub(since) > f.StuckFor
	}
	return true
}

// Registry holds the slot of every live actor. Endpoint actors sit in a
// fixed array indexed by endpoint ID (lock-free, already in ID order, so
// listing 10,000 of them costs a scan of 65,536 pointers and no sort);
// the few other actors sit in a small map. Safe for concurrent use; it
// never touches a mailbox.
type Registry struct {
	endpoints endpointSlots
	live      atomic.Int64 // non-nil entries of endpoints (approximate while changing)
	// mu guards others (written only when a top-level actor spawns).
	mu     sync.RWMutex
	others map[string]*actorSlot
}

// endpointSlots holds the endpoint actors' slots by endpoint ID in
// chunks of slotChunk IDs, each allocated on its first ID's put and
// kept: a node uses few of the 65,536 IDs, and a whole table was half a
// MiB of live heap for the garbage collector to scan every cycle.
type endpointSlots struct {
	chunks [(endpoint.MaxID + 1) / slotChunk]atomic.Pointer[[slotChunk]atomic.Pointer[actorSlot]]
}

// slotChunk is the number of IDs per chunk (2 KiB).
const slotChunk = 256

// at returns id's cell, allocating its chunk if needed.
func (t *endpointSlots) at(id endpoint.ID) *atomic.Pointer[actorSlot] {
	p := &t.chunks[int(id)/slotChunk]
	c := p.Load()
	if c == nil {
		// A lost race leaves the winner's chunk, which Load returns.
		p.CompareAndSwap(nil, new([slotChunk]atomic.Pointer[actorSlot]))
		c = p.Load()
	}
	return &c[int(id)%slotChunk]
}

// load returns id's slot (nil: none).
func (t *endpointSlots) load(id endpoint.ID) *actorSlot {
	if c := t.chunks[int(id)/slotChunk].Load(); c != nil {
		return c[int(id)%slotChunk].Load()
	}
	return nil
}

// each calls fn for every slot in ID order.
func (t *endpointSlots) each(fn func(*actorSlot)) {
	for i := range t.chunks {
		c := t.chunks[i].Load()
		if c == nil {
			continue
		}
		for j := range c {
			if s := c[j].Load(); s != nil {
				fn(s)
			}
		}
	}
}

func (r *Registry) put(path string, s *actorSlot) {
	s.path = path
	if id, ok := endpointIDFromPath(path); ok && s.kind == KindEndpoint {
		if r.endpoints.at(id).Swap(s) == nil {
			r.live.Add(1)
		}
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.others == nil {
		r.others = make(map[string]*actorSlot)
	}
	r.others[path] = s
}

func (r *Registry) remove(path string) {
	if id, ok := endpointIDFromPath(path); ok {
		if cur := r.endpoints.load(id); cur != nil && cur.path == path && r.endpoints.at(id).CompareAndSwap(cur, nil) {
			r.live.Add(-1)
		}
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.others, path)
}

func (r *Registry) slot(path string) *actorSlot {
	if id, ok := endpointIDFromPath(path); ok {
		if s := r.endpoints.load(id); s != nil && s.path == path {
			return s
		}
		return nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.others[path]
}

// endpointPID returns the PID of endpoint id's actor, nil if it has none.
func (r *Registry) endpointPID(id endpoint.ID) *actor.PID {
	if s := r.endpoints.load(id); s != nil {
		return s.pid
	}
	return nil
}

// endpointIDFromPath parses the ID of an endpoint actor's path (".../ep-<id>").
func endpointIDFromPath(path string) (endpoint.ID, bool) {
	return endpointIDFromPID(&actor.PID{Id: path})
}

// Get returns one actor's snapshot by path.
func (r *Registry) Get(path string) (ActorSnapshot, bool) {
	s := r.slot(path)
	if s == nil {
		return ActorSnapshot{}, false
	}
	return s.snapshot(), true
}

// List returns the snapshots matching f, the root first, then its
// children, then endpoint actors by endpoint ID.
func (r *Registry) List(f ActorFilter, now time.Time) []ActorSnapshot {
	n := 8
	if f.Kind == "" || f.Kind == KindEndpoint {
		n += int(r.live.Load())
	}
	out := make([]ActorSnapshot, 0, n)
	r.Visit(f, now, func(s *ActorSnapshot) {
		c := *s
		if s.Endpoint != nil {
			ep := *s.Endpoint
			c.Endpoint = &ep
		}
		out = append(out, c)
	})
	return out
}

// Visit calls fn with the snapshot of every actor matching f, in List's
// order, without building a list; snap (and snap.Endpoint) is reused
// between calls, so fn must copy what it keeps.
func (r *Registry) Visit(f ActorFilter, now time.Time, fn func(snap *ActorSnapshot)) {
	r.mu.RLock()
	top := make([]ActorSnapshot, 0, len(r.others))
	for _, s := range r.others {
		if snap := s.snapshot(); f.match(&snap, now) {
			top = append(top, snap)
		}
	}
	r.mu.RUnlock()
	slices.SortFunc(top, func(a, b ActorSnapshot) int {
		if d := kindOrder[a.Kind] - kindOrder[b.Kind]; d != 0 {
			return d
		}
		return strings.Compare(a.Path, b.Path)
	})
	for i := range top {
		fn(&top[i])
	}
	if f.Kind != "" && f.Kind != KindEndpoint {
		return
	}
	var snap ActorSnapshot
	var ep EndpointActorSnapshot // reused: fn must not keep snap.Endpoint
	r.endpoints.each(func(s *actorSlot) {
		if s.snapshotInto(&snap, &ep); f.match(&snap, now) {
			fn(&snap)
		}
	})
}

// each calls fn for every registered slot.
func (r *Registry) each(fn func(*actorSlot)) {
	r.mu.RLock()
	for _, s := range r.others {
		fn(s)
	}
	r.mu.RUnlock()
	r.endpoints.each(fn)
}

// Len returns the number of registered actors.
func (r *Registry) Len() int {
	n := 0
	r.each(func(*actorSlot) { n++ })
	return n
}

// MailboxByKind sums and maximises mailbox depth per actor kind (for the
// metrics scrape).
func (r *Registry) MailboxByKind() (sum, maxDepth map[string]int64) {
	sum, maxDepth = map[string]int64{}, map[string]int64{}
	r.each(func(s *actorSlot) {
		if s.stats == nil {
			return
		}
		d := s.stats.Depth()
		sum[s.kind] += d
		maxDepth[s.kind] = max(maxDepth[s.kind], d)
	})
	return sum, maxDepth
}

// endpointOpName names the asynchronous operation an endpoint actor waits
// for, from the request it sent.
func endpointOpName(msg any) string {
	switch m := msg.(type) {
	case *messages.DatapathWork:
		return m.Op
	case *messages.IPAMClaim:
		return "claim-ips"
	case *messages.IPAMUnclaim:
		return "release-ips"
	case *messages.IdentityAcquire:
		return "acquire-identity"
	case *messages.IdentityRelease:
		return "release-identity"
	}
	name := reflect.TypeOf(msg).String()
	return strings.ToLower(name[strings.LastIndexByte(name, '.')+1:])
}
