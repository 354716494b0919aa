package actors_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

func remoteNode(name, addr string, cidrs ...string) datapath.RemoteNode {
	n := datapath.RemoteNode{Name: name, Addrs: []netip.Addr{netip.MustParseAddr(addr)}}
	for _, c := range cidrs {
		n.PodCIDRs = append(n.PodCIDRs, netip.MustParsePrefix(c))
	}
	return n
}

func nodeNames(ns []datapath.RemoteNode) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.Name+"@"+n.Addrs[0].String())
	}
	return out
}

// TestSyncNodesUnionOfSources: each source's set replaces only its own
// rows; the datapath gets the union, a node reported twice from the
// source first by name; the index shows every row with its active flag.
func TestSyncNodesUnionOfSources(t *testing.T) {
	h := startSystem(t, nil)
	ctx := context.Background()
	a := remoteNode("a", "192.0.2.1", "10.1.0.0/24")
	b := remoteNode("b", "192.0.2.2", "10.2.0.0/24", "fd00:2::/64")
	bFile := remoteNode("b", "192.0.2.22", "10.2.0.0/24")
	if err := h.sys.SyncNodes(ctx, "k8s", []datapath.RemoteNode{a, b}); err != nil {
		t.Fatal(err)
	}
	if err := h.sys.SyncNodes(ctx, "file", []datapath.RemoteNode{bFile}); err != nil {
		t.Fatal(err)
	}
	want := []string{"a@192.0.2.1", "b@192.0.2.22"} // "file" < "k8s"
	testutil.Eventually(t, "datapath union", func() bool {
		got, _ := h.fake.Nodes()
		return slices.Equal(nodeNames(got), want)
	})
	rows := h.ix.Nodes()
	var keys []string
	for _, r := range rows {
		k := r.Key()
		if r.Active {
			k += "*"
		}
		keys = append(keys, k)
	}
	if w := []string{"file/b*", "k8s/a*", "k8s/b"}; !slices.Equal(keys, w) {
		t.Fatalf("index rows %v, want %v", keys, w)
	}
	// k8s forgets a; file's b goes: k8s's b becomes active.
	if err := h.sys.SyncNodes(ctx, "k8s", []datapath.RemoteNode{b}); err != nil {
		t.Fatal(err)
	}
	if err := h.sys.SyncNodes(ctx, "file", nil); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "datapath after removal", func() bool {
		got, _ := h.fake.Nodes()
		return slices.Equal(nodeNames(got), []string{"b@192.0.2.2"})
	})
	if rows := h.ix.Nodes(); len(rows) != 1 || !rows[0].Active || rows[0].Source != "k8s" {
		t.Fatalf("index rows %+v, want k8s/b active", rows)
	}
}

// TestSyncNodesRefusesBadSets: a bad set is refused whole, naming the
// problem, and changes nothing.
func TestSyncNodesRefusesBadSets(t *testing.T) {
	h := startSystem(t, nil)
	ctx := context.Background()
	ok := remoteNode("a", "192.0.2.1", "10.1.0.0/24")
	if err := h.sys.SyncNodes(ctx, "file", []datapath.RemoteNode{ok}); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		source string
		nodes  []datapath.RemoteNode
		is     error
	}{
		"empty source":      {"", nil, nil},
		"slash in source":   {"a/b", nil, nil},
		"no name":           {"file", []datapath.RemoteNode{remoteNode("", "192.0.2.1", "10.1.0.0/24")}, datapath.ErrInvalidNode},
		"duplicate":         {"file", []datapath.RemoteNode{ok, ok}, datapath.ErrInvalidNode},
		"unmasked":          {"file", []datapath.RemoteNode{remoteNode("x", "192.0.2.1", "10.1.0.1/24")}, datapath.ErrInvalidNode},
		"two IPv4":          {"file", []datapath.RemoteNode{{Name: "w", Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.3"), netip.MustParseAddr("192.0.2.4")}}}, datapath.ErrInvalidNode},
		"multicast address": {"file", []datapath.RemoteNode{remoteNode("v", "224.0.0.1", "10.9.0.0/24")}, datapath.ErrInvalidNode},
	}
	for name, c := range cases {
		err := h.sys.SyncNodes(ctx, c.source, c.nodes)
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if c.is != nil && !errors.Is(err, c.is) {
			t.Errorf("%s: %v, want %v", name, err, c.is)
		}
	}
	if rows := h.ix.Nodes(); len(rows) != 1 || rows[0].Name != "a" {
		t.Fatalf("rows after refusals: %+v", rows)
	}
}

// TestSyncNodesRetriesFailedDatapath: a failing NodeRouter is retried
// until it takes the set; SyncNodes itself does not wait for it.
func TestSyncNodesRetriesFailedDatapath(t *testing.T) {
	h := startSystem(t, nil)
	fail := make(chan struct{})
	h.fake.Set(datapath.FakeHooks{BeforeSyncNodes: func(context.Context, []datapath.RemoteNode) error {
		select {
		case <-fail:
			return nil
		default:
			return datapath.ErrInjected
		}
	}})
	n := remoteNode("a", "192.0.2.1", "10.1.0.0/24")
	if err := h.sys.SyncNodes(context.Background(), "file", []datapath.RemoteNode{n}); err != nil {
		t.Fatal(err)
	}
	if rows := h.ix.Nodes(); len(rows) != 1 {
		t.Fatalf("index rows %+v, want 1 before the datapath took it", rows)
	}
	if got, _ := h.fake.Nodes(); len(got) != 0 {
		t.Fatalf("datapath took %v while failing", got)
	}
	close(fail)
	testutil.Eventually(t, "retried sync", func() bool {
		got, _ := h.fake.Nodes()
		return len(got) == 1
	})
}

// TestSyncNodesOverlapAcrossSources: two sources whose nodes claim
// overlapping pod CIDRs: the datapath gets the node first by name only.
func TestSyncNodesOverlapAcrossSources(t *testing.T) {
	h := startSystem(t, nil)
	ctx := context.Background()
	if err := h.sys.SyncNodes(ctx, "file", []datapath.RemoteNode{remoteNode("x", "192.0.2.1", "10.5.0.0/16")}); err != nil {
		t.Fatal(err)
	}
	if err := h.sys.SyncNodes(ctx, "k8s", []datapath.RemoteNode{remoteNode("y", "192.0.2.2", "10.5.1.0/24"), remoteNode("z", "192.0.2.3", "10.6.0.0/24")}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "union without y", func() bool {
		got, _ := h.fake.Nodes()
		return slices.Equal(nodeNames(got), []string{"x@192.0.2.1", "z@192.0.2.3"})
	})
	if rows := h.ix.Nodes(); len(rows) != 3 {
		t.Fatalf("index rows %+v, want all 3 reported rows", rows)
	}
}

// TestSyncNodesFirstEmptySetSyncs: the datapath is left alone until a
// source reports; the first report is synced even when it is empty (the
// routes a previous agent left for nodes since gone are removed then).
func TestSyncNodesFirstEmptySetSyncs(t *testing.T) {
	h := startSystem(t, nil)
	if err := h.sys.SyncNodes(context.Background(), "file", nil); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the empty set synced", func() bool { _, n := h.fake.Nodes(); return n == 1 })
}

// TestSyncNodesConflictsResolved: a node claiming this node's pod range
// and the later of two overlapping nodes of one source are accepted
// (listed) but left out of the datapath's set.
func TestSyncNodesConflictsResolved(t *testing.T) {
	h := startSystem(t, nil)
	nodes := []datapath.RemoteNode{
		remoteNode("a", "192.0.2.1", "10.1.0.0/24"),
		remoteNode("b", "192.0.2.2", "10.1.0.0/16"),                // overlaps a: left out
		remoteNode("c", "192.0.2.3", testIPv4.Masked().String()),   // this node's range: left out
		remoteNode("d", "192.0.2.4", "10.4.0.0/24", "fd00:4::/64"), // fine
	}
	if err := h.sys.SyncNodes(context.Background(), "k8s", nodes); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the datapath's set", func() bool {
		got, _ := h.fake.Nodes()
		return slices.Equal(nodeNames(got), []string{"a@192.0.2.1", "d@192.0.2.4"})
	})
	if rows := h.ix.Nodes(); len(rows) != 4 {
		t.Fatalf("index rows %+v, want the 4 reported", rows)
	}
}

