package actors_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// ipcacheRow is p's row in the index's ipcache (nil: absent).
func (h *harness) ipcacheRow(p netip.Prefix) *index.IPCacheEntry {
	for _, e := range h.ix.IPCache() {
		if e.Prefix == p {
			return e
		}
	}
	return nil
}

func host32(ip netip.Addr) netip.Prefix { return netip.PrefixFrom(ip, ip.BitLen()) }

// remotes returns n remote endpoints 10.99.x.y with identity base+i on node 192.0.2.2.
func remotes(n int, base identity.NumericIdentity) []endpoint.Remote {
	out := make([]endpoint.Remote, n)
	for i := range out {
		ip := netip.AddrFrom4([4]byte{10, 99, byte(i >> 8), byte(i)})
		out[i] = endpoint.Remote{IPs: []netip.Addr{ip}, Identity: base + identity.NumericIdentity(i), Node: "n2", NodeIP: netip.MustParseAddr("192.0.2.2")}
	}
	return out
}

// TestRemoteEndpointsUpsertDelete: remote endpoints reach the index with
// their node as tunnel endpoint and the datapath with their identity; a
// delete removes them.
func TestRemoteEndpointsUpsertDelete(t *testing.T) {
	h := startSystem(t, nil)
	ctx := context.Background()
	r := endpoint.Remote{
		IPs:      []netip.Addr{netip.MustParseAddr("10.98.0.5"), netip.MustParseAddr("fd98::5")},
		Identity: 70001, Node: "n2", NodeIP: netip.MustParseAddr("192.0.2.2"),
	}
	if err := h.sys.UpsertRemoteEndpoints(ctx, "k8s", []endpoint.Remote{r}); err != nil {
		t.Fatal(err)
	}
	for _, ip := range r.IPs {
		e := h.ipcacheRow(host32(ip))
		if e == nil || e.Identity != 70001 || e.Source != index.SourceRemote || e.TunnelEndpoint != r.NodeIP {
			t.Fatalf("row for %s = %+v; want identity 70001 from remote via %s", ip, e, r.NodeIP)
		}
		testutil.Eventually(t, "datapath holds "+ip.String(), func() bool { return h.fake.IPCache()[host32(ip)] == 70001 })
	}
	if err := h.sys.DeleteRemoteEndpoints(ctx, "k8s", r.IPs); err != nil {
		t.Fatal(err)
	}
	for _, ip := range r.IPs {
		if e := h.ipcacheRow(host32(ip)); e != nil {
			t.Fatalf("row for %s after delete: %+v", ip, e)
		}
		testutil.Eventually(t, "datapath drops "+ip.String(), func() bool { _, ok := h.fake.IPCache()[host32(ip)]; return !ok })
	}
}

// TestRemoteEndpointLocalWins: a local endpoint's claim on an address
// wins over a remote one; when the local endpoint goes, the remote claim
// takes the address.
func TestRemoteEndpointLocalWins(t *testing.T) {
	h := startSystem(t, nil)
	ctx := context.Background()
	ip := h.mustAllocate(t, ipam.IPv4, "ns/local")
	spec := podSpec(t, "c-local", "ns", "local")
	spec.IPv4 = ip
	ep := h.mustCreate(t, spec)
	p := host32(ip)
	testutil.Eventually(t, "local endpoint in ipcache", func() bool { return h.ipcacheIdentity(p) == ep.Identity })
	if err := h.sys.UpsertRemoteEndpoints(ctx, "k8s", []endpoint.Remote{{IPs: []netip.Addr{ip}, Identity: 70002, NodeIP: netip.MustParseAddr("192.0.2.3")}}); err != nil {
		t.Fatal(err)
	}
	if e := h.ipcacheRow(p); e.Identity != ep.Identity || e.Source != index.SourceEndpoint || e.TunnelEndpoint.IsValid() || len(e.Claims) != 2 {
		t.Fatalf("row with local and remote claims = %+v; want the local endpoint's identity %d", e, ep.Identity)
	}
	if _, err := h.remove(t, ep.ID, endpoint.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "remote claim takes the address", func() bool { return h.ipcacheIdentity(p) == 70002 })
	testutil.Eventually(t, "datapath follows", func() bool { return h.fake.IPCache()[p] == 70002 })
}

