package actors

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// recordingObserver counts the regeneration phases it is told about.
type recordingObserver struct{ phases chan string }

func (o *recordingObserver) RegenPhase(phase string, d time.Duration) {
	if d < 0 {
		panic("negative phase duration")
	}
	o.phases <- phase
}

// TestSnapshotsFollowTheActors: snapshots appear with the actor, carry
// the regeneration counters and phases, show a restart with its reason,
// and go with the actor.
func TestSnapshotsFollowTheActors(t *testing.T) {
	obs := &recordingObserver{phases: make(chan string, 100)}
	hub := events.New(64)
	sys, _ := svSystem(t, func(c *Config) { c.Observer, c.Events = obs, hub })
	reg := sys.Registry()
	if n := reg.Len(); n != 10 {
		t.Fatalf("registry holds %d actors before any endpoint, want 10", n)
	}
	ep := svCreate(t, sys, "snap")
	for _, want := range []string{PhaseAccept, PhaseComputePolicy, PhaseWriteState, PhaseRealize, PhaseTotal} {
		if got := <-obs.phases; got != want {
			t.Fatalf("observed phase %s, want %s", got, want)
		}
	}
	// A request while one runs and one while one is pending: coalesced.
	for range 3 {
		sys.Actors.Root.Send(sys.endpoints, &messages.Regenerate{ID: ep.ID})
	}
	path := svPID(sys, ep.ID).Id
	testutil.Eventually(t, "three regenerations requested and at most two run", func() bool {
		s, ok := reg.Get(path)
		return ok && s.Endpoint.DesiredRevision == 4 && s.Endpoint.RealizedRevision == 4 && s.State == "ready"
	})
	s, _ := reg.Get(path)
	e := s.Endpoint
	if e.ID != ep.ID || e.RegenerationsRun+e.RegenerationsCoalesced != 4 || e.RegenerationsRun < 2 || e.LastRegeneration.IsZero() {
		t.Fatalf("endpoint snapshot %+v", e)
	}
	if e.LastPhases[3] < e.LastPhases[1] {
		t.Errorf("total %v shorter than realize %v", e.LastPhases[3], e.LastPhases[1])
	}
	if s.Kind != KindEndpoint || s.Processed < 4 || s.Operation != "" || !s.BusySince().IsZero() {
		t.Errorf("snapshot %+v", s)
	}

	sys.Actors.Root.Send(svPID(sys, ep.ID), &crashForTest{})
	testutil.Eventually(t, "the restart in the snapshot", func() bool {
		s, ok := reg.Get(path)
		return ok && s.Restarts == 1 && strings.Contains(s.LastError, "crash requested") && s.State == "ready"
	})
	sys.Actors.Root.Send(sys.ipam, &crashForTest{})
	testutil.Eventually(t, "the IPAM restart in its snapshot", func() bool {
		s, ok := reg.Get(sys.ipam.Id)
		return ok && s.Restarts == 1 && strings.Contains(s.LastError, "crash requested")
	})

	res := svAsk(t, sys, sys.endpoints, &messages.DeleteEndpoint{ID: ep.ID}).(*messages.EndpointResult)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	testutil.Eventually(t, "the snapshot gone with the actor", func() bool { _, ok := reg.Get(path); return !ok && reg.Len() == 10 })
	if _, depth := reg.MailboxByKind(); len(depth) != 10 {
		t.Errorf("mailbox kinds %v", depth)
	}
	var types []string
	all := hub.Subscribe(1) // the history after event 1
	defer all.Close()
	for {
		ev, ok := all.TryNext()
		if !ok {
			break
		}
		types = append(types, string(ev.Type))
	}
	got := strings.Join(types, " ")
	if !strings.Contains(got, "identity-allocated") || !strings.HasSuffix(got, "endpoint-deleted") || strings.Count(got, "endpoint-deleted") != 1 {
		t.Errorf("events %s", got)
	}
}

func TestActorFilter(t *testing.T) {
	now := time.Now()
	ready := ActorSnapshot{Kind: KindEndpoint, State: "ready", MailboxDepth: 3, StateSince: now.Add(-time.Hour)}
	waiting := ActorSnapshot{Kind: KindEndpoint, State: "waiting-for-identity", StateSince: now.Add(-time.Minute)}
	busy := ActorSnapshot{Kind: KindIPAM, State: "running", Operation: "*messages.IPAMAllocate", OperationSince: now.Add(-2 * time.Second)}
	tests := []struct {
		name string
		f    ActorFilter
		want []bool // ready, waiting, busy
	}{
		{"all", ActorFilter{}, []bool{true, true, true}},
		{"kind", ActorFilter{Kind: KindEndpoint}, []bool{true, true, false}},
		{"state", ActorFilter{State: "ready"}, []bool{true, false, false}},
		{"mailbox", ActorFilter{MinMailbox: 2}, []bool{true, false, false}},
		{"stuck 30s: a waiting endpoint, not a ready one", ActorFilter{StuckFor: 30 * time.Second}, []bool{false, true, false}},
		{"stuck 1s: the busy actor too", ActorFilter{StuckFor: time.Second}, []bool{false, true, true}},
		{"stuck 2m", ActorFilter{StuckFor: 2 * time.Minute}, []bool{false, false, false}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for i, s := range []ActorSnapshot{ready, waiting, busy} {
				if got := tc.f.match(&s, now); got != tc.want[i] {
					t.Errorf("actor %d: match = %v, want %v", i, got, tc.want[i])
				}
			}
		})
	}
}

