package kvstore_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/etcdtest"
)

// memSink is an in-memory agent: the ipcache's remote entries and the
// node set, as the front door's methods would keep them.
type memSink struct {
	mu    sync.Mutex
	ips   map[netip.Addr]endpoint.Remote
	nodes map[string]datapath.RemoteNode
	fail  bool // answer every call with an error
	calls int
	seen  map[netip.Addr]time.Time // first arrival of each address (after stamp)
}

// stamp starts recording when each address first arrives.
func (s *memSink) stamp() {
	s.mu.Lock()
	s.seen = map[netip.Addr]time.Time{}
	s.mu.Unlock()
}

func (s *memSink) firstSeen() map[netip.Addr]time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.seen)
}

func newMemSink() *memSink {
	return &memSink{ips: map[netip.Addr]endpoint.Remote{}, nodes: map[string]datapath.RemoteNode{}}
}

var errSinkDown = errors.New("sink down")

func (s *memSink) check(source string) error {
	s.calls++
	if source != kvstore.Source {
		return fmt.Errorf("source %q", source)
	}
	if s.fail {
		return errSinkDown
	}
	return nil
}

func (s *memSink) ReplaceRemoteEndpoints(_ context.Context, source string, eps []endpoint.Remote) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check(source); err != nil {
		return err
	}
	clear(s.ips)
	s.upsertLocked(eps)
	return nil
}

func (s *memSink) ChangeRemoteEndpoints(_ context.Context, source string, ups []endpoint.Remote, dels []netip.Addr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check(source); err != nil {
		return err
	}
	for _, ip := range dels {
		delete(s.ips, ip)
	}
	s.upsertLocked(ups)
	return nil
}

func (s *memSink) upsertLocked(eps []endpoint.Remote) {
	now := time.Now()
	for _, r := range eps {
		for _, ip := range r.IPs {
			s.ips[ip] = r
			if _, ok := s.seen[ip]; !ok && s.seen != nil {
				s.seen[ip] = now
			}
		}
	}
}

func (s *memSink) SyncNodes(_ context.Context, source string, nodes []datapath.RemoteNode) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check(source); err != nil {
		return err
	}
	clear(s.nodes)
	for _, n := range nodes {
		s.nodes[n.Name] = n
	}
	return nil
}

func (s *memSink) setFail(v bool) {
	s.mu.Lock()
	s.fail = v
	s.mu.Unlock()
}

// view returns ip -> identity and the node names.
func (s *memSink) view() (map[netip.Addr]identity.NumericIdentity, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ips := map[netip.Addr]identity.NumericIdentity{}
	for ip, r := range s.ips {
		ips[ip] = r.Identity
	}
	return ips, slices.Sorted(maps.Keys(s.nodes))
}

// fakeSource is a node's endpoint index: endpoints set by the test, the
// hub told about every change.
type fakeSource struct {
	mu  sync.Mutex
	eps map[endpoint.ID]*endpoint.Endpoint
	hub *events.Hub
}

func newFakeSource() *fakeSource {
	return &fakeSource{eps: map[endpoint.ID]*endpoint.Endpoint{}, hub: events.New(64)}
}

func (f *fakeSource) Endpoints(index.EndpointFilter) []*endpoint.Endpoint {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Collect(maps.Values(f.eps))
}

func (f *fakeSource) Endpoint(id endpoint.ID) (*endpoint.Endpoint, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ep, ok := f.eps[id]
	return ep, ok
}

func (f *fakeSource) set(id endpoint.ID, ip netip.Addr, ident identity.NumericIdentity, st endpoint.State) {
	f.mu.Lock()
	f.eps[id] = &endpoint.Endpoint{ID: id, IPv4: ip, Identity: ident, State: st}
	f.mu.Unlock()
	f.hub.Publish(events.Event{Type: events.EndpointStateChanged, Endpoint: uint16(id)})
}

func (f *fakeSource) remove(id endpoint.ID) {
	f.mu.Lock()
	delete(f.eps, id)
	f.mu.Unlock()
	f.hub.Publish(events.Event{Type: events.EndpointDeleted, Endpoint: uint16(id)})
}

