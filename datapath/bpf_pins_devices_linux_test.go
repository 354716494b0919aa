package datapath

import (
	"context"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestPinsRemovedDevices: the pins of the node-wide attachments — the
// kube-proxy-free mode's socket programs on the cgroup and from_netdev on
// the uplink, the host firewall's to_netdev and the host endpoint's
// policy maps, the overlay programs on the tunnel device and the tunnel
// maps — are removed under a running datapath (rm -rf of the bpffs
// directory). Every program stays attached meanwhile (the datapath holds
// the links: a removed pin would otherwise drop the last reference and
// detach them, leaving the host unfirewalled, the overlay's identity
// checks off and Services untranslated), and the pin check pins every
// one of them again, the tree as before.
func TestPinsRemovedDevices(t *testing.T) {
	cg := newCgroup(t)
	cfg := LinuxConfig{Services: ServicesConfig{KubeProxyReplacement: true, Cgroup: cg, Devices: []string{"mbt_gw"}},
		HostFirewall: HostFirewallConfig{Enabled: true}, Nodes: NodesConfig{Routing: RoutingTunnel}}
	l, host, nl := newKPRNode(t, cfg, nil)
	ctx := context.Background()
	ssh := policy.Key{Identity: identity.ReservedWorld, Port: 22, Proto: policy.ProtoTCP, Dir: policy.Ingress}
	if err := l.RealizeHostPolicy(ctx, policy.NewMapState(1, true, false, []policy.Key{ssh}), false); err != nil {
		t.Fatal(err)
	}
	if err := l.SyncNodes(ctx, []RemoteNode{{Name: "b", Addrs: []netip.Addr{netip.MustParseAddr("192.168.90.2")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.61.0/24")}}}); err != nil {
		t.Fatal(err)
	}
	dir := l.cfg.BPFFS
	before := pinList(t, dir)
	for _, want := range []string{"socklb/connect4", "netdev/mbt_gw", "netdev-egress/mbt_gw", "host/policy", "host/cidr",
		"overlay/from", "overlay/to", pinTunnelMap, pinTunnelNodesMap} {
		if !slices.Contains(before, want) {
			t.Fatalf("pin %s missing before the test (have %v)", want, before)
		}
	}
	attached := func() map[string]int {
		got := map[string]int{}
		for _, a := range []ebpf.AttachType{ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupUDP6Sendmsg} {
			got[fmt.Sprint("cgroup ", a)] = cgroupProgs(t, cg, a)
		}
		for _, dev := range []string{"mbt_gw", DefaultTunnelDevice} {
			for _, a := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
				got[fmt.Sprint(dev, " ", a)] = tcxCount(t, host, nl, dev, a)
			}
		}
		return got
	}
	want := attached()
	for k, n := range want {
		if n != 1 {
			t.Fatalf("before: %d programs at %s, want 1 (%v)", n, k, want)
		}
	}

	for _, e := range mustReadDir(t, dir) {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	// The kernel releases a link whose last reference went with its pin
	// shortly after (deferred work): look a few times.
	for range 5 {
		time.Sleep(100 * time.Millisecond)
		if got := attached(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("programs attached after the pins were removed: %v, want %v", got, want)
		}
	}
	var rep PinRepair
	if err := l.guardBPF(func(b *bpfState) error { rep = b.checkPins(); return nil }); err != nil {
		t.Fatal(err)
	}
	if rep.Err != nil || rep.Missing == 0 || rep.Repinned != rep.Missing {
		t.Fatalf("pin check: %+v", rep)
	}
	if after := pinList(t, dir); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("pins after the repair:\n%v\nwant:\n%v", after, before)
	}
	if got := attached(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("programs attached after the repair: %v, want %v", got, want)
	}
}

// pinList lists the pins under dir (relative paths, sorted).
func pinList(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			if !strings.HasPrefix(rel, ".") {
				out = append(out, rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

func mustReadDir(t *testing.T, dir string) []os.DirEntry {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return ents
}

// tcxCount counts the TCX programs at attach on host's device dev.
func tcxCount(t *testing.T, host *testutil.NS, nl *netlink.Handle, dev string, attach ebpf.AttachType) int {
	t.Helper()
	lk, err := nl.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := host.Do(func() error {
		r, err := link.QueryPrograms(link.QueryOptions{Target: lk.Attrs().Index, Attach: attach})
		if r != nil {
			n = len(r.Programs)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return n
}
