package actors_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// gate is a BeforeRealize/BeforeRemove hook that holds operations until
// released, reporting each one that reaches it.
type gate struct {
	entered chan endpoint.ID
	release chan struct{}
}

func newGate(tb testing.TB) *gate {
	tb.Helper()
	g := &gate{entered: make(chan endpoint.ID, 1024), release: make(chan struct{})}
	tb.Cleanup(g.open) // never leave a worker blocked
	return g
}

func (g *gate) wait(ctx context.Context, id endpoint.ID) error {
	select {
	case g.entered <- id:
	default:
	}
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gate) realize(ctx context.Context, ep *endpoint.Endpoint, _ uint64) error {
	return g.wait(ctx, ep.ID)
}

func (g *gate) remove(ctx context.Context, ep *endpoint.Endpoint) error { return g.wait(ctx, ep.ID) }

// open releases every held and future operation (idempotent).
func (g *gate) open() {
	select {
	case <-g.release:
	default:
		close(g.release)
	}
}

// await waits until an operation of endpoint id reached the gate.
func (g *gate) await(tb testing.TB, id endpoint.ID) {
	tb.Helper()
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	for {
		select {
		case got := <-g.entered:
			if got == id {
				return
			}
		case <-timer.C:
			tb.Fatalf("no datapath operation of endpoint %d reached the gate", id)
		}
	}
}

// futureResult waits for a future and returns its EndpointResult.
func futureResult(tb testing.TB, f *actor.Future) (*messages.EndpointResult, error) {
	tb.Helper()
	res, err := f.Result()
	if err != nil {
		return nil, err
	}
	r, ok := res.(*messages.EndpointResult)
	if !ok {
		tb.Fatalf("answer %T, want *messages.EndpointResult", res)
	}
	return r, nil
}

func TestRegenerationCoalescing(t *testing.T) {
	h := startSystem(t, nil)
	ep := h.mustCreate(t, podSpec(t, "c-coal", "ns", "coal"))
	before := h.realizes()
	requested := h.sys.Counters().RegenerationsRequested

	g := newGate(t)
	h.fake.Set(datapath.FakeHooks{BeforeRealize: g.realize})
	first := h.future(h.sys.PIDForTest("endpoints"), &messages.Regenerate{ID: ep.ID, Reason: "first"})
	g.await(t, ep.ID)

	const n = 1000
	futures := make([]*actor.Future, n)
	for i := range futures {
		futures[i] = h.future(h.sys.PIDForTest("endpoints"), &messages.Regenerate{ID: ep.ID, Reason: "burst"})
	}
	// Every request reached the endpoint while the first one is held.
	testutil.Eventually(t, "the burst to reach the endpoint", func() bool {
		return h.sys.Counters().RegenerationsRequested >= requested+n+1
	})
	g.open()

	r, err := futureResult(t, first)
	if err != nil || r.Err != nil {
		t.Fatalf("first regeneration: %v / %+v", err, r)
	}
	var maxRealized uint64
	for i, f := range futures {
		r, err := futureResult(t, f)
		if err != nil {
			t.Fatalf("request %d got no answer: %v", i, err)
		}
		if r.Err != nil {
			t.Fatalf("request %d failed: %v", i, r.Err)
		}
		if r.Endpoint.RealizedRevision <= ep.RealizedRevision {
			t.Fatalf("request %d answered with revision %d, not newer than %d", i, r.Endpoint.RealizedRevision, ep.RealizedRevision)
		}
		maxRealized = max(maxRealized, r.Endpoint.RealizedRevision)
	}
	got := h.realizes() - before
	if got > 2 {
		t.Errorf("%d regenerations for 1 + %d coalescable requests, want at most 2", got, n)
	}
	if got < 2 {
		t.Errorf("%d regenerations: the pending one never ran", got)
	}
	final := h.waitState(t, ep.ID, endpoint.StateReady)
	if final.RealizedRevision != final.DesiredRevision || final.RealizedRevision != maxRealized {
		t.Errorf("final realized %d desired %d, answers saw %d", final.RealizedRevision, final.DesiredRevision, maxRealized)
	}
}

