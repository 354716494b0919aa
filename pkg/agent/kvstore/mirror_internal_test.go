package kvstore

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// claimSink is a RemoteSink keeping address -> identity.
type claimSink struct {
	mu  sync.Mutex
	ips map[netip.Addr]identity.NumericIdentity
	// changes counts the calls other than replacements.
	changes int
}

func (s *claimSink) ReplaceRemoteEndpoints(_ context.Context, _ string, eps []endpoint.Remote) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.ips)
	s.upsertLocked(eps)
	return nil
}

func (s *claimSink) upsertLocked(eps []endpoint.Remote) {
	for _, r := range eps {
		for _, ip := range r.IPs {
			s.ips[ip] = r.Identity
		}
	}
}

func (s *claimSink) ChangeRemoteEndpoints(_ context.Context, _ string, ups []endpoint.Remote, dels []netip.Addr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.changes++
	for _, ip := range dels {
		delete(s.ips, ip)
	}
	s.upsertLocked(ups)
	return nil
}

// claimTest drives a Mirror's listers by hand, as its watches would (no
// etcd, no goroutines), and its send loop's hand-overs before each check:
// the order of what arrives is the test's.
type claimTest struct {
	t    *testing.T
	m    *Mirror
	sink *claimSink
}

// newClaimTest returns a mirror that listed both prefixes empty.
func newClaimTest(t *testing.T) *claimTest {
	c := &Client{cfg: Config{NodeName: "self", RequestTimeout: time.Second}, keys: keys{prefix: "p/"},
		log: slog.New(slog.DiscardHandler), ctx: context.Background()}
	sink := &claimSink{ips: map[netip.Addr]identity.NumericIdentity{}}
	m := newMirror(c, sink, nil)
	t.Cleanup(m.stop)
	(*nodeLister)(m).list(nil)
	(*epLister)(m).list(nil)
	return &claimTest{t: t, m: m, sink: sink}
}

func nodeKV(name string, cidr string, rev int64) *mvccpb.KeyValue {
	return &mvccpb.KeyValue{Key: []byte("p/" + nodesDir + name), ModRevision: rev,
		Value: fmt.Appendf(nil, `{"name":%q,"addrs":["192.0.2.1"],"podCIDRs":[%q]}`, name, cidr)}
}

// claimKV is record key key's record claiming ip as identity id, written
// at rev.
func claimKV(key string, ip netip.Addr, id int, rev int64) *mvccpb.KeyValue {
	return &mvccpb.KeyValue{Key: []byte("p/" + endpointsDir + key), ModRevision: rev,
		Value: fmt.Appendf(nil, `{"ips":[%q],"identity":%d}`, ip, id)}
}

func (ct *claimTest) epEvents(kvs ...*mvccpb.KeyValue) {
	evs := make([]*clientv3.Event, len(kvs))
	for i, kv := range kvs {
		evs[i] = &clientv3.Event{Type: clientv3.EventTypePut, Kv: kv}
	}
	(*epLister)(ct.m).events(evs)
}

func (ct *claimTest) epDelete(key string, rev int64) {
	(*epLister)(ct.m).events([]*clientv3.Event{{Type: clientv3.EventTypeDelete,
		Kv: &mvccpb.KeyValue{Key: []byte("p/" + endpointsDir + key), ModRevision: rev}}})
}

func (ct *claimTest) nodeEvent(kv *mvccpb.KeyValue) {
	(*nodeLister)(ct.m).events([]*clientv3.Event{{Type: clientv3.EventTypePut, Kv: kv}})
}

func (ct *claimTest) expect(what string, want map[netip.Addr]identity.NumericIdentity) {
	ct.t.Helper()
	// The send loop's work, by hand: hand over whatever is queued.
	for {
		done, more := ct.m.send()
		if !done {
			ct.t.Fatalf("%s: the hand-over failed", what)
		}
		if !more {
			break
		}
	}
	ct.sink.mu.Lock()
	got := maps.Clone(ct.sink.ips)
	ct.sink.mu.Unlock()
	if !maps.Equal(got, want) {
		ct.t.Fatalf("%s: the agent holds %v, want %v; mirror: %s", what, got, want, ct.m.Dump())
	}
}

var claimed = netip.MustParseAddr("10.9.0.1")