// TestSyncNodesPeriodicResync: without any change from a source, the
// nodes actor syncs the routes in full every NodesResync (the kernel
// deletes routes through a link that went down: they come back); before
// any source spoke it syncs nothing (a previous agent's routes stay).
func TestSyncNodesPeriodicResync(t *testing.T) {
	h := startSystem(t, func(c *actors.Config) { c.NodesResync = 20 * time.Millisecond })
	time.Sleep(100 * time.Millisecond) // five periods with nothing heard
	if _, syncs := h.fake.Nodes(); syncs != 0 {
		t.Fatalf("%d syncs before any source reported, want 0", syncs)
	}
	if err := h.sys.SyncNodes(context.Background(), "k8s", []datapath.RemoteNode{remoteNode("a", "192.0.2.1", "10.1.0.0/24")}); err != nil {
		t.Fatal(err)
	}
	var first int
	testutil.Eventually(t, "the set synced", func() bool {
		got, n := h.fake.Nodes()
		first = n
		return len(got) == 1 && n > 0
	})
	testutil.Eventually(t, "synced again with no change", func() bool {
		got, n := h.fake.Nodes()
		return len(got) == 1 && n >= first+3
	})
}

// TestNodeLabelsFilter: with per-node identities, --node-labels chooses
// the Node labels that make a node's identity: two nodes that differ
// only in a label it leaves out (their hostnames) share one identity,
// named by the labels it keeps; without it every label counts and they
// get one each.
func TestNodeLabelsFilter(t *testing.T) {
	nodes := func() []datapath.RemoteNode {
		a, b := remoteNode("a", "192.0.2.1", "10.1.0.0/24"), remoteNode("b", "192.0.2.2", "10.1.1.0/24")
		a.Labels = map[string]string{"kubernetes.io/hostname": "a", "topology.kubernetes.io/zone": "z1"}
		b.Labels = map[string]string{"kubernetes.io/hostname": "b", "topology.kubernetes.io/zone": "z1"}
		return []datapath.RemoteNode{a, b}
	}
	filter, err := labels.NewPatternFilter([]string{`topology\.kubernetes\.io`})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		filter *labels.Filter
		want   int
	}{{"every label", nil, 2}, {"zone only", filter, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			h := startSystem(t, func(c *actors.Config) { c.NodeSelectorLabels, c.NodeLabels = true, tc.filter })
			if err := h.sys.SyncNodes(context.Background(), "k8s", nodes()); err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, "per-node identities", func() bool { return len(h.sys.NodeIdentities()) == tc.want })
			for id, ls := range h.sys.NodeIdentities() {
				hasHost := slices.ContainsFunc(ls, func(l labels.Label) bool { return l.Key == "kubernetes.io/hostname" })
				if hasHost != (tc.filter == nil) {
					t.Errorf("identity %d labels %v: hostname present %v, want %v", id, ls, hasHost, tc.filter == nil)
				}
			}
		})
	}
}