// agentNode is one node's kvstore side: client, publisher, mirror.
type agentNode struct {
	name string
	c    *kvstore.Client
	src  *fakeSource
	pub  *kvstore.Publisher
	mir  *kvstore.Mirror
	sink *memSink
}

func startAgentNode(tb testing.TB, endpoint, name string, i int) *agentNode {
	tb.Helper()
	c := connect(tb, endpoint, name, nil)
	n := &agentNode{name: name, c: c, src: newFakeSource(), sink: newMemSink()}
	var err error
	n.pub, err = kvstore.StartPublisher(c, kvstore.PublisherConfig{
		Addrs:    []netip.Addr{netip.AddrFrom4([4]byte{192, 168, 77, byte(i + 1)})},
		PodCIDRs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i + 1), 0, 0}), 16)},
		Source:   n.src, Hub: n.src.hub, Coalesce: 5 * time.Millisecond,
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(n.pub.Stop)
	n.mir = kvstore.StartMirror(c, n.sink, n.sink)
	tb.Cleanup(n.mir.Stop)
	return n
}

func podIP(node, pod int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(node + 1), 0, byte(pod + 1)})
}

// expectView waits until every node's sink shows exactly the other
// nodes' ready endpoints and the other nodes.
func expectView(tb testing.TB, nodes []*agentNode, want map[netip.Addr]identity.NumericIdentity, owner map[netip.Addr]int, alive []int) {
	tb.Helper()
	for i, n := range nodes {
		if !slices.Contains(alive, i) {
			continue
		}
		wantIPs := map[netip.Addr]identity.NumericIdentity{}
		for ip, id := range want {
			if owner[ip] != i {
				wantIPs[ip] = id
			}
		}
		var wantNodes []string
		for _, j := range alive {
			if j != i {
				wantNodes = append(wantNodes, nodes[j].name)
			}
		}
		slices.Sort(wantNodes)
		testutil.Eventually(tb, n.name+" converged", func() bool {
			ips, names := n.sink.view()
			return maps.Equal(ips, wantIPs) && slices.Equal(names, wantNodes)
		})
	}
}

// TestMirrorConverges: three nodes publish endpoints; every node's agent
// gets exactly the others' endpoints and nodes; a node stopped without
// withdrawing anything loses its entries when its lease expires.
func TestMirrorConverges(t *testing.T) {
	srv := startEtcd(t)
	var nodes []*agentNode
	for i := range 3 {
		nodes = append(nodes, startAgentNode(t, srv.Endpoint, fmt.Sprintf("mirror-%d", i), i))
	}
	want, owner := map[netip.Addr]identity.NumericIdentity{}, map[netip.Addr]int{}
	for i, n := range nodes {
		for p := range 5 {
			id := identity.NumericIdentity(300 + p)
			n.src.set(endpoint.ID(p+1), podIP(i, p), id, endpoint.StateReady)
			want[podIP(i, p)], owner[podIP(i, p)] = id, i
		}
		// Not published: no identity yet, and disconnecting.
		n.src.set(50, podIP(i, 50), 0, endpoint.StateWaitingForIdentity)
		n.src.set(51, podIP(i, 51), 400, endpoint.StateDisconnecting)
	}
	expectView(t, nodes, want, owner, []int{0, 1, 2})

	// Churn: one endpoint goes, one changes identity.
	nodes[1].src.remove(1)
	delete(want, podIP(1, 0))
	nodes[2].src.set(2, podIP(2, 1), 999, endpoint.StateReady)
	want[podIP(2, 1)] = 999
	expectView(t, nodes, want, owner, []int{0, 1, 2})

	// Node 2's agent dies: nothing withdrawn; its lease expires.
	nodes[2].mir.Stop()
	nodes[2].pub.Stop()
	_ = nodes[2].c.Close()
	for ip, o := range owner {
		if o == 2 {
			delete(want, ip)
		}
	}
	expectView(t, nodes, want, owner, []int{0, 1})
	keys, bytes := countKeys(t, nodes[0].c.Etcd(), prefixOf(t)+"state/endpoints/v1/")
	t.Logf("%d endpoint keys, %d bytes (%.0f bytes per endpoint)", keys, bytes, float64(bytes)/float64(keys))
}