// TestRemoteEndpointsReplace: a replacement larger than one batch sets
// every endpoint, and the next replacement sweeps what it does not hold,
// leaving other sources' claims alone.
func TestRemoteEndpointsReplace(t *testing.T) {
	h := startSystem(t, nil)
	ctx := context.Background()
	all := remotes(actors.RemoteBatch*2+7, 80000)
	other := endpoint.Remote{IPs: []netip.Addr{all[0].IPs[0], netip.MustParseAddr("10.97.0.1")}, Identity: 90000}
	if err := h.sys.UpsertRemoteEndpoints(ctx, "kvstore", []endpoint.Remote{other}); err != nil {
		t.Fatal(err)
	}
	if err := h.sys.ReplaceRemoteEndpoints(ctx, "k8s", all); err != nil {
		t.Fatal(err)
	}
	// "k8s" < "kvstore": the k8s claim on the shared address wins.
	for _, r := range all {
		if id := h.ipcacheIdentity(host32(r.IPs[0])); id != r.Identity {
			t.Fatalf("%s = %d after replace, want %d", r.IPs[0], id, r.Identity)
		}
	}
	keep := all[:10]
	if err := h.sys.ReplaceRemoteEndpoints(ctx, "k8s", keep); err != nil {
		t.Fatal(err)
	}
	rows := 0
	for _, e := range h.ix.IPCache() {
		if e.Source == index.SourceRemote {
			rows++
		}
	}
	if rows != len(keep)+1 { // + the kvstore's own address
		t.Fatalf("%d remote rows after replacing with %d, want %d", rows, len(keep), len(keep)+1)
	}
	if id := h.ipcacheIdentity(host32(netip.MustParseAddr("10.97.0.1"))); id != 90000 {
		t.Fatalf("other source's row swept: %d", id)
	}
	gone := all[len(all)-1].IPs[0]
	testutil.Eventually(t, "datapath drops swept "+gone.String(), func() bool { _, ok := h.fake.IPCache()[host32(gone)]; return !ok })
	if err := h.sys.ReplaceRemoteEndpoints(ctx, "k8s", nil); err != nil {
		t.Fatal(err)
	}
	if id := h.ipcacheIdentity(host32(all[0].IPs[0])); id != 90000 {
		t.Fatalf("shared address = %d after k8s emptied, want the kvstore's 90000", id)
	}
}

// TestRemoteEndpointsInvalid: bad input is refused with a clear error.
func TestRemoteEndpointsInvalid(t *testing.T) {
	h := startSystem(t, nil)
	ctx := context.Background()
	ok := remotes(1, 1000)[0]
	for _, tc := range []struct {
		name   string
		source string
		r      endpoint.Remote
		want   error
	}{
		{"no source", "", ok, actors.ErrInvalidSource},
		{"no ips", "k8s", endpoint.Remote{Identity: 5}, endpoint.ErrInvalidRemote},
		{"bad ip", "k8s", endpoint.Remote{IPs: []netip.Addr{{}}, Identity: 5}, endpoint.ErrInvalidRemote},
		{"no identity", "k8s", endpoint.Remote{IPs: ok.IPs}, endpoint.ErrInvalidRemote},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i, call := range []func() error{
				func() error { return h.sys.UpsertRemoteEndpoints(ctx, tc.source, []endpoint.Remote{tc.r}) },
				func() error { return h.sys.ReplaceRemoteEndpoints(ctx, tc.source, []endpoint.Remote{tc.r}) },
			} {
				if err := call(); !errors.Is(err, tc.want) {
					t.Fatalf("call %d: err = %v, want %v", i, err, tc.want)
				}
			}
		})
	}
	if err := h.sys.DeleteRemoteEndpoints(ctx, "", nil); !errors.Is(err, actors.ErrInvalidSource) {
		t.Fatalf("delete with no source: %v", err)
	}
	// The two gateways' rows are committed asynchronously after start;
	// a refused remote would make a third.
	testutil.Eventually(t, "only the two gateways in the ipcache", func() bool { return len(h.ix.IPCache()) == 2 })
	if n := len(h.ix.IPCache()); n != 2 {
		t.Fatalf("%d ipcache rows after refused input, want 2: %v", n, fmt.Sprint(h.ix.IPCache()))
	}
}

// TestChangeRemoteEndpointsOneTransaction: deletions and upserts in one
// ChangeRemoteEndpoints are one pass of the ipcache actor and one index
// transaction (the kvstore mirror's hand-over), deletions first.
func TestChangeRemoteEndpointsOneTransaction(t *testing.T) {
	h := startSystem(t, nil)
	ctx := context.Background()
	eps := remotes(20, 70100)
	if err := h.sys.UpsertRemoteEndpoints(ctx, "kvstore", eps[:10]); err != nil {
		t.Fatal(err)
	}
	for round := range 5 {
		gone, next := eps[round*2], eps[10+round*2]
		before := h.sys.Counters().IndexTransactions
		if err := h.sys.ChangeRemoteEndpoints(ctx, "kvstore", []endpoint.Remote{next}, gone.IPs); err != nil {
			t.Fatal(err)
		}
		if n := h.sys.Counters().IndexTransactions - before; n != 1 {
			t.Fatalf("round %d: %d index transactions for one change, want 1", round, n)
		}
		if e := h.ipcacheRow(host32(gone.IPs[0])); e != nil {
			t.Fatalf("round %d: deleted %s still in the ipcache: %+v", round, gone.IPs[0], e)
		}
		if e := h.ipcacheRow(host32(next.IPs[0])); e == nil || e.Identity != next.Identity {
			t.Fatalf("round %d: upserted %s = %+v, want identity %d", round, next.IPs[0], e, next.Identity)
		}
	}
	if err := h.sys.ChangeRemoteEndpoints(ctx, "", nil, nil); !errors.Is(err, actors.ErrInvalidSource) {
		t.Fatalf("empty source: %v", err)
	}
}