// TestMirrorClaimsBeforeTheirNode: claims of one address whose records
// arrive before their node's (the endpoints and nodes are two watches,
// either may deliver first: TestMirrorContestedAddress's failure) go to
// the latest written once the node arrives, not to whichever the mirror
// happened to accept last.
func TestMirrorClaimsBeforeTheirNode(t *testing.T) {
	for trial := range 20 { // the accepting order was a map's: random
		ct := newClaimTest(t)
		for i := range 5 {
			ct.epEvents(claimKV(fmt.Sprintf("other/%d", i+1), claimed, 301+i, int64(10+i)))
		}
		ct.expect("claims of an unknown node", map[netip.Addr]identity.NumericIdentity{})
		ct.nodeEvent(nodeKV("other", "10.9.0.0/24", 20))
		ct.expect(fmt.Sprintf("trial %d: node arrived, the latest of five claims", trial), map[netip.Addr]identity.NumericIdentity{claimed: 305})
		ct.epDelete("other/5", 21)
		ct.expect("the latest gone: the one before", map[netip.Addr]identity.NumericIdentity{claimed: 304})
	}
}

// TestMirrorEarlierClaimAcceptedLater: a claim accepted once its node
// arrives does not take the address from a later claim of another node.
func TestMirrorEarlierClaimAcceptedLater(t *testing.T) {
	ct := newClaimTest(t)
	ct.nodeEvent(nodeKV("new", "10.9.0.0/24", 5))
	ct.epEvents(claimKV("old/1", claimed, 301, 10)) // the pod's old node: not known yet
	ct.epEvents(claimKV("new/1", claimed, 302, 11)) // the pod moved
	ct.expect("the new node's claim", map[netip.Addr]identity.NumericIdentity{claimed: 302})
	ct.nodeEvent(nodeKV("old", "10.9.0.0/24", 12))
	ct.expect("the old node arrived: its earlier claim is not the latest", map[netip.Addr]identity.NumericIdentity{claimed: 302})
	ct.epDelete("new/1", 13)
	ct.expect("the latest gone: the earlier one", map[netip.Addr]identity.NumericIdentity{claimed: 301})
}

// TestMirrorRelistKeepsLatestClaim: a re-list (etcd lists in key order)
// gives a contested address to the claim written last, as the watch did,
// not to the greatest key.
func TestMirrorRelistKeepsLatestClaim(t *testing.T) {
	ct := newClaimTest(t)
	node := nodeKV("other", "10.9.0.0/24", 5)
	ct.nodeEvent(node)
	claims := []*mvccpb.KeyValue{claimKV("other/3", claimed, 303, 10), claimKV("other/2", claimed, 302, 11), claimKV("other/1", claimed, 301, 12)}
	ct.epEvents(claims...)
	ct.expect("watched: the latest written", map[netip.Addr]identity.NumericIdentity{claimed: 301})
	(*nodeLister)(ct.m).list([]*mvccpb.KeyValue{node})
	(*epLister)(ct.m).list([]*mvccpb.KeyValue{claims[2], claims[1], claims[0]})
	ct.expect("listed again: the latest written still", map[netip.Addr]identity.NumericIdentity{claimed: 301})
	ct.epDelete("other/1", 13)
	ct.expect("the latest gone: the one written before", map[netip.Addr]identity.NumericIdentity{claimed: 302})
	// Two claims written in one transaction: the greater key, whichever
	// way they arrive.
	ct.epEvents(claimKV("other/4", claimed, 304, 14), claimKV("other/5", claimed, 305, 14))
	ct.expect("one transaction", map[netip.Addr]identity.NumericIdentity{claimed: 305})
	(*epLister)(ct.m).list([]*mvccpb.KeyValue{claimKV("other/5", claimed, 305, 14), claimKV("other/4", claimed, 304, 14)})
	ct.expect("one transaction, listed", map[netip.Addr]identity.NumericIdentity{claimed: 305})
}

// TestMirrorHandOverOneCall: a hand-over carrying deletions and upserts
// reaches the agent in one call (one ipcache pass, one index
// transaction), not a deletion and then an upsert.
func TestMirrorHandOverOneCall(t *testing.T) {
	ct := newClaimTest(t)
	ct.nodeEvent(nodeKV("other", "10.9.0.0/24", 10))
	ct.epEvents(claimKV("other/1", claimed, 301, 11))
	ct.expect("one endpoint", map[netip.Addr]identity.NumericIdentity{claimed: 301})
	next := netip.MustParseAddr("10.9.0.2")
	before := ct.sink.changes
	(*epLister)(ct.m).events([]*clientv3.Event{
		{Type: clientv3.EventTypeDelete, Kv: &mvccpb.KeyValue{Key: []byte("p/" + endpointsDir + "other/1"), ModRevision: 12}},
		{Type: clientv3.EventTypePut, Kv: claimKV("other/2", next, 302, 12)},
	})
	ct.expect("replaced", map[netip.Addr]identity.NumericIdentity{next: 302})
	if n := ct.sink.changes - before; n != 1 {
		t.Fatalf("a hand-over of a deletion and an upsert made %d calls, want 1", n)
	}
}