func TestProxyAcks(t *testing.T) {
	tests := []struct {
		name        string
		hooks       datapath.FakeHooks
		timeout     time.Duration // ProxyWaitTimeout
		wantTimeout bool
	}{
		// The delay lets the realize result reach the actor first; acks that
		// overtake it are TestProxyAckBeforeRealizeResult's subject.
		{"acked", datapath.FakeHooks{ProxyAcks: 2, ProxyAckDelay: 20 * time.Millisecond}, 5 * time.Second, false},
		{"acked by three", datapath.FakeHooks{ProxyAcks: 3, ProxyAckDelay: 20 * time.Millisecond}, 5 * time.Second, false},
		{"dropped", datapath.FakeHooks{ProxyAcks: 2, ProxyAckDelay: 5 * time.Millisecond, ProxyAckDropRate: 1}, 200 * time.Millisecond, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := startSystem(t, func(c *actors.Config) { c.Endpoint.ProxyWaitTimeout = tt.timeout })
			h.fake.Set(tt.hooks)
			timeouts := h.sys.Counters().ProxyTimeouts
			ep := h.mustCreate(t, podSpec(t, "c-proxy", "ns", "proxy"))
			checkReady(t, h, ep)
			got := h.sys.Counters().ProxyTimeouts - timeouts
			switch {
			case tt.wantTimeout && got != 1:
				t.Errorf("ProxyTimeouts rose by %d, want 1", got)
			case !tt.wantTimeout && got != 0:
				t.Errorf("ProxyTimeouts rose by %d, want 0: acknowledgements were lost", got)
			}
			if tt.wantTimeout && ep.LastError == "" {
				t.Errorf("LastError empty after a proxy timeout")
			}
			if !tt.wantTimeout && ep.LastError != "" {
				t.Errorf("LastError = %q", ep.LastError)
			}
		})
	}
}

