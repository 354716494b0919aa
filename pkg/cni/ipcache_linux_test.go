package cni_test

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/identity"
)

// TestIPCacheStaleEntryPrunedAtStart: the kernel ipcache is pinned and
// outlives the agent; an entry left for an endpoint deleted while no
// agent ran is gone once the agent is back, while the restored pod's
// entry stays.
func TestIPCacheStaleEntryPrunedAtStart(t *testing.T) {
	e := newEnv(t, "10.231.4.0/24")
	e.startAgent(nil)
	c := e.client()
	p := e.newPod("kept")
	res := e.mustAdd(p)
	ip, _ := netip.AddrFromSlice(res.IPs[0].Address.IP.To4())
	ep, err := c.EndpointGet(context.Background(), "container-id:"+p.rt.ContainerID)
	if err != nil {
		t.Fatal(err)
	}
	kept := netip.PrefixFrom(ip, 32)
	e.stopAgent()

	// While no agent runs, something (here a second datapath on the same
	// pins, as a previous agent would have) leaves an entry behind.
	stale := netip.MustParsePrefix("10.231.4.200/32")
	l, err := datapath.NewLinux(datapath.LinuxConfig{HostNetns: e.host.Path, BPFFS: e.bpffs}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := l.UpsertIPCache(context.Background(), stale, 4242); err != nil {
		t.Fatal(err)
	}
	held, err := l.DumpIPCache(context.Background())
	_ = l.Close()
	if err != nil || held[stale] != 4242 || held[kept] != identity.NumericIdentity(ep.Identity.ID) {
		t.Fatalf("pinned ipcache before the restart = %v, %v; want %s and %s", held, err, stale, kept)
	}

	e.startAgent(nil)
	linux := e.agent.System.Datapath.(*datapath.Linux)
	eventually(t, "the stale ipcache entry to go", func() bool {
		got, err := linux.DumpIPCache(context.Background())
		_, left := got[stale]
		return err == nil && !left
	})
	got, err := linux.DumpIPCache(context.Background())
	if err != nil || got[kept] != identity.NumericIdentity(ep.Identity.ID) {
		t.Fatalf("ipcache after the restart = %v, %v; want %s -> %d kept", got, err, kept, ep.Identity.ID)
	}
}
