package k8s

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// memSink is an in-memory RemoteSink: source -> address -> identity.
type memSink struct {
	mu       sync.Mutex
	ips      map[netip.Addr]identity.NumericIdentity
	replaces int
}

func (s *memSink) UpsertRemoteEndpoints(_ context.Context, _ string, eps []endpoint.Remote) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ep := range eps {
		for _, ip := range ep.IPs {
			s.ips[ip] = ep.Identity
		}
	}
	return nil
}

func (s *memSink) DeleteRemoteEndpoints(_ context.Context, _ string, ips []netip.Addr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ip := range ips {
		delete(s.ips, ip)
	}
	return nil
}

func (s *memSink) ReplaceRemoteEndpoints(ctx context.Context, src string, eps []endpoint.Remote) error {
	s.mu.Lock()
	s.ips = map[netip.Addr]identity.NumericIdentity{}
	s.replaces++
	s.mu.Unlock()
	return s.UpsertRemoteEndpoints(ctx, src, eps)
}

func mep(name, ip string, id int64) *unstructured.Unstructured {
	return mepOn(name, "n2", "n2", ip, "192.0.2.2", id)
}

// mepOn is a MembraneEndpoint labelled for node (no label when ""),
// whose status names statusNode and nodeIP.
func mepOn(name, node, statusNode, ip, nodeIP string, id int64) *unstructured.Unstructured {
	meta := map[string]any{"name": name, "namespace": "ns"}
	if node != "" {
		meta["labels"] = map[string]any{v2.EndpointNodeLabel: node}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"metadata": meta,
		"status": map[string]any{"identity": map[string]any{"id": id},
			"networking": map[string]any{"ipv4": ip, "nodeName": statusNode, "nodeIP": nodeIP}},
	}}
}

// memNodes is a node registry for the store's checks.
type memNodes struct {
	mu    sync.Mutex
	nodes map[string]*endpoint.OwnerNode
}

func (m *memNodes) set(name, cidr, addr string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cidr == "" {
		delete(m.nodes, name)
		return
	}
	m.nodes[name] = &endpoint.OwnerNode{Name: name, PodCIDRs: []netip.Prefix{netip.MustParsePrefix(cidr)},
		Addrs: []netip.Addr{netip.MustParseAddr(addr)}}
}

