package index

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// newIndex returns an empty index.
func newIndex(tb testing.TB) *Index {
	tb.Helper()
	ix, err := New()
	if err != nil {
		tb.Fatalf("New() = %v", err)
	}
	return ix
}

// insert writes rows into table in one transaction.
func insert[T any](tb testing.TB, ix *Index, table string, rows ...T) {
	tb.Helper()
	txn := ix.WriteTxn()
	defer txn.Abort()
	for _, r := range rows {
		if err := Insert(txn, table, r); err != nil {
			tb.Fatalf("insert into %s: %v", table, err)
		}
	}
	txn.Commit()
}

func mustLabels(tb testing.TB, ss ...string) labels.Labels {
	tb.Helper()
	ls, err := labels.ParseSet(ss)
	if err != nil {
		tb.Fatalf("ParseSet(%q) = %v", ss, err)
	}
	return ls
}

func ids(eps []*endpoint.Endpoint) []endpoint.ID {
	out := make([]endpoint.ID, 0, len(eps))
	for _, ep := range eps {
		out = append(out, ep.ID)
	}
	return out
}

func TestSchema(t *testing.T) {
	s := Schema()
	if err := s.Validate(); err != nil {
		t.Fatalf("Schema().Validate() = %v", err)
	}
	tables := []string{TableEndpoints, TableIdentities, TableIPAM, TableIdentityLeases, TablePolicies, TablePolicyRevision, TablePolicyServices, TableIPCache, TableNodes, TableServices}
	if len(s.Tables) != len(tables) {
		t.Errorf("schema has %d tables, want %d", len(s.Tables), len(tables))
	}
	for _, name := range tables {
		t.Run(name, func(t *testing.T) {
			ts, ok := s.Tables[name]
			if !ok {
				t.Fatalf("table %s missing", name)
			}
			if ts.Name != name {
				t.Errorf("table %s named %q", name, ts.Name)
			}
			id, ok := ts.Indexes[IndexID]
			if !ok || !id.Unique || id.AllowMissing {
				t.Errorf("table %s: id index = %+v, want unique and required", name, id)
			}
			for key, idx := range ts.Indexes {
				if idx.Name != key {
					t.Errorf("table %s: index %q named %q", name, key, idx.Name)
				}
			}
		})
	}
	want := []string{IndexID, IndexContainerID, IndexIPv4, IndexIPv6, IndexPod, IndexIdentity}
	for _, name := range want {
		if _, ok := s.Tables[TableEndpoints].Indexes[name]; !ok {
			t.Errorf("endpoints table lacks index %q", name)
		}
	}
	// Not container-id: a container may have several attachments.
	for _, name := range []string{IndexIPv4, IndexIPv6} {
		if !s.Tables[TableEndpoints].Indexes[name].Unique {
			t.Errorf("endpoints index %q is not unique", name)
		}
	}
}

// fixture is a set of endpoints covering every index.
func fixture(tb testing.TB) []*endpoint.Endpoint {
	tb.Helper()
	web := mustLabels(tb, "k8s:app=web", "k8s:tier=fe")
	db := mustLabels(tb, "k8s:app=db")
	return []*endpoint.Endpoint{
		{ID: 30, ContainerID: "c30", Namespace: "ns", PodName: "web-1", Labels: web, Identity: 300,
			State: endpoint.StateReady, IPv4: netip.MustParseAddr("10.0.0.30"), IPv6: netip.MustParseAddr("fd00::30")},
		{ID: 5, ContainerID: "c5", Namespace: "ns", PodName: "web-0", Labels: web, Identity: 300,
			State: endpoint.StateRegenerating, IPv4: netip.MustParseAddr("10.0.0.5")},
		{ID: 12, ContainerID: "c12", Namespace: "ns2", PodName: "web-0", Labels: db, Identity: 301,
			State: endpoint.StateReady, IPv6: netip.MustParseAddr("fd00::12")},
		{ID: 7, ContainerID: "c7", Namespace: "ns", PodName: "db-0", Labels: db, Identity: 301,
			State: endpoint.StateWaitingForIdentity},
		{ID: 65535, Labels: db, State: endpoint.StateReady, Identity: 301},
		{ID: 1, ContainerID: "c1", Namespace: "n", PodName: "s", State: endpoint.StateDisconnecting, Identity: 302},
		// Two attachments of one container.
		{ID: 41, ContainerID: "c40", ContainerInterfaceName: "net1", Namespace: "m", PodName: "multi", State: endpoint.StateReady, Identity: 302},
		{ID: 40, ContainerID: "c40", ContainerInterfaceName: "eth0", Namespace: "m", PodName: "multi", State: endpoint.StateReady, Identity: 302},
	}
}