// TestRegistryOrder: the root, its children, then endpoints by ID;
// List copies what Visit lends.
func TestRegistryOrder(t *testing.T) {
	sys, _ := svSystem(t, nil)
	for _, n := range []string{"c", "a", "b"} {
		svCreate(t, sys, n)
	}
	var paths []string
	sys.Registry().Visit(ActorFilter{}, time.Now(), func(s *ActorSnapshot) { paths = append(paths, s.Path) })
	want := "agent agent/datapath agent/ipam agent/ipcache agent/policy agent/identity agent/gc agent/nodes agent/services agent/endpoints agent/endpoints/ep-1 agent/endpoints/ep-2 agent/endpoints/ep-3"
	if got := strings.Join(paths, " "); got != want {
		t.Fatalf("order %s\nwant  %s", got, want)
	}
	if list := sys.Registry().List(ActorFilter{Kind: KindEndpoint}, time.Now()); len(list) != 3 || list[0].Endpoint == list[1].Endpoint {
		t.Fatalf("List of endpoints: %d entries, endpoint parts shared: %v", len(list), len(list) > 1 && list[0].Endpoint == list[1].Endpoint)
	}
	if _, ok := sys.Registry().Get("agent/endpoints/ep-99"); ok {
		t.Fatal("Get of a missing endpoint actor succeeded")
	}
	if s, ok := sys.Registry().Get("agent"); !ok || s.Kind != KindAgent || s.Processed == 0 {
		t.Fatalf("root snapshot %+v %v", s, ok)
	}
}

// TestTrackedOperation: a non-endpoint actor's snapshot names the
// message it is handling, since when, and nothing once it is done.
func TestTrackedOperation(t *testing.T) {
	s := newSlot(KindIPAM, &MailboxStats{})
	var during ActorSnapshot
	before := time.Now()
	tracked := s.track(func() actor.Actor {
		return actor.ReceiveFunc(func(actor.Context) { during = s.snapshot() })
	})()
	for range 2 { // the second time through the interned name
		tracked.Receive(messageContext{msg: &messages.IPAMAllocate{}})
		if during.Operation != "*messages.IPAMAllocate" || during.OperationSince.Before(before.Add(-time.Second)) {
			t.Fatalf("during the message: operation %q since %v", during.Operation, during.OperationSince)
		}
		if after := s.snapshot(); after.Operation != "" {
			t.Fatalf("after the message: operation %q", after.Operation)
		}
	}
}

// messageContext is an actor.Context that only knows its message.
type messageContext struct {
	actor.Context
	msg any
}

func (c messageContext) Message() any { return c.msg }

// TestEndpointSlots: the registry's endpoint table costs its chunks,
// not 65,536 cells, and keeps slots across chunks in ID order through
// put, remove and lookups.
func TestEndpointSlots(t *testing.T) {
	if size := unsafe.Sizeof(Registry{}); size > 8<<10 {
		t.Errorf("a Registry is %d bytes, want a few KiB (endpoint chunks on first use)", size)
	}
	var r Registry
	ids := []endpoint.ID{endpoint.MaxID, 3, 300, 256, 255}
	for _, id := range ids {
		r.put(fmt.Sprintf("agent/endpoints/ep-%d", id), newSlot(KindEndpoint, &MailboxStats{}))
	}
	var got []string
	r.endpoints.each(func(s *actorSlot) { got = append(got, s.path) })
	if want := "agent/endpoints/ep-3 agent/endpoints/ep-255 agent/endpoints/ep-256 agent/endpoints/ep-300 agent/endpoints/ep-65535"; strings.Join(got, " ") != want {
		t.Fatalf("order %v, want %s", got, want)
	}
	r.remove("agent/endpoints/ep-256")
	r.remove("agent/endpoints/ep-4000") // never put: its chunk stays unallocated
	if r.slot("agent/endpoints/ep-256") != nil || r.slot("agent/endpoints/ep-255") == nil || r.endpointPID(4000) != nil {
		t.Fatal("remove or lookup wrong")
	}
	if n := r.Len(); n != 4 || r.live.Load() != 4 {
		t.Fatalf("Len %d live %d, want 4", n, r.live.Load())
	}
	chunks := 0
	for i := range r.endpoints.chunks {
		if r.endpoints.chunks[i].Load() != nil {
			chunks++
		}
	}
	if chunks != 3 {
		t.Errorf("%d chunks allocated, want 3 (0, 1 and 255)", chunks)
	}
}