func (m *memNodes) lookup(name string) *endpoint.OwnerNode {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.nodes[name]
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestRemoteStoreRounds: the store turns reflector calls into sink calls
// round by round: a relist replaces, an address that moved to another
// object survives the old object's deletion, objects without identity or
// address claim nothing, a tombstone deletes.
func TestRemoteStoreRounds(t *testing.T) {
	sink := &memSink{ips: map[netip.Addr]identity.NumericIdentity{}}
	nodes := &memNodes{nodes: map[string]*endpoint.OwnerNode{}}
	nodes.set("n2", "10.9.0.0/24", "192.0.2.2")
	r := newRemoteEndpoints(sink, nodes.lookup, discard())
	ctx := context.Background()
	a, b := netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("10.9.0.2")
	steps := []struct {
		name string
		do   func()
		want map[netip.Addr]identity.NumericIdentity
	}{
		{"relist", func() {
			_ = r.Replace([]any{mep("x", "10.9.0.1", 1100), mep("bad", "", 1101), mep("none", "10.9.0.3", 0)}, "1")
		},
			map[netip.Addr]identity.NumericIdentity{a: 1100}},
		{"address moves to y", func() { _ = r.Add(mep("y", "10.9.0.1", 1200)) },
			map[netip.Addr]identity.NumericIdentity{a: 1200}},
		{"stale x deleted", func() { _ = r.Delete(mep("x", "10.9.0.1", 1100)) },
			map[netip.Addr]identity.NumericIdentity{a: 1200}},
		{"y changes address", func() { _ = r.Update(mep("y", "10.9.0.2", 1200)) },
			map[netip.Addr]identity.NumericIdentity{b: 1200}},
		{"y loses its identity", func() { _ = r.Update(mep("y", "10.9.0.2", 0)) },
			map[netip.Addr]identity.NumericIdentity{}},
		{"z added, then deleted by tombstone", func() {
			_ = r.Add(mep("z", "10.9.0.1", 1300))
			_ = r.Delete(cache.DeletedFinalStateUnknown{Key: "ns/z"})
		}, map[netip.Addr]identity.NumericIdentity{}},
	}
	for _, st := range steps {
		st.do()
		if err := r.round(ctx); err != nil {
			t.Fatalf("%s: round: %v", st.name, err)
		}
		sink.mu.Lock()
		got := sink.ips
		sink.mu.Unlock()
		if len(got) != len(st.want) {
			t.Fatalf("%s: sink holds %v, want %v", st.name, got, st.want)
		}
		for ip, id := range st.want {
			if got[ip] != id {
				t.Fatalf("%s: sink holds %v, want %v", st.name, got, st.want)
			}
		}
	}
	if n, synced := r.stats(); n != 0 || !synced || sink.replaces != 1 {
		t.Fatalf("stats %d %v, replaces %d; want 0 held, synced, one replacement", n, synced, sink.replaces)
	}
}

// TestRemoteStoreRefuses: a claim reaches the sink only when the node its
// label names is known, holds every claimed address in its pod CIDRs and
// owns the claimed node IP, and the identity is not reserved. The true
// owner of an address keeps it against a forged claim; a claim that came
// before its node is accepted when the node appears and withdrawn when
// the node loses the CIDR; each object's refusal is counted once per
// reason.
func TestRemoteStoreRefuses(t *testing.T) {
	sink := &memSink{ips: map[netip.Addr]identity.NumericIdentity{}}
	nodes := &memNodes{nodes: map[string]*endpoint.OwnerNode{}}
	nodes.set("n2", "10.9.0.0/24", "192.0.2.2")
	nodes.set("n3", "10.9.1.0/24", "192.0.2.3")
	r := newRemoteEndpoints(sink, nodes.lookup, discard())
	ctx := context.Background()
	ip := netip.MustParseAddr
	truth := map[netip.Addr]identity.NumericIdentity{ip("10.9.0.1"): 1100}
	steps := []struct {
		name string
		do   func()
		want map[netip.Addr]identity.NumericIdentity
	}{
		{"true owner", func() { _ = r.Replace([]any{mepOn("true", "n2", "n2", "10.9.0.1", "192.0.2.2", 1100)}, "1") }, truth},
		{"n3 claims n2's pod", func() { _ = r.Add(mepOn("f-cidr", "n3", "n3", "10.9.0.1", "192.0.2.3", 1666)) }, truth},
		{"forged again (not counted twice)", func() { _ = r.Update(mepOn("f-cidr", "n3", "n3", "10.9.0.1", "192.0.2.3", 1667)) }, truth},
		{"reserved identity", func() { _ = r.Add(mepOn("f-host", "n2", "n2", "10.9.0.5", "192.0.2.2", int64(identity.ReservedHost))) }, truth},
		{"no node label", func() { _ = r.Add(mepOn("f-nolabel", "", "n2", "10.9.0.6", "192.0.2.2", 1600)) }, truth},
		{"label and status disagree", func() { _ = r.Add(mepOn("f-status", "n2", "n3", "10.9.0.7", "192.0.2.2", 1600)) }, truth},
		{"another node's address as node IP", func() { _ = r.Add(mepOn("f-nodeip", "n2", "n2", "10.9.0.8", "192.0.2.3", 1600)) }, truth},
		{"unknown node", func() { _ = r.Add(mepOn("early", "n4", "n4", "10.9.2.1", "192.0.2.4", 1300)) }, truth},
		{"its node appears", func() { nodes.set("n4", "10.9.2.0/24", "192.0.2.4"); r.nodeChanged("n4") },
			map[netip.Addr]identity.NumericIdentity{ip("10.9.0.1"): 1100, ip("10.9.2.1"): 1300}},
		{"its node loses the CIDR", func() { nodes.set("n4", "10.9.3.0/24", "192.0.2.4"); r.nodeChanged("n4") }, truth},
		{"its node gets it back", func() { nodes.set("n4", "10.9.2.0/24", "192.0.2.4"); r.nodeChanged("n4") },
			map[netip.Addr]identity.NumericIdentity{ip("10.9.0.1"): 1100, ip("10.9.2.1"): 1300}},
		{"its node is deleted (withdrawn, not counted)", func() { nodes.set("n4", "", ""); r.nodeChanged("n4") }, truth},
		{"relist keeps the verdicts", func() {
			_ = r.Replace([]any{mepOn("true", "n2", "n2", "10.9.0.1", "192.0.2.2", 1100),
				mepOn("f-cidr", "n3", "n3", "10.9.0.1", "192.0.2.3", 1667)}, "2")
		}, truth},
		{"forged deleted: the true claim stays", func() { _ = r.Delete(mepOn("f-cidr", "n3", "n3", "10.9.0.1", "192.0.2.3", 1667)) }, truth},
	}
	for _, st := range steps {
		st.do()
		if err := r.round(ctx); err != nil {
			t.Fatalf("%s: round: %v", st.name, err)
		}
		sink.mu.Lock()
		got := maps.Clone(sink.ips)
		sink.mu.Unlock()
		if !maps.Equal(got, st.want) {
			t.Fatalf("%s: sink holds %v, want %v", st.name, got, st.want)
		}
	}
	want := map[string]uint64{endpoint.RefusedOutsideNode: 2, endpoint.RefusedReserved: 1, endpoint.RefusedNoOwner: 2,
		endpoint.RefusedNodeIP: 1, endpoint.RefusedUnknownNode: 1}
	if got := r.refused(); !maps.Equal(got, want) {
		t.Fatalf("refusals %v, want %v", got, want)
	}
	if sel := remoteSelector("n1"); sel != "membrane.io/node,membrane.io/node!=n1" {
		t.Fatalf("selector %q does not require the node label", sel)
	}
}

// TestRemoteStoreWaitsForNodes: objects listed before the node registry
// are held (nothing reaches the sink, nothing is refused) and checked
// once the registry is listed.
func TestRemoteStoreWaitsForNodes(t *testing.T) {
	sink := &memSink{ips: map[netip.Addr]identity.NumericIdentity{}}
	nodes := &memNodes{nodes: map[string]*endpoint.OwnerNode{}}
	nodes.set("n2", "10.9.0.0/24", "192.0.2.2")
	r := newRemoteEndpoints(sink, nodes.lookup, discard())
	r.ready = false // as run does until the Node cache synced
	_ = r.Replace([]any{mepOn("ok", "n2", "n2", "10.9.0.1", "192.0.2.2", 1100), mepOn("bad", "n2", "n2", "10.8.0.1", "192.0.2.2", 1101)}, "1")
	if err := r.round(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, synced := r.stats(); synced || sink.replaces != 0 || len(r.refused()) != 0 {
		t.Fatalf("before the nodes: synced %v, %d replaces, refusals %v; want nothing", synced, sink.replaces, r.refused())
	}
	r.nodesReady()
	if err := r.round(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := map[netip.Addr]identity.NumericIdentity{netip.MustParseAddr("10.9.0.1"): 1100}
	if !maps.Equal(sink.ips, want) || !maps.Equal(r.refused(), map[string]uint64{endpoint.RefusedOutsideNode: 1}) {
		t.Fatalf("after the nodes: sink %v, refusals %v", sink.ips, r.refused())
	}
}

// Issue #35: a MembraneEndpoint's status.namedPorts reach the remote
// endpoint once validated; an invalid list is left out.
func TestSlimPorts(t *testing.T) {
	got, err := slimPorts([]any{
		map[string]any{"name": "http", "port": int64(8080)},
		map[string]any{"name": "dns", "port": int64(53), "protocol": "UDP"},
	})
	if err != nil || got.String() != "dns/UDP=53,http/TCP=8080" {
		t.Fatalf("slimPorts = %s, %v", got, err)
	}
	for _, bad := range [][]any{
		{map[string]any{"name": "HTTP", "port": int64(80)}},
		{map[string]any{"name": "http", "port": int64(0)}},
		{map[string]any{"name": "http", "port": "80"}},
		{map[string]any{"name": "http", "port": int64(80), "protocol": "ICMP"}},
		{"http"},
	} {
		if _, err := slimPorts(bad); err == nil {
			t.Errorf("slimPorts(%v): accepted", bad)
		}
	}
}

// TestRemoteStoreTransformer: the reflector's own stores hold the slim
// form of each object (the watch-list's initial objects), not the
// object, and a Replace with them is the Replace with the objects.
func TestRemoteStoreTransformer(t *testing.T) {
	nodes := &memNodes{nodes: map[string]*endpoint.OwnerNode{}}
	nodes.set("n2", "10.9.0.0/24", "192.0.2.2")
	objs := []*unstructured.Unstructured{mep("x", "10.9.0.1", 1100), mep("none", "10.9.0.3", 0), mepOn("forged", "n2", "n2", "10.8.0.1", "192.0.2.2", 1102)}
	var tr cache.TransformFunc
	if ts, ok := any(newRemoteEndpoints(&memSink{}, nodes.lookup, discard())).(cache.TransformingStore); ok {
		tr = ts.Transformer()
	}
	if tr == nil {
		t.Fatal("the remote endpoints store gives the reflector no transformer: the watch-list holds whole objects")
	}
	held := cache.NewStore(cache.DeletionHandlingMetaNamespaceKeyFunc, cache.WithTransformer(tr))
	raw, slim := []any{}, []any{}
	for _, o := range objs {
		if err := held.Add(o); err != nil {
			t.Fatal(err)
		}
		raw = append(raw, o)
	}
	for _, o := range held.List() {
		if _, isU := o.(*unstructured.Unstructured); isU {
			t.Fatalf("the reflector's store holds %T", o)
		}
		slim = append(slim, o)
	}
	if x, ok, _ := held.GetByKey("ns/x"); !ok || x.(*slimObject).ep.ips[0] != netip.MustParseAddr("10.9.0.1") {
		t.Fatalf("ns/x held as %+v", x)
	}
	results := []map[netip.Addr]identity.NumericIdentity{}
	refused := []map[string]uint64{}
	for _, list := range [][]any{raw, slim} {
		sink := &memSink{ips: map[netip.Addr]identity.NumericIdentity{}}
		r := newRemoteEndpoints(sink, nodes.lookup, discard())
		if err := r.Replace(list, "1"); err != nil {
			t.Fatal(err)
		}
		if err := r.round(context.Background()); err != nil {
			t.Fatal(err)
		}
		results, refused = append(results, sink.ips), append(refused, r.refused())
	}
	if !maps.Equal(results[0], results[1]) || len(results[1]) != 1 || !maps.Equal(refused[0], refused[1]) {
		t.Fatalf("Replace with objects: %v (refused %v); with their slim forms: %v (refused %v)", results[0], refused[0], results[1], refused[1])
	}
}