// TestMirrorRelistsAfterCompaction cuts one node off etcd, changes and
// deletes endpoints elsewhere, compacts the history past the cut node's
// watch, and restores the connection: the node re-lists and its agent
// drops what was deleted meanwhile (mark-and-sweep) and gains the new.
func TestMirrorRelistsAfterCompaction(t *testing.T) {
	srv := startEtcd(t)
	proxy := etcdtest.NewProxy(t, srv.Endpoint[len("http://"):])
	a := startAgentNode(t, srv.Endpoint, "compact-a", 0)
	b := startAgentNode(t, "http://"+proxy.Addr, "compact-b", 1)
	want, owner := map[netip.Addr]identity.NumericIdentity{}, map[netip.Addr]int{}
	for p := range 4 {
		a.src.set(endpoint.ID(p+1), podIP(0, p), 500, endpoint.StateReady)
		want[podIP(0, p)], owner[podIP(0, p)] = 500, 0
	}
	nodes := []*agentNode{a, b}
	expectView(t, nodes, want, owner, []int{0, 1})
	calls := b.sink.callsNow()

	proxy.Cut()
	a.src.remove(1)
	a.src.remove(2)
	delete(want, podIP(0, 0))
	delete(want, podIP(0, 1))
	a.src.set(9, podIP(0, 9), 501, endpoint.StateReady)
	want[podIP(0, 9)], owner[podIP(0, 9)] = 501, 0
	testutil.Eventually(t, "a published", func() bool { return a.pub.Stats().Published == 4 }) // node + 3 endpoints
	resp, err := a.c.Etcd().Get(context.Background(), "compaction-probe")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.Etcd().Compact(context.Background(), resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	proxy.Restore()
	expectView(t, nodes, want, owner, []int{0, 1})
	if b.sink.callsNow() == calls {
		t.Fatal("b's agent was not told anything after the cut")
	}
}

func (s *memSink) callsNow() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// TestMirrorRetriesFailedSink: an agent that refuses the hand-over gets
// the full set once it accepts again.
func TestMirrorRetriesFailedSink(t *testing.T) {
	srv := startEtcd(t)
	a := startAgentNode(t, srv.Endpoint, "retry-a", 0)
	b := startAgentNode(t, srv.Endpoint, "retry-b", 1)
	want, owner := map[netip.Addr]identity.NumericIdentity{podIP(0, 0): 600}, map[netip.Addr]int{podIP(0, 0): 0}
	a.src.set(1, podIP(0, 0), 600, endpoint.StateReady)
	expectView(t, []*agentNode{a, b}, want, owner, []int{0, 1})
	b.sink.setFail(true)
	a.src.set(2, podIP(0, 1), 601, endpoint.StateReady)
	want[podIP(0, 1)], owner[podIP(0, 1)] = 601, 0
	testutil.Eventually(t, "b's mirror saw the failure", func() bool { return b.mir.Stats().LastError != "" })
	b.sink.setFail(false)
	expectView(t, []*agentNode{a, b}, want, owner, []int{0, 1})
}

// TestMirrorCreateAndDeleteInOneResponse: an endpoint created and deleted
// while a node's watch was behind (its catch-up response carries both
// events) never reaches the node's agent.
func TestMirrorCreateAndDeleteInOneResponse(t *testing.T) {
	srv := startEtcd(t)
	proxy := etcdtest.NewProxy(t, srv.Endpoint[len("http://"):])
	n := startAgentNode(t, "http://"+proxy.Addr, "batch-a", 0)
	writer := connect(t, srv.Endpoint, "batch-w", nil)
	testutil.Eventually(t, "mirror synced", func() bool { return n.mir.Stats().Synced })
	p := prefixOf(t) + "state/endpoints/v1/other/"
	ctx := context.Background()
	put := func(k, v string) {
		if _, err := writer.Etcd().Put(ctx, p+k, v); err != nil {
			t.Fatal(err)
		}
	}
	// A node whose pod CIDR holds the addresses: its endpoints are believed.
	if _, err := writer.Etcd().Put(ctx, prefixOf(t)+"state/nodes/v1/other", `{"name":"other","addrs":["192.0.2.50"],"podCIDRs":["10.9.0.0/24"]}`); err != nil {
		t.Fatal(err)
	}
	put("0", `{"ips":["10.9.0.9"],"identity":299,"node":"other"}`)
	testutil.Eventually(t, "first endpoint", func() bool { ips, _ := n.sink.view(); return len(ips) == 1 })
	proxy.Cut()
	put("1", `{"ips":["10.9.0.1"],"identity":300,"node":"other"}`)
	put("2", `{"ips":["10.9.0.2"],"identity":301,"node":"other"}`)
	if _, err := writer.Etcd().Delete(ctx, p+"1"); err != nil {
		t.Fatal(err)
	}
	put("3", `{"ips":["10.9.0.3"],"identity":302,"node":"other"}`)
	proxy.Restore()
	want := map[netip.Addr]identity.NumericIdentity{netip.MustParseAddr("10.9.0.9"): 299,
		netip.MustParseAddr("10.9.0.2"): 301, netip.MustParseAddr("10.9.0.3"): 302}
	testutil.Eventually(t, "the agent holds what etcd holds", func() bool { ips, _ := n.sink.view(); return maps.Equal(ips, want) })
}

// TestPublisherComparesAllAfterEvents: the publisher writes what the
// events name, and a full comparison follows within FullEvery: a change
// the index holds without its event having named it (an event can come
// before the index commit) is published without waiting for the
// one-minute resync.
func TestPublisherComparesAllAfterEvents(t *testing.T) {
	srv := startEtcd(t)
	a := &agentNode{name: "pub-a", c: connect(t, srv.Endpoint, "pub-a", nil), src: newFakeSource()}
	pub, err := kvstore.StartPublisher(a.c, kvstore.PublisherConfig{Source: a.src, Hub: a.src.hub,
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}, // podIP(0, _): other nodes believe them
		Coalesce: 5 * time.Millisecond, Resync: time.Hour})             // only the comparison after events can find endpoint 2
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Stop)
	b := startAgentNode(t, srv.Endpoint, "pub-b", 1)
	a.src.set(1, podIP(0, 1), 300, endpoint.StateReady)
	testutil.Eventually(t, "endpoint 1 mirrored", func() bool { ips, _ := b.sink.view(); return ips[podIP(0, 1)] == 300 })
	a.src.mu.Lock() // endpoint 2 enters the index; its event is lost
	a.src.eps[2] = &endpoint.Endpoint{ID: 2, IPv4: podIP(0, 2), Identity: 301, State: endpoint.StateReady}
	a.src.mu.Unlock()
	a.src.set(3, podIP(0, 3), 302, endpoint.StateReady)
	testutil.Eventually(t, "endpoints 2 and 3 mirrored", func() bool {
		ips, _ := b.sink.view()
		return ips[podIP(0, 2)] == 301 && ips[podIP(0, 3)] == 302
	})
	a.src.remove(1)
	testutil.Eventually(t, "endpoint 1 withdrawn", func() bool { ips, _ := b.sink.view(); _, ok := ips[podIP(0, 1)]; return !ok })
}

