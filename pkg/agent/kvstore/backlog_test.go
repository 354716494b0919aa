package kvstore_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// stallSink is a memSink whose endpoint hand-overs can be held: a hung
// or saturated agent. A held call waits for release, whatever its
// context says.
type stallSink struct {
	*memSink
	mu      sync.Mutex
	gate    chan struct{} // nil: not held
	blocked int           // calls waiting at the gate
}

func (s *stallSink) hold() {
	s.mu.Lock()
	s.gate = make(chan struct{})
	s.mu.Unlock()
}

func (s *stallSink) release() {
	s.mu.Lock()
	if s.gate != nil {
		close(s.gate)
		s.gate = nil
	}
	s.mu.Unlock()
}

func (s *stallSink) wait() {
	s.mu.Lock()
	g := s.gate
	if g != nil {
		s.blocked++
	}
	s.mu.Unlock()
	if g != nil {
		<-g
	}
}

func (s *stallSink) waiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.blocked
}

func (s *stallSink) ReplaceRemoteEndpoints(ctx context.Context, source string, eps []endpoint.Remote) error {
	s.wait()
	return s.memSink.ReplaceRemoteEndpoints(ctx, source, eps)
}

func (s *stallSink) ChangeRemoteEndpoints(ctx context.Context, source string, ups []endpoint.Remote, dels []netip.Addr) error {
	s.wait()
	return s.memSink.ChangeRemoteEndpoints(ctx, source, ups, dels)
}

// statsWithin returns the mirror's stats, or fails the test when they
// take longer than 5 s (the mirror's lock held by a caller that waits
// for the agent).
func statsWithin(t *testing.T, m *kvstore.Mirror) kvstore.MirrorStats {
	t.Helper()
	ch := make(chan kvstore.MirrorStats, 1)
	go func() { ch <- m.Stats() }()
	select {
	case st := <-ch:
		return st
	case <-time.After(5 * time.Second):
		t.Fatal("the mirror's Stats did not answer within 5 s while the agent stalls: status and metrics wait for the remote path")
		return kvstore.MirrorStats{}
	}
}