// TestProxyAckBeforeRealizeResult: a proxy may acknowledge a revision
// before the endpoint actor has processed the datapath's answer for it
// (the proxy is faster than the BPF load). Such an acknowledgement counts.
func TestProxyAckBeforeRealizeResult(t *testing.T) {
	h := startSystem(t, func(c *actors.Config) { c.Endpoint.ProxyWaitTimeout = 3 * time.Second })
	ep := h.mustCreate(t, podSpec(t, "c-early", "ns", "early"))
	hookErr := make(chan error, 1)
	h.fake.Set(datapath.FakeHooks{ProxyAcks: 2, ProxyAckDropRate: 1, // the fake sends none itself
		BeforeRealize: func(ctx context.Context, e *endpoint.Endpoint, rev uint64) error {
			for _, p := range []string{"proxy-0", "proxy-1"} {
				h.sys.Actors.Root.Send(h.sys.PIDForTest("endpoints"), &messages.ProxyAck{ID: e.ID, Revision: rev, ProxyID: p})
			}
			// A no-op label patch takes the same route: once it is answered
			// the endpoint has processed both acknowledgements.
			_, err := h.sys.AskForTest(ctx, h.sys.PIDForTest("endpoints"), &messages.PatchLabels{ID: e.ID})
			hookErr <- err
			return err
		}})
	timeouts := h.sys.Counters().ProxyTimeouts
	got, err := h.endpointCall(t, &messages.Regenerate{ID: ep.ID, Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-hookErr; err != nil {
		t.Fatalf("hook: %v", err)
	}
	if n := h.sys.Counters().ProxyTimeouts - timeouts; n != 0 || got.LastError != "" {
		t.Fatalf("early acknowledgements ignored: %d proxy timeouts, last error %q", n, got.LastError)
	}
}

// TestProxyWaitDoesNotBlockMailbox: while an endpoint waits for proxy
// acknowledgements, its mailbox keeps serving; acknowledgements of a stale
// revision are ignored.
func TestProxyWaitDoesNotBlockMailbox(t *testing.T) {
	h := startSystem(t, func(c *actors.Config) { c.Endpoint.ProxyWaitTimeout = time.Minute })
	ep := h.mustCreate(t, podSpec(t, "c-wait", "ns", "wait"))
	h.fake.Set(datapath.FakeHooks{ProxyAcks: 2, ProxyAckDropRate: 1})
	regen := h.future(h.sys.PIDForTest("endpoints"), &messages.Regenerate{ID: ep.ID, Reason: "test"})
	var rev1 uint64
	testutil.Eventually(t, "the regeneration's realize", func() bool {
		rev, _ := h.fake.Realized(ep.ID)
		rev1 = rev
		return rev > ep.RealizedRevision
	})
	// Readers see the wait in the index.
	if cur := h.waitState(t, ep.ID, endpoint.StateRegenerating); cur.RealizedRevision != ep.RealizedRevision {
		t.Fatalf("realized revision %d before any acknowledgement, want %d", cur.RealizedRevision, ep.RealizedRevision)
	}

	// A label change is served (and answered) during the wait.
	patched, err := h.endpointCall(t, &messages.PatchLabels{ID: ep.ID, Add: mustLabels(t, "k8s:tier=new")})
	if err != nil {
		t.Fatalf("patch labels during a proxy wait: %v", err)
	}
	if patched.Identity == ep.Identity || patched.Identity < identity.MinLocalIdentity {
		t.Fatalf("patched identity %d (was %d)", patched.Identity, ep.Identity)
	}
	if patched.RealizedRevision != ep.RealizedRevision {
		t.Fatalf("patch answered realized revision %d, the wait has not ended", patched.RealizedRevision)
	}

	ack := func(rev uint64, proxy string) {
		h.sys.Actors.Root.Send(h.sys.PIDForTest("endpoints"), &messages.ProxyAck{ID: ep.ID, Revision: rev, ProxyID: proxy})
	}
	ack(rev1, "proxy-0")
	ack(rev1+1000, "proxy-1") // wrong revision: ignored
	// A no-op label patch is answered with the actor's current record, after
	// the acknowledgements above (same route, same order).
	cur, err := h.endpointCall(t, &messages.PatchLabels{ID: ep.ID})
	if err != nil {
		t.Fatal(err)
	}
	if cur.RealizedRevision != ep.RealizedRevision {
		t.Fatalf("one acknowledgement of two (and a stale one) completed the regeneration: %+v", cur)
	}
	ack(rev1, "proxy-1")
	if r, err := futureResult(t, regen); err != nil || r.Err != nil || r.Endpoint.RealizedRevision != rev1 {
		t.Fatalf("regenerate answered %v / %+v, want realized revision %d", err, r, rev1)
	}

	// The pending regeneration (new identity) now runs and waits in turn.
	var rev2 uint64
	testutil.Eventually(t, "the pending regeneration's realize", func() bool {
		rev, _ := h.fake.Realized(ep.ID)
		rev2 = rev
		return rev > rev1
	})
	ack(rev1, "proxy-0") // stale
	ack(rev1, "proxy-1") // stale
	ack(rev2, "proxy-0")
	cur, err = h.endpointCall(t, &messages.PatchLabels{ID: ep.ID})
	if err != nil {
		t.Fatal(err)
	}
	if cur.RealizedRevision != rev1 || cur.State != endpoint.StateRegenerating {
		t.Fatalf("after stale acks and one of two: realized %d state %s, want %d regenerating", cur.RealizedRevision, cur.State, rev1)
	}
	ack(rev2, "proxy-1")
	testutil.Eventually(t, "ready at the second revision", func() bool {
		cur, ok := h.indexed(ep.ID)
		return ok && cur.State == endpoint.StateReady && cur.RealizedRevision == rev2
	})
	final, _ := h.indexed(ep.ID)
	if final.Identity != patched.Identity {
		t.Errorf("final identity %d, want %d", final.Identity, patched.Identity)
	}
	if h.sys.Counters().ProxyTimeouts != 0 {
		t.Errorf("proxy timeouts counted with a one-minute timeout")
	}
}

// TestDeleteWaitsForProxyAcks: a delete during a proxy wait finishes once
// the wait ends (here by its timeout).
func TestDeleteWaitsForProxyAcks(t *testing.T) {
	h := startSystem(t, func(c *actors.Config) { c.Endpoint.ProxyWaitTimeout = 300 * time.Millisecond })
	ep := h.mustCreate(t, podSpec(t, "c-delwait", "ns", "delwait"))
	h.fake.Set(datapath.FakeHooks{ProxyAcks: 1, ProxyAckDropRate: 1})
	regen := h.future(h.sys.PIDForTest("endpoints"), &messages.Regenerate{ID: ep.ID, Reason: "test"})
	testutil.Eventually(t, "the regeneration's realize", func() bool {
		rev, _ := h.fake.Realized(ep.ID)
		return rev > ep.RealizedRevision
	})
	gone, err := h.remove(t, ep.ID, endpoint.DeleteOptions{})
	if err != nil {
		t.Fatalf("delete during a proxy wait: %v", err)
	}
	if gone.State != endpoint.StateDisconnected {
		t.Fatalf("delete answered state %s", gone.State)
	}
	// The running regeneration completed (by timeout) before the teardown.
	if r, err := futureResult(t, regen); err != nil || r.Err != nil {
		t.Errorf("regenerate answered %v / %+v", err, r)
	}
	if h.sys.Counters().ProxyTimeouts != 1 {
		t.Errorf("ProxyTimeouts = %d, want 1", h.sys.Counters().ProxyTimeouts)
	}
	h.waitGone(t, ep.ID)
}

func TestCreateFailsOnDatapathError(t *testing.T) {
	h := startSystem(t, nil)
	const owner = "ns/fail"
	ip := h.mustAllocate(t, ipam.IPv4, owner)
	h.fake.Set(datapath.FakeHooks{ErrorRate: 1})
	failed := h.sys.Counters().RegenerationsFailed

	spec := podSpec(t, "c-fail", "ns", "fail")
	spec.ID, spec.IPv4 = 77, ip
	_, err := h.create(t, spec, true)
	if !errors.Is(err, datapath.ErrInjected) {
		t.Fatalf("sync create = %v, want an error wrapping datapath.ErrInjected", err)
	}
	if h.sys.Counters().RegenerationsFailed <= failed {
		t.Errorf("RegenerationsFailed did not rise")
	}
	// The endpoint is removed before the answer...
	if _, ok := h.indexed(77); ok {
		t.Fatalf("failed endpoint still in the index")
	}
	if _, ok := h.ix.EndpointByContainerID("c-fail"); ok {
		t.Fatalf("failed endpoint's container still indexed")
	}
	h.waitGone(t, 77)
	if _, err := h.remove(t, 77, endpoint.DeleteOptions{}); !errors.Is(err, actors.ErrEndpointNotFound) {
		t.Fatalf("delete of the failed endpoint = %v, want ErrEndpointNotFound", err)
	}
	// ...but its address is not released: the caller owns it.
	testutil.Eventually(t, "the address unclaimed but kept for its owner", func() bool {
		row, ok := h.ix.IP(ip)
		return ok && row.Owner == owner && row.Endpoint == 0 && row.Holder == ""
	})
	// The caller can release it, then retry with a healthy datapath.
	if rel := askAs[*messages.IPAMReleased](t, h, h.sys.PIDForTest("ipam"), &messages.IPAMRelease{IP: ip}); rel.Err != nil || !rel.Released {
		t.Fatalf("release after failed create = %+v", rel)
	}
	h.fake.Set(datapath.FakeHooks{})
	ok2 := h.mustCreate(t, spec)
	checkReady(t, h, ok2)
}

func TestCreateFailsOnBeforeRealizeError(t *testing.T) {
	h := startSystem(t, nil)
	boom := errors.New("boom")
	h.fake.Set(datapath.FakeHooks{BeforeRealize: func(context.Context, *endpoint.Endpoint, uint64) error { return boom }})
	_, err := h.create(t, podSpec(t, "c-boom", "ns", "boom"), true)
	if !errors.Is(err, boom) {
		t.Fatalf("sync create = %v, want the hook's error", err)
	}
	if total, _ := h.ix.CountEndpoints(); total != 0 {
		t.Fatalf("%d endpoints left after a failed create", total)
	}
}

// TestRegenerationRetry: a later regeneration that fails is answered with
// the error and retried with backoff until it succeeds.
func TestRegenerationRetry(t *testing.T) {
	h := startSystem(t, nil)
	ep := h.mustCreate(t, podSpec(t, "c-retry", "ns", "retry"))
	h.fake.Set(datapath.FakeHooks{ErrorRate: 1})
	_, err := h.endpointCall(t, &messages.Regenerate{ID: ep.ID, Reason: "test"})
	if !errors.Is(err, datapath.ErrInjected) {
		t.Fatalf("regenerate = %v, want ErrInjected", err)
	}
	cur := h.waitState(t, ep.ID, endpoint.StateWaitingToRegenerate)
	if cur.LastError == "" {
		t.Errorf("LastError empty after a failed regeneration")
	}
	h.fake.Set(datapath.FakeHooks{})
	testutil.Eventually(t, "a successful retry", func() bool {
		cur, ok := h.indexed(ep.ID)
		return ok && cur.State == endpoint.StateReady && cur.RealizedRevision > ep.RealizedRevision && cur.LastError == ""
	})
}

func TestPatchLabels(t *testing.T) {
	h := startSystem(t, nil)
	a := h.mustCreate(t, podSpec(t, "c-a", "ns", "a", "k8s:app=shared"))
	b := h.mustCreate(t, podSpec(t, "c-b", "ns", "b", "k8s:app=shared"))
	if a.Identity != b.Identity {
		t.Fatalf("same labels, identities %d and %d", a.Identity, b.Identity)
	}
	shared := a.Identity
	if row, _ := h.ix.Identity(shared); row == nil || row.RefCount != 2 {
		t.Fatalf("shared identity row %+v, want refcount 2", row)
	}

	// a moves to a new label set: the shared identity keeps b's reference.
	got, err := h.endpointCall(t, &messages.PatchLabels{ID: a.ID, Add: mustLabels(t, "k8s:tier=fe")})
	if err != nil {
		t.Fatal(err)
	}
	if got.Identity == shared || got.Identity < identity.MinLocalIdentity {
		t.Fatalf("new identity %d (shared %d)", got.Identity, shared)
	}
	if !got.Labels.Equal(mustLabels(t, "k8s:app=shared", "k8s:tier=fe")) {
		t.Fatalf("labels %s", got.Labels)
	}
	testutil.Eventually(t, "shared identity refcount 1", func() bool {
		row, ok := h.ix.Identity(shared)
		return ok && row.RefCount == 1
	})
	testutil.Eventually(t, "a regenerated with the new identity", func() bool {
		cur, ok := h.indexed(a.ID)
		return ok && cur.State == endpoint.StateReady && cur.Identity == got.Identity &&
			cur.RealizedRevision > a.RealizedRevision && cur.RealizedRevision == cur.DesiredRevision
	})
	if rev, _ := h.fake.Realized(a.ID); rev <= a.RealizedRevision {
		t.Errorf("datapath revision %d, want newer than %d", rev, a.RealizedRevision)
	}

	// b drops its only label and takes another: the old identity is freed.
	got, err = h.endpointCall(t, &messages.PatchLabels{ID: b.ID, Delete: mustLabels(t, "k8s:app"), Add: mustLabels(t, "k8s:app=other")})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "shared identity freed", func() bool { _, ok := h.ix.Identity(shared); return !ok })
	testutil.Eventually(t, "b ready with its new identity", func() bool {
		cur, ok := h.indexed(b.ID)
		return ok && cur.State == endpoint.StateReady && cur.Identity == got.Identity && cur.RealizedRevision > b.RealizedRevision
	})

	// Back to a known label set: the existing identity is reused.
	back, err := h.endpointCall(t, &messages.PatchLabels{ID: b.ID, Add: mustLabels(t, "k8s:app=shared", "k8s:tier=fe")})
	if err != nil {
		t.Fatal(err)
	}
	if back.Identity != h.waitState(t, a.ID, endpoint.StateReady).Identity {
		t.Errorf("b with a's labels got identity %d, a has a different one", back.Identity)
	}

	// A no-op patch answers at once and changes nothing.
	before := h.waitState(t, b.ID, endpoint.StateReady)
	same, err := h.endpointCall(t, &messages.PatchLabels{ID: b.ID, Add: mustLabels(t, "k8s:app=shared")})
	if err != nil || same.Identity != before.Identity {
		t.Fatalf("no-op patch = %+v, %v", same, err)
	}
}

// TestRequestsWhileDeleting: label patches and regenerations of an endpoint
// being deleted are refused with ErrEndpointDeleting; a second delete waits
// for the first.
func TestRequestsWhileDeleting(t *testing.T) {
	h := startSystem(t, nil)
	ep := h.mustCreate(t, podSpec(t, "c-del", "ns", "del"))
	g := newGate(t)
	h.fake.Set(datapath.FakeHooks{BeforeRemove: g.remove})
	del1 := h.future(h.sys.PIDForTest("endpoints"), &messages.DeleteEndpoint{ID: ep.ID})
	g.await(t, ep.ID)

	tests := []struct {
		name string
		msg  any
	}{
		{"patch labels", &messages.PatchLabels{ID: ep.ID, Add: mustLabels(t, "k8s:x=y")}},
		{"regenerate", &messages.Regenerate{ID: ep.ID}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.endpointCall(t, tt.msg)
			if !errors.Is(err, actors.ErrEndpointDeleting) {
				t.Fatalf("answer %v, want ErrEndpointDeleting", err)
			}
		})
	}
	// A second delete joins the first once it reached the endpoint's mailbox
	// (sent later, it may find the endpoint gone: ErrEndpointNotFound).
	handled := h.handled(t, ep.ID)
	del2 := h.future(h.sys.PIDForTest("endpoints"), &messages.DeleteEndpoint{ID: ep.ID})
	testutil.Eventually(t, "the second delete to reach the endpoint", func() bool { return h.handled(t, ep.ID) > handled })
	g.open()
	for i, f := range []*actor.Future{del1, del2} {
		r, err := futureResult(t, f)
		if err != nil || r.Err != nil {
			t.Fatalf("delete %d: %v / %+v", i+1, err, r)
		}
		if r.Endpoint.State != endpoint.StateDisconnected {
			t.Errorf("delete %d answered state %s", i+1, r.Endpoint.State)
		}
	}
}