// TestMirrorContestedAddress: an address that several endpoint records
// claim (a pod's address reused before the old record went) goes to the
// latest claim (the record written last); when a claim goes, the latest
// of the rest takes it back, whichever one went (the mirror keeps the
// earlier claims apart from the owner: heap per remote endpoint). A node
// record withdrawn and back, or written after its endpoints' records,
// hands the address to the latest claim again. The endpoint and node
// watches deliver in either order, so the first claims may also arrive
// before node other's record (the rehearsal's failure: the mirror then
// accepted them in a map's order; TestMirrorClaimsBeforeTheirNode).
func TestMirrorContestedAddress(t *testing.T) {
	srv := startEtcd(t)
	n := startAgentNode(t, srv.Endpoint, "contest-a", 0)
	writer := connect(t, srv.Endpoint, "contest-w", nil)
	testutil.Eventually(t, "mirror synced", func() bool { return n.mir.Stats().Synced })
	p := prefixOf(t) + "state/endpoints/v1/other/"
	ctx := context.Background()
	put := func(k, v string) {
		t.Helper()
		if _, err := writer.Etcd().Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	del := func(k string) {
		t.Helper()
		if _, err := writer.Etcd().Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	nodeKey, nodeVal := prefixOf(t)+"state/nodes/v1/other", `{"name":"other","addrs":["192.0.2.50"],"podCIDRs":["10.9.0.0/24"]}`
	put(nodeKey, nodeVal)
	put(prefixOf(t)+"state/nodes/v1/mark", `{"name":"mark","addrs":["192.0.2.51"],"podCIDRs":["10.8.0.0/24"]}`)
	a, b := netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("10.9.0.2")
	rec := func(ip netip.Addr, id int) string {
		return fmt.Sprintf(`{"ips":[%q],"identity":%d,"node":"other"}`, ip, id)
	}
	sentinel := 0
	// expect waits for the view, after node mark's endpoint written last
	// arrived (so that a step changing nothing is checked too).
	expect := func(what string, want map[netip.Addr]identity.NumericIdentity) {
		t.Helper()
		sentinel++
		s := netip.AddrFrom4([4]byte{10, 8, 0, byte(sentinel)})
		put(prefixOf(t)+"state/endpoints/v1/mark/1", fmt.Sprintf(`{"ips":[%q],"identity":%d}`, s, 400+sentinel)) // unnamed: its key's node
		want = maps.Clone(want)
		want[s] = identity.NumericIdentity(400 + sentinel)
		testutil.EventuallyErr(t, what, func() error {
			if ips, _ := n.sink.view(); !maps.Equal(ips, want) {
				return fmt.Errorf("sink holds %v, want %v; mirror: %s", ips, want, n.mir.Dump())
			}
			return nil
		})
	}
	put(p+"1", rec(a, 301))
	put(p+"2", rec(a, 302))
	put(p+"3", rec(a, 303))
	expect("the latest of three claims", map[netip.Addr]identity.NumericIdentity{a: 303})
	del(p + "2")
	expect("an earlier claim gone: the latest keeps it", map[netip.Addr]identity.NumericIdentity{a: 303})
	del(p + "3")
	expect("the latest gone: the one before takes it back", map[netip.Addr]identity.NumericIdentity{a: 301})
	put(p+"2", rec(a, 302))
	put(p+"2", rec(a, 305))
	expect("a new claim, then its change", map[netip.Addr]identity.NumericIdentity{a: 305})
	put(p+"1", rec(a, 306))
	expect("an earlier claim written again is the latest", map[netip.Addr]identity.NumericIdentity{a: 306})
	put(p+"1", rec(b, 307))
	expect("the latest claim moved to another address", map[netip.Addr]identity.NumericIdentity{a: 305, b: 307})
	put(p+"3", rec(a, 308))
	del(nodeKey)
	expect("node withdrawn: its claims too", map[netip.Addr]identity.NumericIdentity{})
	put(nodeKey, nodeVal)
	expect("node back: the latest claim", map[netip.Addr]identity.NumericIdentity{a: 308, b: 307})
	del(p + "3")
	expect("the latest gone: the earlier one", map[netip.Addr]identity.NumericIdentity{a: 305, b: 307})
	del(p + "2")
	expect("both claims on a gone", map[netip.Addr]identity.NumericIdentity{b: 307})
	// Claims written before their node's record: accepted together when
	// it arrives, the latest owns.
	late, c := prefixOf(t)+"state/endpoints/v1/late/", netip.MustParseAddr("10.7.0.1")
	for i := range 5 {
		put(late+fmt.Sprint(i+1), fmt.Sprintf(`{"ips":[%q],"identity":%d,"node":"late"}`, c, 311+i))
	}
	put(prefixOf(t)+"state/nodes/v1/late", `{"name":"late","addrs":["192.0.2.52"],"podCIDRs":["10.7.0.0/24"]}`)
	expect("claims before their node: the latest", map[netip.Addr]identity.NumericIdentity{b: 307, c: 315})
	if st := n.mir.Stats(); st.RemoteEndpoints != 7 {
		t.Fatalf("mirror holds %d records, want 7 (other/1, late's 5 and the sentinel)", st.RemoteEndpoints)
	}
}
