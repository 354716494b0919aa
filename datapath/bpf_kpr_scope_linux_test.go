package datapath

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/service"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// upsertScopes writes an externalTrafficPolicy Local NodePort as the
// translation does: the internal record (id, every backend, TwoScopes)
// and the external one (id+1, only the local backends).
func upsertScopes(t *testing.T, l *Linux, id uint32, fe string, internal, external []service.Backend, prevInt, prevExt int) {
	t.Helper()
	f := netip.MustParseAddrPort(fe)
	in := service.Frontend{Addr: f.Addr(), Port: f.Port(), Proto: service.TCP}
	ex := in
	ex.Scope = service.ScopeExternal
	ctx := context.Background()
	if err := l.UpsertService(ctx, LBService{ID: id, Frontend: in, Backends: internal, External: true, TwoScopes: true}, prevInt); err != nil {
		t.Fatal(err)
	}
	if err := l.UpsertService(ctx, LBService{ID: id + 1, Frontend: ex, Backends: external, External: true}, prevExt); err != nil {
		t.Fatal(err)
	}
}

// noBackendDrops sums the uplinks' no-backend drops.
func noBackendDrops(t *testing.T, l *Linux) uint64 {
	t.Helper()
	c, err := l.DropCounters(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for k, d := range c {
		if k.Endpoint == 0 && k.Reason == DropNoBackend {
			n += d.Packets
		}
	}
	return n
}

// TestNodePortTwoScopes: an externalTrafficPolicy Local NodePort on node
// A whose only ready backend runs on node B (native routing over ul0).
// Node A's own socket (in the hooked cgroup: the socket programs) and
// its pod (outside the cgroup: the pod's from-container program; inside
// it: the socket programs) reach B's pod through the internal scope, as
// kube-proxy's short-circuit does for upstream's "the NodePort responds
// (due to short-circuit rule) on the execpod node"; a client outside
// the node gets nothing (the external scope has no backend: dropped as
// no-backend on the uplink). With a local backend added, the client
// from outside reaches only it, with its own address preserved.
func TestNodePortTwoScopes(t *testing.T) {
	testutil.RequireRoot(t)
	const (
		addrA, ulA, ulB = "192.168.93.1", "192.168.94.1", "192.168.94.2"
		fe              = addrA + ":30080"
		remote, local   = "10.244.60.130", "10.244.60.11"
	)
	cg := newCgroup(t)
	cfg := LinuxConfig{Nodes: NodesConfig{Routing: RoutingNative}, Gateways: []netip.Addr{netip.MustParseAddr("10.244.60.1")}, GatewayDevice: "mbt_gw"}
	cfgA := cfg
	cfgA.Services = ServicesConfig{KubeProxyReplacement: true, Cgroup: cg}
	nodeB, hostB, nlB := newKPRNode(t, cfg, nil)
	client := testutil.NewNS(t, "mbt-cl")
	nodeA, hostA, nlA := newKPRNode(t, cfgA, func(host *testutil.NS, nl *netlink.Handle) {
		linkNS(t, host, nl, "up0", addrA+"/24", client, "eth0", "192.168.93.2/24")
		linkNS(t, host, nl, "ul0", ulA+"/24", hostB, "ul0", ulB+"/24")
	})
	if err := client.Netlink(t).RouteAdd(&netlink.Route{Gw: net.ParseIP(addrA)}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := nodeA.SyncNodes(ctx, []RemoteNode{{Name: "b", Addrs: []netip.Addr{netip.MustParseAddr(ulB)},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.60.128/25")}}}); err != nil {
		t.Fatal(err)
	}
	// B routes node A's pods and the client network back over ul0.
	for _, dst := range []string{"10.244.60.0/25", "192.168.93.0/24"} {
		_, n, _ := net.ParseCIDR(dst)
		if err := nlB.RouteAdd(&netlink.Route{Dst: n, Gw: net.ParseIP(ulA)}); err != nil {
			t.Fatal(err)
		}
	}
	podB := addPod(t, nlB, 32, 2002, remote)
	podA := addPod(t, nlA, 11, 1001, local)
	if _, err := nodeB.Realize(ctx, podB.ep, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := nodeA.Realize(ctx, podA.ep, 1); err != nil {
		t.Fatal(err)
	}
	whoServer(t, podB.ns, podB.addr(), 8080)
	whoServer(t, podA.ns, podA.addr(), 8080)

	remoteBE := service.Backend{Addr: netip.MustParseAddr(remote), Port: 8080}
	localBE := service.Backend{Addr: netip.MustParseAddr(local), Port: 8080, Local: true}
	upsertScopes(t, nodeA, 1, fe, []service.Backend{remoteBE}, nil, 0, 0)

	addr := netip.MustParseAddrPort(fe)
	for _, c := range []struct {
		what string
		ns   *testutil.NS
	}{{"node A's socket", hostA}, {"node A's pod in the cgroup", podA.ns}} {
		seen := backendsSeen(t, c.what, runSockClient(t, c.ns, cg, "tcp", addr, 5), fe)
		if len(seen) != 1 || seen[remote] != 5 {
			t.Fatalf("%s: backends %v, want node B's pod (the internal scope)", c.what, seen)
		}
	}
	from, reply := dialWho(t, podA.ns, "tcp", fe) // the pod's from-container translates
	if f := strings.Fields(reply); from != fe || len(f) != 2 || f[0] != remote {
		t.Fatalf("node A's pod: reply %q from %s, want node B's pod from %s", reply, from, fe)
	}
	before := noBackendDrops(t, nodeA)
	if err := client.Do(func() error {
		_, _, err := sockExchange("tcp", addr)
		return err
	}); err == nil {
		t.Fatal("the client outside node A connected to the NodePort, want no backend (the external scope is empty)")
	}
	if after := noBackendDrops(t, nodeA); after <= before {
		t.Fatalf("no-backend drops on the uplink %d -> %d, want more", before, after)
	}

	// A local backend: outside reaches only it, the client's address kept.
	upsertScopes(t, nodeA, 1, fe, []service.Backend{localBE, remoteBE}, []service.Backend{localBE}, 1, 0)
	for range 10 {
		from, reply := dialWho(t, client, "tcp", fe)
		if f := strings.Fields(reply); from != fe || len(f) != 2 || f[0] != local || !strings.HasPrefix(f[1], "192.168.93.2:") {
			t.Fatalf("from outside: reply %q from %s, want node A's pod seeing the client's address", reply, from)
		}
	}
	m, err := nodeA.DumpServices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Frontends) != 2 || !m.Frontends[0].TwoScopes || m.Frontends[1].Frontend.Scope != service.ScopeExternal ||
		m.Frontends[0].Count != 2 || m.Frontends[1].Count != 1 {
		t.Fatalf("frontends %+v, want the internal record (two scopes, 2 backends) and the external one (1)", m.Frontends)
	}
}

// TestFrontendsMapOldLayout: an lb_frontends map pinned by a build
// before the scope (20-byte keys) is replaced by today's layout with its
// entries carried over as internal-scope frontends, their IDs kept.
func TestFrontendsMapOldLayout(t *testing.T) {
	spec, err := bpf.LoadEndpoint()
	if err != nil {
		t.Fatal(err)
	}
	ms := spec.Maps[bpf.EndpointMapLbFrontends].Copy()
	ms.Pinning = ebpf.PinNone
	path := filepath.Join(testutil.BPFFSDir(t), "lb_frontends")
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: "lb_frontends", Type: ebpf.Hash, KeySize: oldLBKeySize, ValueSize: ms.ValueSize,
		MaxEntries: ms.MaxEntries, Flags: ms.Flags})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	fe := service.Frontend{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: service.UDP}
	want := bpf.EndpointLbService{Id: 7, Count: 2, Flags: lbFlagAffinity, Affinity: 30}
	k := lbKey(fe)
	oldKey := binary.NativeEndian.AppendUint32(nil, k.Addr[0])
	for _, w := range k.Addr[1:] {
		oldKey = binary.NativeEndian.AppendUint32(oldKey, w)
	}
	oldKey = binary.NativeEndian.AppendUint16(oldKey, k.Dport)
	oldKey = append(oldKey, k.Proto, k.Family)
	if err := old.Put(oldKey, want); err != nil {
		t.Fatal(err)
	}
	if err := old.Pin(path); err != nil {
		t.Fatal(err)
	}
	m, err := openFrontendsMap(ms, path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var got bpf.EndpointLbService
	if m.KeySize() != uint32(binary.Size(k)) || m.Lookup(k, &got) != nil || got != want {
		t.Fatalf("after reopening: key size %d, entry %+v; want %d and %+v", m.KeySize(), got, binary.Size(k), want)
	}
}
