package agent_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestRemoteEndpointsInKernelIPCache: remote endpoints handed to the
// front door are in the Linux datapath's BPF ipcache map with their
// identity; a replacement without one removes it from the map.
func TestRemoteEndpointsInKernelIPCache(t *testing.T) {
	testutil.RequireRoot(t)
	host := testutil.NewNS(t, "mbt-remote")
	env := newRestoreEnv(t)
	env.cfg.Datapath = "linux"
	bpffs := t.TempDir()
	if err := unix.Mount("bpf", bpffs, "bpf", 0, ""); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(bpffs, unix.MNT_DETACH) })
	env.cfg.Linux = datapath.LinuxConfig{HostNetns: host.Path, BPFFS: bpffs, TeardownDelay: -1}
	a, _ := env.start(t, nil)
	dumper, ok := a.System.Datapath.(interface {
		DumpIPCache(context.Context) (map[netip.Prefix]identity.NumericIdentity, error)
	})
	if !ok {
		t.Fatalf("datapath %T cannot dump its ipcache", a.System.Datapath)
	}
	node := netip.MustParseAddr("192.0.2.90")
	eps := []endpoint.Remote{
		{IPs: []netip.Addr{netip.MustParseAddr("10.250.0.5"), netip.MustParseAddr("fd00:250::5")}, Identity: 60005, Node: "n9", NodeIP: node},
		{IPs: []netip.Addr{netip.MustParseAddr("10.250.0.6")}, Identity: 60006, Node: "n9", NodeIP: node},
	}
	ctx := context.Background()
	if err := a.System.ReplaceRemoteEndpoints(ctx, "k8s", eps); err != nil {
		t.Fatal(err)
	}
	want := map[netip.Prefix]identity.NumericIdentity{
		netip.MustParsePrefix("10.250.0.5/32"):   60005,
		netip.MustParsePrefix("fd00:250::5/128"): 60005,
		netip.MustParsePrefix("10.250.0.6/32"):   60006,
	}
	waitKernel(t, dumper, "remote endpoints in the kernel map", func(m map[netip.Prefix]identity.NumericIdentity) bool {
		for p, id := range want {
			if m[p] != id {
				return false
			}
		}
		return true
	})
	if err := a.System.ReplaceRemoteEndpoints(ctx, "k8s", eps[:1]); err != nil {
		t.Fatal(err)
	}
	waitKernel(t, dumper, "swept remote endpoint leaves the kernel map", func(m map[netip.Prefix]identity.NumericIdentity) bool {
		_, left := m[netip.MustParsePrefix("10.250.0.6/32")]
		return !left && m[netip.MustParsePrefix("10.250.0.5/32")] == 60005
	})
}

func waitKernel(t *testing.T, d interface {
	DumpIPCache(context.Context) (map[netip.Prefix]identity.NumericIdentity, error)
}, what string, cond func(map[netip.Prefix]identity.NumericIdentity) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, err := d.DumpIPCache(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if cond(m) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: kernel map holds %v", what, m)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