func TestEndpointLookups(t *testing.T) {
	ix := newIndex(t)
	eps := fixture(t)
	insert(t, ix, TableEndpoints, eps...)

	tests := []struct {
		name   string
		lookup func() (*endpoint.Endpoint, bool)
		want   endpoint.ID // 0: not found
	}{
		{"id", func() (*endpoint.Endpoint, bool) { return ix.Endpoint(5) }, 5},
		{"id max", func() (*endpoint.Endpoint, bool) { return ix.Endpoint(65535) }, 65535},
		{"id missing", func() (*endpoint.Endpoint, bool) { return ix.Endpoint(6) }, 0},
		{"container", func() (*endpoint.Endpoint, bool) { return ix.EndpointByContainerID("c12") }, 12},
		{"container missing", func() (*endpoint.Endpoint, bool) { return ix.EndpointByContainerID("c") }, 0},
		{"container prefix is not a match", func() (*endpoint.Endpoint, bool) { return ix.EndpointByContainerID("c3") }, 0},
		{"container of two attachments: lowest id", func() (*endpoint.Endpoint, bool) { return ix.EndpointByContainerID("c40") }, 40},
		{"attachment eth0", func() (*endpoint.Endpoint, bool) { return ix.EndpointByAttachment("c40", "eth0") }, 40},
		{"attachment net1", func() (*endpoint.Endpoint, bool) { return ix.EndpointByAttachment("c40", "net1") }, 41},
		{"attachment missing interface", func() (*endpoint.Endpoint, bool) { return ix.EndpointByAttachment("c40", "net2") }, 0},
		{"attachment of a prefix", func() (*endpoint.Endpoint, bool) { return ix.EndpointByAttachment("c4", "eth0") }, 0},
		{"ipv4", func() (*endpoint.Endpoint, bool) { return ix.EndpointByIP(netip.MustParseAddr("10.0.0.5")) }, 5},
		{"ipv4 mapped", func() (*endpoint.Endpoint, bool) { return ix.EndpointByIP(netip.MustParseAddr("::ffff:10.0.0.30")) }, 30},
		{"ipv4 missing", func() (*endpoint.Endpoint, bool) { return ix.EndpointByIP(netip.MustParseAddr("10.0.0.6")) }, 0},
		{"ipv6", func() (*endpoint.Endpoint, bool) { return ix.EndpointByIP(netip.MustParseAddr("fd00::12")) }, 12},
		{"ipv6 missing", func() (*endpoint.Endpoint, bool) { return ix.EndpointByIP(netip.MustParseAddr("fd00::5")) }, 0},
		{"invalid ip", func() (*endpoint.Endpoint, bool) { return ix.EndpointByIP(netip.Addr{}) }, 0},
		{"pod", func() (*endpoint.Endpoint, bool) { return ix.EndpointByPod("ns", "web-0") }, 5},
		{"pod other namespace", func() (*endpoint.Endpoint, bool) { return ix.EndpointByPod("ns2", "web-0") }, 12},
		{"pod prefix is not a match", func() (*endpoint.Endpoint, bool) { return ix.EndpointByPod("ns", "web") }, 0},
		{"pod namespace prefix is not a match", func() (*endpoint.Endpoint, bool) { return ix.EndpointByPod("n", "web-0") }, 0},
		{"resolve id", func() (*endpoint.Endpoint, bool) { return ix.Resolve(endpoint.Ref{Kind: endpoint.RefID, ID: 7}) }, 7},
		{"resolve container", func() (*endpoint.Endpoint, bool) {
			return ix.Resolve(endpoint.Ref{Kind: endpoint.RefContainerID, ContainerID: "c30"})
		}, 30},
		{"resolve pod", func() (*endpoint.Endpoint, bool) {
			return ix.Resolve(endpoint.Ref{Kind: endpoint.RefPodName, Namespace: "ns", PodName: "db-0"})
		}, 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := tt.lookup()
			switch {
			case tt.want == 0 && ok:
				t.Fatalf("found endpoint %d, want none", got.ID)
			case tt.want != 0 && !ok:
				t.Fatalf("not found, want endpoint %d", tt.want)
			case ok && got.ID != tt.want:
				t.Fatalf("found endpoint %d, want %d", got.ID, tt.want)
			}
		})
	}
}

