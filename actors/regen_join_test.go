package actors_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestCreateWritesAndRealizesAtOnce: a sync create's state write and its
// first realise run at once, and the create answers only once the state
// is durable. A failed write fails the create although the realise
// succeeded, and the teardown removes what the realise did.
func TestCreateWritesAndRealizesAtOnce(t *testing.T) {
	for _, fail := range []bool{false, true} {
		name := map[bool]string{false: "durable", true: "write-fails"}[fail]
		t.Run(name, func(t *testing.T) {
			g := &gateStore{hold: true}
			h := startSystem(t, func(c *actors.Config) { c.State = g })
			f := h.future(h.sys.PIDForTest("endpoints"), &messages.CreateEndpoint{
				Spec: podSpec(t, "c-join-"+name, "default", "p", "k8s:app=web"), Sync: true})
			answered := make(chan *messages.EndpointResult, 1)
			g.answered(f, answered)
			testutil.Eventually(t, "a realise while the state write is held", func() bool {
				return h.realizes() == 1 && g.heldWrites() == 1
			})
			// The realise is done: the actor shows the write it still waits for.
			testutil.Eventually(t, "the endpoint actor's operation write-state", func() bool {
				list := h.sys.Registry().List(actors.ActorFilter{Kind: actors.KindEndpoint}, time.Now())
				return len(list) == 1 && list[0].Operation == actors.PhaseWriteState
			})
			errDisk := errors.New("disk on fire")
			if !fail {
				errDisk = nil
			}
			g.complete(errDisk)
			r := <-answered
			g.mu.Lock()
			events := slices.Clone(g.events)
			g.mu.Unlock()
			if want := []string{"released", "answered"}; !slices.Equal(events, want) {
				t.Fatalf("events %v, want %v (the create answered before its state was durable)", events, want)
			}
			if !fail {
				if r.Err != nil {
					t.Fatalf("create: %v", r.Err)
				}
				checkReady(t, h, r.Endpoint)
				return
			}
			if !errors.Is(r.Err, actors.ErrStateWrite) || !errors.Is(r.Err, errDisk) {
				t.Fatalf("create with a failed state write: %v, want ErrStateWrite wrapping %v", r.Err, errDisk)
			}
			testutil.Eventually(t, "the realised endpoint removed from the datapath", func() bool {
				live, _, removes := h.fakeStats()
				return live == 0 && removes == 1
			})
			if rows := h.ix.EndpointsByContainerID("c-join-" + name); len(rows) != 0 {
				t.Fatalf("index holds %d endpoints after the failed create", len(rows))
			}
		})
	}
}