// TestMirrorQueuesWhileAgentStalled: the agent stops taking remote
// endpoint changes (a hung ipcache). The mirror keeps reading etcd, its
// stats keep answering (GET /v1/status and the metrics read them) and say
// how much waits and for how long; many changes to one address queue as
// one. Once the agent takes changes again, it gets exactly etcd's state
// and the backlog is empty.
func TestMirrorQueuesWhileAgentStalled(t *testing.T) {
	srv := startEtcd(t)
	a := startAgentNode(t, srv.Endpoint, "stall-a", 0)
	// b: its mirror feeds a sink that can be held.
	c := connect(t, srv.Endpoint, "stall-b", nil)
	sink := &stallSink{memSink: newMemSink()}
	mir := kvstore.StartMirror(c, sink, sink)
	t.Cleanup(mir.Stop)
	t.Cleanup(sink.release) // before Stop: a held hand-over would keep it waiting
	want := map[netip.Addr]identity.NumericIdentity{}
	for p := range 3 {
		a.src.set(endpoint.ID(p+1), podIP(0, p), 300, endpoint.StateReady)
		want[podIP(0, p)] = 300
	}
	converged := func(what string) {
		t.Helper()
		testutil.Eventually(t, what, func() bool {
			ips, _ := sink.view()
			return fmt.Sprint(ips) == fmt.Sprint(want)
		})
	}
	converged("b holds a's endpoints")

	sink.hold()
	a.src.set(10, podIP(0, 10), 301, endpoint.StateReady) // the send loop takes it and hangs in the agent
	testutil.Eventually(t, "a hand-over held in the agent", func() bool { return sink.waiting() > 0 })
	// Meanwhile: 20 new endpoints, one endpoint relabelled 10 times, one
	// deleted.
	for p := 20; p < 40; p++ {
		a.src.set(endpoint.ID(p), podIP(0, p), 302, endpoint.StateReady)
		want[podIP(0, p)] = 302
	}
	for i := range 5 { // one at a time: a's publisher would merge them
		a.src.set(2, podIP(0, 1), identity.NumericIdentity(400+i), endpoint.StateReady)
		testutil.Eventually(t, fmt.Sprintf("relabel %d in etcd", i), func() bool {
			resp, err := a.c.Etcd().Get(context.Background(), prefixOf(t)+"state/endpoints/v1/stall-a/2")
			return err == nil && len(resp.Kvs) == 1 && strings.Contains(string(resp.Kvs[0].Value), fmt.Sprintf(`"identity":%d`, 400+i))
		})
	}
	want[podIP(0, 1)] = 404
	a.src.remove(3)
	delete(want, podIP(0, 2))
	want[podIP(0, 10)] = 301
	// 22 addresses wait behind the one in flight; the 5 relabels of one
	// address wait as one change.
	testutil.EventuallyErr(t, "b's backlog holds every change", func() error {
		if b := statsWithin(t, mir).Backlog; b.Pending != 1+22 || b.Behind <= 0 || b.Coalesced != 4 {
			return fmt.Errorf("backlog %+v", b)
		}
		return nil
	})
	st := statsWithin(t, mir)
	if ips, _ := sink.view(); len(ips) != 3 {
		t.Fatalf("the held agent took changes: %d addresses", len(ips))
	}
	t.Logf("held: %+v", st.Backlog)

	sink.release()
	converged("b caught up with a after the agent came back")
	testutil.Eventually(t, "b's backlog empty", func() bool {
		b := statsWithin(t, mir).Backlog
		return b.Pending == 0 && b.Behind == 0 && !b.Stale
	})
	st = statsWithin(t, mir)
	if st.Backlog.MaxBehind <= 0 || st.Backlog.MaxPending < 23 || st.Backlog.Applied == 0 {
		t.Fatalf("backlog after catching up: %+v", st.Backlog)
	}
	if st.LastError != "" {
		t.Fatalf("a held agent is no failure: %s", st.LastError)
	}
}

// TestMirrorQueueBounded: with the agent held, more addresses change than
// the queue holds: the queue is dropped for a full replacement (its
// memory stays bounded), and once released the agent gets exactly etcd's
// state.
func TestMirrorQueueBounded(t *testing.T) {
	kvstore.SetMaxPending(t, 5)
	srv := startEtcd(t)
	a := startAgentNode(t, srv.Endpoint, "bound-a", 0)
	c := connect(t, srv.Endpoint, "bound-b", nil)
	sink := &stallSink{memSink: newMemSink()}
	mir := kvstore.StartMirror(c, sink, sink)
	t.Cleanup(mir.Stop)
	t.Cleanup(sink.release)
	testutil.Eventually(t, "b synced", func() bool { return statsWithin(t, mir).Synced })
	sink.hold()
	want := map[netip.Addr]identity.NumericIdentity{}
	a.src.set(1, podIP(0, 1), 300, endpoint.StateReady)
	want[podIP(0, 1)] = 300
	testutil.Eventually(t, "a hand-over held in the agent", func() bool { return sink.waiting() > 0 })
	for p := 10; p < 30; p++ {
		a.src.set(endpoint.ID(p), podIP(0, p), 301, endpoint.StateReady)
		want[podIP(0, p)] = 301
	}
	testutil.EventuallyErr(t, "the queue overflowed into a full replacement", func() error {
		if b := statsWithin(t, mir).Backlog; !b.Stale || b.Overflows == 0 || b.Pending > 5+1 || b.Behind <= 0 {
			return fmt.Errorf("backlog %+v", b)
		}
		return nil
	})
	sink.release()
	testutil.Eventually(t, "b caught up", func() bool {
		ips, _ := sink.view()
		return fmt.Sprint(ips) == fmt.Sprint(want)
	})
	testutil.Eventually(t, "b's backlog empty", func() bool {
		b := statsWithin(t, mir).Backlog
		return b.Pending == 0 && !b.Stale && b.Behind == 0
	})
}