// TestDeleteDuringRegeneration: a delete that arrives while a regeneration
// runs waits for it; the regeneration's waiters get ErrEndpointDeleting and
// a sync create still waiting is answered.
func TestDeleteDuringRegeneration(t *testing.T) {
	h := startSystem(t, nil)
	g := newGate(t)
	h.fake.Set(datapath.FakeHooks{BeforeRealize: g.realize})
	create := h.future(h.sys.PIDForTest("endpoints"), &messages.CreateEndpoint{Spec: podSpec(t, "c-dr", "ns", "dr"), Sync: true})
	var id endpoint.ID
	select {
	case id = <-g.entered:
	case <-time.After(waitTimeout):
		t.Fatal("first regeneration never reached the datapath")
	}
	regen := h.future(h.sys.PIDForTest("endpoints"), &messages.Regenerate{ID: id})
	del := h.future(h.sys.PIDForTest("endpoints"), &messages.DeleteEndpoint{ID: id})
	// Both requests are queued behind the held realize; let it go.
	testutil.Eventually(t, "the requests to reach the endpoint", func() bool {
		cur, ok := h.indexed(id)
		return ok && cur.State == endpoint.StateDisconnecting
	})
	g.open()

	if r, err := futureResult(t, create); err != nil || !errors.Is(r.Err, actors.ErrEndpointDeleting) {
		t.Errorf("sync create answered %v / %+v, want ErrEndpointDeleting", err, r)
	}
	if r, err := futureResult(t, regen); err != nil || !errors.Is(r.Err, actors.ErrEndpointDeleting) {
		t.Errorf("regenerate answered %v / %+v, want ErrEndpointDeleting", err, r)
	}
	if r, err := futureResult(t, del); err != nil || r.Err != nil {
		t.Errorf("delete answered %v / %+v", err, r)
	}
	h.waitGone(t, id)
}

