package agent_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestHostAddrsFollowed: an address added to the host netns after the
// agent started becomes the host identity in the ipcache (the index and
// the kernel map), and goes when the host loses it; the gateway stays.
func TestHostAddrsFollowed(t *testing.T) {
	testutil.RequireRoot(t)
	host := testutil.NewNS(t, "mbt-hostaddr")
	env := newRestoreEnv(t)
	env.cfg.Datapath = "linux"
	bpffs := t.TempDir()
	if err := unix.Mount("bpf", bpffs, "bpf", 0, ""); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(bpffs, unix.MNT_DETACH) })
	env.cfg.Linux = datapath.LinuxConfig{HostNetns: host.Path, BPFFS: bpffs, TeardownDelay: -1}
	a, c := env.start(t, nil)
	dumper, ok := a.System.Datapath.(interface {
		DumpIPCache(context.Context) (map[netip.Prefix]identity.NumericIdentity, error)
	})
	if !ok {
		t.Fatalf("datapath %T cannot dump its ipcache", a.System.Datapath)
	}
	// state reports the prefix's identity in the API's ipcache and in the
	// kernel map (0: absent).
	state := func(p netip.Prefix) (api, kernel uint32) {
		entries, err := c.IPCache(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.CIDR == p.String() {
				api = e.Identity
			}
		}
		m, err := dumper.DumpIPCache(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return api, uint32(m[p])
	}
	waitState := func(what string, p netip.Prefix, want uint32) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			api, kernel := state(p)
			if api == want && kernel == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s is identity %d in the API, %d in the kernel, want %d", what, p, api, kernel, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	gw := netip.MustParsePrefix("10.233.0.1/32") // the IPv4 range's gateway
	waitState("gateway", gw, uint32(identity.ReservedHost))

	for _, tc := range []struct{ addr, prefix string }{
		{"192.0.2.77/24", "192.0.2.77/32"},
		{"2001:db8::77/64", "2001:db8::77/128"},
	} {
		p := netip.MustParsePrefix(tc.prefix)
		if api, kernel := state(p); api != 0 || kernel != 0 {
			t.Fatalf("%s in the ipcache before the host has it: %d %d", p, api, kernel)
		}
		if out, err := host.Exec("ip", "addr", "add", tc.addr, "dev", "lo"); err != nil {
			t.Fatalf("add %s: %v\n%s", tc.addr, err, out)
		}
		waitState("added to the host", p, uint32(identity.ReservedHost))
		if out, err := host.Exec("ip", "addr", "del", tc.addr, "dev", "lo"); err != nil {
			t.Fatalf("delete %s: %v\n%s", tc.addr, err, out)
		}
		waitState("removed from the host", p, 0)
	}
	if api, kernel := state(gw); api != uint32(identity.ReservedHost) || kernel != uint32(identity.ReservedHost) {
		t.Fatalf("gateway %s lost its host identity: %d %d", gw, api, kernel)
	}
}