func TestEndpointsFilter(t *testing.T) {
	ix := newIndex(t)
	insert(t, ix, TableEndpoints, fixture(t)...)
	tests := []struct {
		name string
		f    EndpointFilter
		want []endpoint.ID
	}{
		{"all", EndpointFilter{}, []endpoint.ID{1, 5, 7, 12, 30, 40, 41, 65535}},
		{"namespace", EndpointFilter{Namespace: "ns"}, []endpoint.ID{5, 7, 30}},
		{"namespace is not a prefix match", EndpointFilter{Namespace: "n"}, []endpoint.ID{1}},
		{"namespace ns2", EndpointFilter{Namespace: "ns2"}, []endpoint.ID{12}},
		{"namespace missing", EndpointFilter{Namespace: "nope"}, nil},
		{"pod", EndpointFilter{Namespace: "ns", PodName: "web-0"}, []endpoint.ID{5}},
		{"pod prefix", EndpointFilter{Namespace: "ns", PodName: "web"}, nil},
		{"state", EndpointFilter{State: endpoint.StateReady}, []endpoint.ID{12, 30, 40, 41, 65535}},
		{"state none match", EndpointFilter{State: endpoint.StateRestoring}, nil},
		{"identity", EndpointFilter{Identity: 301}, []endpoint.ID{7, 12, 65535}},
		{"identity and state", EndpointFilter{Identity: 301, State: endpoint.StateReady}, []endpoint.ID{12, 65535}},
		{"namespace and state", EndpointFilter{Namespace: "ns", State: endpoint.StateReady}, []endpoint.ID{30}},
		{"label", EndpointFilter{Labels: mustLabels(t, "k8s:app=web")}, []endpoint.ID{5, 30}},
		{"labels all required", EndpointFilter{Labels: mustLabels(t, "k8s:app=web", "k8s:tier=be")}, nil},
		{"any-source label", EndpointFilter{Labels: mustLabels(t, "any:app=db")}, []endpoint.ID{7, 12, 65535}},
		{"label and namespace", EndpointFilter{Namespace: "ns", Labels: mustLabels(t, "k8s:app=db")}, []endpoint.ID{7}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ids(ix.Endpoints(tt.f))
			if len(got) == 0 && len(tt.want) == 0 {
				return
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("Endpoints(%+v) = %v, want %v", tt.f, got, tt.want)
			}
		})
	}
}

func TestEndpointsSortedByID(t *testing.T) {
	ix := newIndex(t)
	var eps []*endpoint.Endpoint
	// Pod names sort in the opposite order of the IDs, so the pod index
	// yields them in reverse.
	for i := 1; i <= 200; i++ {
		eps = append(eps, &endpoint.Endpoint{ID: endpoint.ID(i * 97 % 65521), Namespace: "ns",
			PodName: fmt.Sprintf("p%05d", 1000-i), State: endpoint.StateReady, Identity: 400})
	}
	insert(t, ix, TableEndpoints, eps...)
	for _, f := range []EndpointFilter{{}, {Namespace: "ns"}, {State: endpoint.StateReady}, {Identity: 400}} {
		got := ids(ix.Endpoints(f))
		if len(got) != len(eps) {
			t.Fatalf("Endpoints(%+v) returned %d, want %d", f, len(got), len(eps))
		}
		if !slices.IsSorted(got) {
			t.Fatalf("Endpoints(%+v) not sorted by ID: %v", f, got)
		}
	}
}

func TestEndpointRequiresState(t *testing.T) {
	// The manager always sets a state before inserting; a row without one
	// is refused (its identity index key is missing).
	ix := newIndex(t)
	txn := ix.WriteTxn()
	defer txn.Abort()
	if err := Insert(txn, TableEndpoints, &endpoint.Endpoint{ID: 1}); err == nil {
		t.Fatalf("inserting an endpoint without a state succeeded")
	}
}