// TestIdentityRetryAfterExhaustion: an endpoint whose identity could not be
// allocated retries, and becomes ready once an identity frees up.
func TestIdentityRetryAfterExhaustion(t *testing.T) {
	h := startSystem(t, func(c *actors.Config) {
		c.Identity = identity.LocalConfig{MinID: 256, MaxID: 256} // one identity
	})
	a := h.mustCreate(t, podSpec(t, "c-a", "ns", "a"))
	// A sync create fails with the exhaustion.
	if _, err := h.create(t, podSpec(t, "c-sync", "ns", "sync"), true); !errors.Is(err, identity.ErrExhausted) {
		t.Fatalf("sync create without a free identity = %v, want identity.ErrExhausted", err)
	}
	// A non-sync create waits for an identity.
	b, err := h.create(t, podSpec(t, "c-b", "ns", "b"), false)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "b's identity failure recorded", func() bool {
		cur, ok := h.indexed(b.ID)
		return ok && cur.LastError != ""
	})
	if _, err := h.remove(t, a.ID, endpoint.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "b ready once an identity is free", func() bool {
		cur, ok := h.indexed(b.ID)
		return ok && cur.State == endpoint.StateReady && cur.Identity == 256
	})
}

// TestDeathWatch: an endpoint actor that stops without a delete loses its
// leases through the IPAM and identity actors' death-watch, and the manager
// forgets it.
func TestDeathWatch(t *testing.T) {
	h := startSystem(t, nil)
	ip := h.mustAllocate(t, ipam.IPv4, "ns/dead")
	spec := podSpec(t, "c-dead", "ns", "dead", "k8s:app=watch")
	spec.IPv4 = ip
	dead := h.mustCreate(t, spec)
	peer := h.mustCreate(t, podSpec(t, "c-peer", "ns", "peer", "k8s:app=watch"))
	only := h.mustCreate(t, podSpec(t, "c-only", "ns", "only", "k8s:app=alone"))
	if row, _ := h.ix.Identity(dead.Identity); row == nil || row.RefCount != 2 {
		t.Fatalf("shared identity row %+v, want refcount 2", row)
	}

	for _, ep := range []*endpoint.Endpoint{dead, only} {
		pid := h.endpointPID(t, ep.ID)
		if pid == nil {
			t.Fatalf("no actor for endpoint %d", ep.ID)
		}
		if err := h.sys.Actors.Root.StopFuture(pid).Wait(); err != nil {
			t.Fatalf("stop %s: %v", pid.Id, err)
		}
	}
	h.waitGone(t, dead.ID)
	h.waitGone(t, only.ID)
	testutil.Eventually(t, "the stopped actor's address released", func() bool { _, ok := h.ix.IP(ip); return !ok })
	testutil.Eventually(t, "the shared identity down to the peer's reference", func() bool {
		row, ok := h.ix.Identity(dead.Identity)
		return ok && row.RefCount == 1 && len(h.leasesOf(dead.Identity)) == 1
	})
	testutil.Eventually(t, "the unshared identity freed", func() bool {
		_, ok := h.ix.Identity(only.Identity)
		return !ok && len(h.leasesOf(only.Identity)) == 0
	})
	if _, ok := h.ix.EndpointByContainerID("c-dead"); ok {
		t.Errorf("container still indexed")
	}
	checkReady(t, h, h.waitState(t, peer.ID, endpoint.StateReady))

	// ID, container and address are free again.
	again := podSpec(t, "c-dead", "ns", "dead", "k8s:app=watch")
	again.ID, again.IPv4 = dead.ID, ip
	checkReady(t, h, h.mustCreate(t, again))
}
