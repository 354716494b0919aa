package kvstore

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// gatedNodeSink counts node hand-overs; once held, a hand-over waits for
// release whatever its context says (a hung or saturated agent).
type gatedNodeSink struct {
	mu    sync.Mutex
	calls int
	last  []datapath.RemoteNode
	gate  chan struct{} // nil: not held
}

func (s *gatedNodeSink) SyncNodes(_ context.Context, _ string, nodes []datapath.RemoteNode) error {
	s.mu.Lock()
	s.calls++
	g := s.gate
	s.mu.Unlock()
	if g != nil {
		<-g
	}
	s.mu.Lock()
	s.last = nodes
	s.mu.Unlock()
	return nil
}

func (s *gatedNodeSink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// newNodeTest returns a mirror with node sink ns whose listers the test
// drives by hand, and its running node loop (not the send loop).
func newNodeTest(t *testing.T, ns *gatedNodeSink) *claimTest {
	c := &Client{cfg: Config{NodeName: "self", RequestTimeout: time.Second}, keys: keys{prefix: "p/"},
		log: slog.New(slog.DiscardHandler), ctx: context.Background()}
	sink := &claimSink{ips: map[netip.Addr]identity.NumericIdentity{}}
	m := newMirror(c, sink, ns)
	m.wg.Add(1)
	go func() { defer m.wg.Done(); m.nodeLoop() }()
	t.Cleanup(func() { m.stop(); m.wg.Wait() })
	return &claimTest{t: t, m: m, sink: sink}
}

// TestMirrorUnchangedNodeRecord: a node record written again as it was
// (its node writing everything again under a new lease) is no change:
// the node set is not handed over again and its endpoints are not
// checked again. Each such write cost every other agent a full node-set
// hand-over (O(nodes)) and a pass over its endpoints; with a short lease
// a busy cluster rewrote them all the time.
func TestMirrorUnchangedNodeRecord(t *testing.T) {
	ns := &gatedNodeSink{}
	ct := newNodeTest(t, ns)
	node := nodeKV("other", "10.9.0.0/24", 5)
	(*nodeLister)(ct.m).list([]*mvccpb.KeyValue{node})
	(*epLister)(ct.m).list(nil)
	testutil.Eventually(t, "the listed node set handed over", func() bool { return ns.count() == 1 })
	ct.epEvents(claimKV("other/1", claimed, 301, 10))
	ct.expect("the node's endpoint", map[netip.Addr]identity.NumericIdentity{claimed: 301})

	again := nodeKV("other", "10.9.0.0/24", 11) // the same record, a later revision
	ct.nodeEvent(again)
	ct.m.mu.Lock()
	sent := ct.m.nodeSent
	ct.m.mu.Unlock()
	if !sent || ns.count() != 1 {
		t.Fatalf("a node record written again unchanged: node set due again %v, hand-overs %d, want none after the first", !sent, ns.count())
	}
	// A real change is one.
	ct.nodeEvent(nodeKV("other", "10.8.0.0/24", 12))
	testutil.Eventually(t, "the changed node set handed over", func() bool { return ns.count() == 2 })
	ct.expect("the node's endpoint outside its new pod range: withdrawn", map[netip.Addr]identity.NumericIdentity{})
}

// TestMirrorNodeSinkDoesNotHoldWatches: while the agent does not take a
// node-set hand-over (its nodes actor busy or hung), the node watch
// keeps reading and the other nodes' endpoint changes still reach the
// ipcache. The node set was handed over from the node watch with the
// mirror's lock held: a slow hand-over held up both watches and every
// remote endpoint change behind them.
func TestMirrorNodeSinkDoesNotHoldWatches(t *testing.T) {
	ns := &gatedNodeSink{}
	ct := newNodeTest(t, ns)
	(*nodeLister)(ct.m).list([]*mvccpb.KeyValue{nodeKV("other", "10.9.0.0/24", 5)})
	(*epLister)(ct.m).list(nil)
	testutil.Eventually(t, "the listed node set handed over", func() bool { return ns.count() == 1 })

	gate := make(chan struct{})
	ns.mu.Lock()
	ns.gate = gate
	ns.mu.Unlock()
	defer close(gate)
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		ct.nodeEvent(nodeKV("third", "10.7.0.0/24", 6)) // a node joins: the hand-over hangs
		ct.epEvents(claimKV("other/1", claimed, 301, 7))
	}()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("the watches did not return within 10 s while the node sink hangs: they wait for the agent")
	}
	testutil.Eventually(t, "the node set's hand-over started", func() bool { return ns.count() == 2 })
	ct.expect("another node's endpoint while the node set's hand-over hangs", map[netip.Addr]identity.NumericIdentity{claimed: 301})
}

// TestMirrorUnchangedEndpointRecord: an endpoint record written again as
// it was (its node writing everything again under a new lease) is no
// change for the agent: nothing is queued for the ipcache. Each such
// write cost every other agent an ipcache update per endpoint of the
// node. A record written again that is not the latest claim of its
// address still takes it (the latest write wins).
func TestMirrorUnchangedEndpointRecord(t *testing.T) {
	ct := newClaimTest(t)
	ct.nodeEvent(nodeKV("other", "10.9.0.0/24", 5))
	ct.epEvents(claimKV("other/1", claimed, 301, 10))
	ct.expect("the endpoint", map[netip.Addr]identity.NumericIdentity{claimed: 301})

	ct.epEvents(claimKV("other/1", claimed, 301, 11)) // the same record, a later revision
	ct.m.mu.Lock()
	queued := len(ct.m.pending)
	ct.m.mu.Unlock()
	if queued != 0 {
		t.Fatalf("an endpoint record written again unchanged: %d addresses queued for the agent, want none", queued)
	}
	ct.expect("written again", map[netip.Addr]identity.NumericIdentity{claimed: 301})

	ct.epEvents(claimKV("other/2", claimed, 302, 12)) // a later claim of the address
	ct.expect("a later claim", map[netip.Addr]identity.NumericIdentity{claimed: 302})
	ct.epEvents(claimKV("other/1", claimed, 301, 13)) // the earlier one written again: now the latest
	ct.expect("the earlier claim written again is the latest", map[netip.Addr]identity.NumericIdentity{claimed: 301})
	ct.epDelete("other/1", 14)
	ct.expect("the latest gone: the one before", map[netip.Addr]identity.NumericIdentity{claimed: 302})
}