func TestEndpointUpdateMovesIndexes(t *testing.T) {
	ix := newIndex(t)
	ep := &endpoint.Endpoint{ID: 9, ContainerID: "old", State: endpoint.StateWaitingForIdentity, IPv4: netip.MustParseAddr("10.0.0.9")}
	insert(t, ix, TableEndpoints, ep)
	next := ep.Clone()
	next.ContainerID, next.State, next.Identity, next.IPv4 = "new", endpoint.StateReady, 500, netip.MustParseAddr("10.0.0.10")
	insert(t, ix, TableEndpoints, next)
	if _, ok := ix.EndpointByContainerID("old"); ok {
		t.Errorf("old container id still indexed")
	}
	if _, ok := ix.EndpointByIP(netip.MustParseAddr("10.0.0.9")); ok {
		t.Errorf("old address still indexed")
	}
	if got := ids(ix.Endpoints(EndpointFilter{State: endpoint.StateWaitingForIdentity})); len(got) != 0 {
		t.Errorf("old state still indexed: %v", got)
	}
	if got, ok := ix.EndpointByContainerID("new"); !ok || got.State != endpoint.StateReady {
		t.Errorf("EndpointByContainerID(new) = %+v, %v", got, ok)
	}
	total, byState := ix.CountEndpoints()
	if total != 1 || byState[endpoint.StateReady] != 1 {
		t.Errorf("CountEndpoints() = %d, %v", total, byState)
	}
}

func TestIdentities(t *testing.T) {
	ix := newIndex(t)
	web := mustLabels(t, "k8s:app=web")
	webFE := mustLabels(t, "k8s:app=web", "k8s:tier=fe")
	insert(t, ix, TableIdentities,
		&Identity{ID: 300, Labels: webFE, Key: webFE.Key(), RefCount: 2},
		&Identity{ID: 257, Labels: web, Key: web.Key(), RefCount: 1})
	if got, ok := ix.Identity(257); !ok || got.RefCount != 1 {
		t.Errorf("Identity(257) = %+v, %v", got, ok)
	}
	if _, ok := ix.Identity(258); ok {
		t.Errorf("Identity(258) found")
	}
	if got, ok := ix.IdentityByLabels(web); !ok || got.ID != 257 {
		t.Errorf("IdentityByLabels(%s) = %+v, %v; want 257", web, got, ok)
	}
	if got, ok := ix.IdentityByLabels(webFE); !ok || got.ID != 300 {
		t.Errorf("IdentityByLabels(%s) = %+v, %v; want 300", webFE, got, ok)
	}
	if got, ok := ix.IdentityByLabels(mustLabels(t, "k8s:app=we")); ok {
		t.Errorf("IdentityByLabels(prefix) = %+v, want none", got)
	}
	all := ix.Identities()
	if len(all) != 2 || all[0].ID != 257 || all[1].ID != 300 {
		t.Errorf("Identities() = %+v, want 257, 300", all)
	}
}

func TestIdentityLeases(t *testing.T) {
	ix := newIndex(t)
	insert(t, ix, TableIdentityLeases,
		&IdentityLease{ID: 300, Holder: "/agent/endpoints/ep-1"},
		&IdentityLease{ID: 300, Holder: "/agent/endpoints/ep-10"},
		&IdentityLease{ID: 301, Holder: "/agent/endpoints/ep-1"})
	if got := ix.IdentityLeases(); len(got) != 3 {
		t.Fatalf("IdentityLeases() = %d rows, want 3", len(got))
	}
	// Deleting by object removes exactly that lease, not one whose key it prefixes.
	txn := ix.WriteTxn()
	if err := txn.Delete(TableIdentityLeases, &IdentityLease{ID: 300, Holder: "/agent/endpoints/ep-1"}); err != nil {
		txn.Abort()
		t.Fatal(err)
	}
	txn.Commit()
	got := ix.IdentityLeases()
	if len(got) != 2 {
		t.Fatalf("after delete: %d rows, want 2", len(got))
	}
	for _, l := range got {
		if l.ID == 300 && l.Holder == "/agent/endpoints/ep-1" {
			t.Errorf("deleted lease still present")
		}
	}
	if LeaseKey(300, "h") != "300|h" {
		t.Errorf("LeaseKey(300, h) = %q", LeaseKey(300, "h"))
	}
}

