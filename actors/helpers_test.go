package actors_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// waitTimeout bounds every wait for a condition or an answer. It is
// generous on purpose: tests share two cores with builds and -race.
const waitTimeout = 10 * time.Second

// Test ranges: big enough for every test, small enough to read.
var (
	testIPv4 = netip.MustParsePrefix("10.200.0.0/24")
	testIPv6 = netip.MustParsePrefix("fd00:200::/120")
)

// harness is a running actor system on a fresh index and fake datapath.
type harness struct {
	sys  *actors.System
	fake *datapath.Fake
	ix   *index.Index
}

// logWriter sends log lines to tb.Log until the test's cleanup ran, then
// drops them (actors may log after a test returned, which tb.Log forbids).
type logWriter struct {
	mu   sync.Mutex
	tb   testing.TB
	done bool
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.tb.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// testLogger returns a logger writing warnings and errors to tb.Log.
func testLogger(tb testing.TB) *slog.Logger {
	tb.Helper()
	w := &logWriter{tb: tb}
	tb.Cleanup(func() { // registered first, so it runs last
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// startSystem starts an actor system with both families configured and
// short retry delays; mutate (may be nil) adjusts the config first.
func startSystem(tb testing.TB, mutate func(*actors.Config)) *harness {
	tb.Helper()
	log := testLogger(tb)
	ix, err := index.New()
	if err != nil {
		tb.Fatal(err)
	}
	fake := datapath.NewFake(1)
	cfg := actors.Config{
		IPAM:     actors.IPAMConfig{IPv4: testIPv4, IPv6: testIPv6, Strategy: ipam.Sequential, Seed: 1},
		Pool:     actors.PoolConfig{Workers: 4},
		Endpoint: actors.EndpointConfig{RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond},
	}
	if mutate != nil {
		mutate(&cfg)
	}
	sys, err := actors.Start(cfg, ix, fake, log)
	if err != nil {
		tb.Fatalf("actors.Start: %v", err)
	}
	tb.Cleanup(sys.Stop)
	return &harness{sys: sys, fake: fake, ix: ix}
}

// askRaw sends msg to pid and waits for the answer.
func (h *harness) askRaw(tb testing.TB, pid *actor.PID, msg any) any {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	res, err := h.sys.AskForTest(ctx, pid, msg)
	if err != nil {
		tb.Fatalf("ask %s %T: %v", pid.Id, msg, err)
	}
	return res
}

// askAs sends msg to pid and type-asserts the answer.
func askAs[T any](tb testing.TB, h *harness, pid *actor.PID, msg any) T {
	tb.Helper()
	res := h.askRaw(tb, pid, msg)
	out, ok := res.(T)
	if !ok {
		tb.Fatalf("ask %s %T: answer %T, want %T", pid.Id, msg, res, out)
	}
	return out
}

// endpointCall sends an endpoint message to the manager and returns the
// result's endpoint and error.
func (h *harness) endpointCall(tb testing.TB, msg any) (*endpoint.Endpoint, error) {
	tb.Helper()
	r := askAs[*messages.EndpointResult](tb, h, h.sys.PIDForTest("endpoints"), msg)
	return r.Endpoint, r.Err
}

// create creates an endpoint from spec.
func (h *harness) create(tb testing.TB, spec *endpoint.Endpoint, sync bool) (*endpoint.Endpoint, error) {
	tb.Helper()
	return h.endpointCall(tb, &messages.CreateEndpoint{Spec: spec, Sync: sync})
}

// mustCreate creates an endpoint with a sync build and fails the test on error.
func (h *harness) mustCreate(tb testing.TB, spec *endpoint.Endpoint) *endpoint.Endpoint {
	tb.Helper()
	ep, err := h.create(tb, spec, true)
	if err != nil {
		tb.Fatalf("create %+v: %v", spec, err)
	}
	return ep
}

// remove deletes an endpoint and waits for the answer.
func (h *harness) remove(tb testing.TB, id endpoint.ID, opts endpoint.DeleteOptions) (*endpoint.Endpoint, error) {
	tb.Helper()
	return h.endpointCall(tb, &messages.DeleteEndpoint{ID: id, Options: opts})
}

// allocate asks IPAM for an address of family f.
func (h *harness) allocate(tb testing.TB, f ipam.Family, owner string) *messages.IPAMAllocated {
	tb.Helper()
	return askAs[*messages.IPAMAllocated](tb, h, h.sys.PIDForTest("ipam"), &messages.IPAMAllocate{Family: f, Owner: owner})
}

// mustAllocate allocates one address of f.
func (h *harness) mustAllocate(tb testing.TB, f ipam.Family, owner string) netip.Addr {
	tb.Helper()
	r := h.allocate(tb, f, owner)
	if r.Err != nil {
		tb.Fatalf("allocate %s for %s: %v", f, owner, r.Err)
	}
	if f == ipam.IPv6 {
		return r.IPv6
	}
	return r.IPv4
}

// actorsList returns the manager's children.
func (h *harness) actorsList(tb testing.TB) []actors.ActorInfo {
	tb.Helper()
	return askAs[[]actors.ActorInfo](tb, h, h.sys.PIDForTest("endpoints"), &actors.GetActorsForTest{})
}

// endpointPID returns the PID of an endpoint's actor, or nil.
func (h *harness) endpointPID(tb testing.TB, id endpoint.ID) *actor.PID {
	tb.Helper()
	for _, info := range h.actorsList(tb) {
		if info.Endpoint == id {
			return actor.NewPID(h.sys.Actors.Address(), info.PID)
		}
	}
	return nil
}

// handled returns how many user messages an endpoint's actor took from
// its mailbox.
func (h *harness) handled(tb testing.TB, id endpoint.ID) int64 {
	tb.Helper()
	for _, info := range h.actorsList(tb) {
		if info.Endpoint == id {
			return info.Handled
		}
	}
	tb.Fatalf("no actor for endpoint %d", id)
	return 0
}

// indexed returns the index row of an endpoint.
func (h *harness) indexed(id endpoint.ID) (*endpoint.Endpoint, bool) { return h.ix.Endpoint(id) }

// realizes returns how many Realize calls the fake completed.
func (h *harness) realizes() uint64 {
	_, n, _ := h.fake.Stats()
	return n
}

// waitState waits until the endpoint's index row is in state st.
func (h *harness) waitState(tb testing.TB, id endpoint.ID, st endpoint.State) *endpoint.Endpoint {
	tb.Helper()
	var ep *endpoint.Endpoint
	testutil.Eventually(tb, fmt.Sprintf("endpoint %d %s", id, st), func() bool {
		cur, ok := h.indexed(id)
		ep = cur
		return ok && cur.State == st
	})
	return ep
}

// waitGone waits until the endpoint's actor and index row are gone.
func (h *harness) waitGone(tb testing.TB, id endpoint.ID) {
	tb.Helper()
	testutil.Eventually(tb, fmt.Sprintf("endpoint %d gone", id), func() bool {
		_, ok := h.indexed(id)
		return !ok && h.endpointPID(tb, id) == nil
	})
}

func mustLabels(tb testing.TB, ss ...string) labels.Labels {
	tb.Helper()
	ls, err := labels.ParseSet(ss)
	if err != nil {
		tb.Fatalf("ParseSet(%q): %v", ss, err)
	}
	return ls
}

// podSpec returns a spec for pod ns/name with container ID cid and labels.
func podSpec(tb testing.TB, cid, ns, name string, ls ...string) *endpoint.Endpoint {
	tb.Helper()
	if len(ls) == 0 {
		ls = []string{"k8s:app=" + name}
	}
	return &endpoint.Endpoint{ContainerID: cid, Namespace: ns, PodName: name, Labels: mustLabels(tb, ls...)}
}

// future sends msg to pid with a reply future, as an HTTP handler would.
func (h *harness) future(pid *actor.PID, msg any) *actor.Future {
	return h.sys.Actors.Root.RequestFuture(pid, msg, waitTimeout)
}

// containsFold reports whether s contains sub, ignoring case.
func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}
