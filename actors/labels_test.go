package actors_test

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// gateStore is a StateStore whose writes complete at once, or, while
// holding, only when the test releases them; it records what happened in
// order.
type gateStore struct {
	mu     sync.Mutex
	hold   bool
	held   []func(error)
	writes []labels.Labels // the labels of every write, in order
	events []string
	// removeErr fails every removal.
	removeErr error
}

func (g *gateStore) Write(ep *endpoint.Endpoint, done func(error)) {
	g.mu.Lock()
	g.writes = append(g.writes, ep.Labels)
	if g.hold {
		g.held = append(g.held, done)
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	done(nil)
}

func (g *gateStore) Remove(_ endpoint.ID, done func(error)) {
	g.mu.Lock()
	err := g.removeErr
	g.mu.Unlock()
	done(err)
}

func (g *gateStore) setHold(on bool) {
	g.mu.Lock()
	g.hold = on
	g.mu.Unlock()
}

func (g *gateStore) event(e string) {
	g.mu.Lock()
	g.events = append(g.events, e)
	g.mu.Unlock()
}

// heldWith reports whether a write carrying label l is held.
func (g *gateStore) heldWith(l labels.Label) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.held) > 0 && slices.Contains(g.writes[len(g.writes)-1], l)
}

// release completes the held writes (and stops holding).
func (g *gateStore) release() { g.complete(nil) }

// complete completes the held writes with err (and stops holding).
func (g *gateStore) complete(err error) {
	g.mu.Lock()
	held := g.held
	g.held, g.hold = nil, false
	g.events = append(g.events, "released")
	g.mu.Unlock()
	for _, done := range held {
		done(err)
	}
}

// answered sends f's endpoint result to out once it comes, recording
// the event "answered" first.
func (g *gateStore) answered(f *actor.Future, out chan<- *messages.EndpointResult) {
	go func() {
		res, err := f.Result()
		g.event("answered")
		r, _ := res.(*messages.EndpointResult)
		if err != nil {
			r = &messages.EndpointResult{Err: err}
		}
		out <- r
	}()
}

// heldWrites is how many writes are held.
func (g *gateStore) heldWrites() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.held)
}

// TestPatchLabelsAnswersWhenDurable: a PATCH of labels (and a repeated
// PATCH of the same labels meanwhile) answers only after a state write
// carrying the new labels is durable; a delete meanwhile answers the
// waiters with ErrEndpointDeleting.
func TestPatchLabelsAnswersWhenDurable(t *testing.T) {
	for _, deleteMeanwhile := range []bool{false, true} {
		name := map[bool]string{false: "durable", true: "deleted"}[deleteMeanwhile]
		t.Run(name, func(t *testing.T) {
			g := &gateStore{}
			h := startSystem(t, func(c *actors.Config) { c.State = g })
			ep := h.mustCreate(t, podSpec(t, "c-"+name, "default", "p", "k8s:app=web"))
			g.setHold(true)
			add := mustLabels(t, "k8s:tier=new")
			results := make(chan *messages.EndpointResult, 2)
			for range 2 {
				g.answered(h.future(h.sys.PIDForTest("endpoints"), &messages.PatchLabels{ID: ep.ID, Add: add}), results)
				testutil.Eventually(t, "a held write with the new labels", func() bool { return g.heldWith(add[0]) })
			}
			time.Sleep(lockedWindow) // an early answer would arrive now
			if deleteMeanwhile {
				del := h.future(h.sys.PIDForTest("endpoints"), &messages.DeleteEndpoint{ID: ep.ID})
				for range 2 {
					if r := <-results; !errors.Is(r.Err, actors.ErrEndpointDeleting) {
						t.Errorf("patch during delete: %v, want ErrEndpointDeleting", r.Err)
					}
				}
				g.release()
				if _, err := del.Result(); err != nil {
					t.Fatal(err)
				}
				return
			}
			g.release()
			for range 2 {
				r := <-results
				if r.Err != nil || !slices.Contains(r.Endpoint.Labels, add[0]) {
					t.Fatalf("patch: %+v", r)
				}
			}
			g.mu.Lock()
			events := slices.Clone(g.events)
			g.mu.Unlock()
			if want := []string{"released", "answered", "answered"}; !slices.Equal(events, want) {
				t.Fatalf("events %v, want %v (a PATCH answered before its labels were durable)", events, want)
			}
			// Durable now: the same PATCH answers without waiting.
			if _, err := h.endpointCall(t, &messages.PatchLabels{ID: ep.ID, Add: add}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPatchLabelsAsync: an Async PATCH (the Kubernetes watcher's)
// answers once the index has the new labels, while the state write that
// makes them durable is still held; the identity and the regeneration
// follow in the endpoint, and the write lands once released.
func TestPatchLabelsAsync(t *testing.T) {
	g := &gateStore{}
	h := startSystem(t, func(c *actors.Config) { c.State = g })
	ep := h.mustCreate(t, podSpec(t, "c-async", "default", "p", "k8s:app=web"))
	g.setHold(true)
	add := mustLabels(t, "k8s:tier=new")
	got, err := h.endpointCall(t, &messages.PatchLabels{ID: ep.ID, Add: add, Async: true})
	if err != nil || !slices.Contains(got.Labels, add[0]) {
		t.Fatalf("async patch: %+v, %v; want the new labels at once", got, err)
	}
	if ix, ok := h.indexed(ep.ID); !ok || !slices.Contains(ix.Labels, add[0]) {
		t.Fatalf("index after the async patch's answer: %+v (%v), want the new labels", ix, ok)
	}
	testutil.Eventually(t, "a held write with the new labels", func() bool { return g.heldWith(add[0]) })
	g.release()
	testutil.Eventually(t, "the new identity realised", func() bool {
		cur, ok := h.indexed(ep.ID)
		return ok && cur.State == endpoint.StateReady && cur.Identity != ep.Identity && slices.Contains(cur.Labels, add[0])
	})
}

// TestDeleteFailsWhenStateStays: a DELETE whose state removal fails is not
// acknowledged (the endpoint would come back at the next start).
func TestDeleteFailsWhenStateStays(t *testing.T) {
	g := &gateStore{}
	h := startSystem(t, func(c *actors.Config) { c.State = g })
	ep := h.mustCreate(t, podSpec(t, "c-del", "default", "p", "k8s:app=web"))
	errDisk := errors.New("disk on fire")
	g.mu.Lock()
	g.removeErr = errDisk
	g.mu.Unlock()
	if _, err := h.remove(t, ep.ID, endpoint.DeleteOptions{}); !errors.Is(err, actors.ErrStateStays) {
		t.Fatalf("delete: %v, want ErrStateStays", err)
	}
}