func TestIPAMTable(t *testing.T) {
	ix := newIndex(t)
	rows := []*IP{
		{IP: netip.MustParseAddr("10.0.0.3"), Family: "ipv4", Owner: "ns/web-1", Endpoint: 3, Holder: "/agent/endpoints/ep-3"},
		{IP: netip.MustParseAddr("10.0.0.2"), Family: "ipv4", Owner: "ns/web"},
		{IP: netip.MustParseAddr("fd00::2"), Family: "ipv6", Owner: "ns/web"},
		{IP: netip.MustParseAddr("10.0.0.4"), Family: "ipv4"},
	}
	insert(t, ix, TableIPAM, rows...)
	tests := []struct {
		name string
		got  func() []*IP
		want []string
	}{
		{"all", func() []*IP { return ix.IPs("") }, []string{"10.0.0.2", "10.0.0.3", "10.0.0.4", "fd00::2"}},
		{"ipv4", func() []*IP { return ix.IPs("ipv4") }, []string{"10.0.0.2", "10.0.0.3", "10.0.0.4"}},
		{"ipv6", func() []*IP { return ix.IPs("ipv6") }, []string{"fd00::2"}},
		{"unknown family", func() []*IP { return ix.IPs("ipv5") }, nil},
		{"owner", func() []*IP { return ix.IPsByOwner("ns/web-1") }, []string{"10.0.0.3"}},
		// "ns/web" is a prefix of "ns/web-1": an owner lookup must be exact.
		{"owner exact", func() []*IP { return ix.IPsByOwner("ns/web") }, []string{"10.0.0.2", "fd00::2"}},
		{"owner missing", func() []*IP { return ix.IPsByOwner("ns/we") }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, r := range tt.got() {
				got = append(got, r.IP.String())
			}
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
	if r, ok := ix.IP(netip.MustParseAddr("::ffff:10.0.0.3")); !ok || r.Endpoint != 3 {
		t.Errorf("IP(mapped 10.0.0.3) = %+v, %v", r, ok)
	}
	if _, ok := ix.IP(netip.MustParseAddr("10.0.0.9")); ok {
		t.Errorf("IP(10.0.0.9) found")
	}
	// A 4-byte IPv4 key must not match a 16-byte IPv6 key it prefixes
	// (a00:2::/32 starts with the bytes of 10.0.0.2).
	insert(t, ix, TableIPAM, &IP{IP: netip.MustParseAddr("a00:5::1"), Family: "ipv6"})
	if r, ok := ix.IP(netip.MustParseAddr("10.0.0.5")); ok {
		t.Errorf("IP(10.0.0.5) = %v, want none", r.IP)
	}
}

func TestLookupWrongArgumentType(t *testing.T) {
	ix := newIndex(t)
	insert(t, ix, TableEndpoints, &endpoint.Endpoint{ID: 1, State: endpoint.StateReady})
	txn := ix.ReadTxn()
	for _, tc := range []struct {
		table, index string
		arg          any
	}{
		{TableEndpoints, IndexID, "1"},
		{TableEndpoints, IndexContainerID, 1},
		{TableEndpoints, IndexIPv4, "10.0.0.1"},
		{TableEndpoints, IndexIPv4, netip.Addr{}},
		{TableEndpoints, IndexIdentity, 1},
		{TableIdentities, IndexID, uint16(1)},
	} {
		if _, err := txn.First(tc.table, tc.index, tc.arg); err == nil {
			t.Errorf("First(%s, %s, %T) = nil error, want a type error", tc.table, tc.index, tc.arg)
		}
	}
	if _, err := txn.First(TableEndpoints, IndexID, endpoint.ID(1), endpoint.ID(2)); err == nil {
		t.Errorf("First with two arguments = nil error")
	}
	if _, err := txn.Get(TableEndpoints, IndexPod+"_prefix", 1); err == nil {
		t.Errorf("prefix Get with an int = nil error")
	}
	if got, ok := ix.Endpoint(1); !ok || got.ID != 1 {
		t.Errorf("Endpoint(1) = %+v, %v", got, ok)
	}
}

// TestNoWatches: the index runs on the patched radix tree without
// mutation channels. A watch channel is nil, so code that tried to watch
// would wait forever: this test keeps that property visible.
func TestNoWatches(t *testing.T) {
	ix := newIndex(t)
	ep := &endpoint.Endpoint{ID: 1, ContainerID: "c1", State: endpoint.StateReady}
	insert(t, ix, TableEndpoints, ep)
	txn := ix.ReadTxn()
	defer txn.Abort()
	watch, obj, err := txn.FirstWatch(TableEndpoints, IndexID, ep.ID)
	if err != nil || obj == nil {
		t.Fatalf("FirstWatch: %v, %v", obj, err)
	}
	if watch != nil {
		t.Fatal("the index has a watch channel: go.mod no longer uses third_party/go-immutable-radix?")
	}
	it, err := txn.Get(TableEndpoints, IndexID)
	if err != nil {
		t.Fatal(err)
	}
	if it.WatchCh() != nil {
		t.Fatal("an iterator has a watch channel")
	}
}
