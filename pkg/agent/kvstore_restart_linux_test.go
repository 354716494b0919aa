package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/etcdtest"
)

// TestKvstoreRemoteEndpointKeptAcrossRestart: in standalone kvstore mode
// an agent restarted on the same bpffs never drops another node's
// endpoint from the kernel ipcache while it starts. The map the earlier
// agent left is pruned only once the etcd mirror first handed over the
// full set; pruned at the collector's start (before the mirror listed
// etcd), the endpoint was missing until the mirror put it back, and in
// native routing its traffic was taken for world meanwhile.
func TestKvstoreRemoteEndpointKeptAcrossRestart(t *testing.T) {
	testutil.RequireRoot(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	// Node B (fake datapath) publishes one endpoint.
	_, cb := kvAgent(t, srv.Endpoint, "keep-b", 2)
	ctx := ctx10(t)
	ip, err := cb.IPAMAllocate(ctx, "ipv4", "default/remote")
	if err != nil {
		t.Fatal(err)
	}
	ep, err := cb.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{ContainerID: "kv-remote", K8sNamespace: "default", K8sPodName: "remote",
		Labels: []string{"k8s:app=remote"}, Addressing: &models.AddressPair{IPv4: ip.Address.IPv4}, SyncBuild: true})
	if err != nil {
		t.Fatal(err)
	}

	// Node A on the Linux datapath, in a netns and bpffs of its own.
	host := testutil.NewNS(t, "mbt-kvrestart")
	bpffs := t.TempDir()
	if err := unix.Mount("bpf", bpffs, "bpf", 0, ""); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(bpffs, unix.MNT_DETACH) })
	cfg := agentConfig(filepath.Join(t.TempDir(), "keep-a"))
	cfg.Datapath, cfg.Fake = "linux", nil
	cfg.Linux = datapath.LinuxConfig{HostNetns: host.Path, BPFFS: bpffs, TeardownDelay: -1}
	cfg.IPv4Range = netip.MustParsePrefix("10.204.1.0/24")
	cfg.Kvstore = &kvstore.Config{Endpoints: []string{srv.Endpoint}, NodeName: "keep-a", Prefix: "agent-test/", LeaseTTL: 2 * time.Second}
	cfg.NodeAddrs = []netip.Addr{netip.MustParseAddr("192.168.90.1")}

	p := netip.PrefixFrom(netip.MustParseAddr(ip.Address.IPv4), 32)
	held := func() (bool, string) {
		m, err := datapath.ReadPinnedIPCache(bpffs)
		if err != nil {
			return false, err.Error()
		}
		return int64(m[p].Identity) == ep.Identity.ID, fmt.Sprintf("kernel map has %d entries, %s -> %+v", len(m), p, m[p])
	}
	_, _, stop1 := startAgentT(t, cfg)
	testutil.Eventually(t, "B's endpoint in A's kernel ipcache", func() bool { ok, _ := held(); return ok })
	stop1()

	var polls, missing atomic.Int64
	var lastWhy atomic.Value
	stopPoll, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stopPoll:
				return
			default:
			}
			if ok, why := held(); !ok {
				missing.Add(1)
				lastWhy.Store(why)
			}
			polls.Add(1)
		}
	}()
	var log testutil.LogBuffer
	a2, err := agent.Start(cfg, slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	c2 := client.New(cfg.Socket)
	t.Cleanup(func() { c2.Close(); _ = a2.Stop(context.Background()) })
	waitStatus(t, c2, func(k *models.KvstoreStatus) bool { return k.Synced && k.RemoteEndpoints == 1 })
	// The prune follows the mirror's first sync: wait for it, then keep
	// looking a while longer.
	testutil.Eventually(t, "the restarted agent pruned its ipcache", func() bool {
		return strings.Contains(log.String(), "ipcache pruned")
	})
	for n := polls.Load() + 200; polls.Load() < n; {
		runtime.Gosched()
	}
	close(stopPoll)
	<-done
	if missing.Load() != 0 {
		t.Fatalf("B's endpoint was missing from A's kernel ipcache in %d of %d looks while A restarted (last: %v)",
			missing.Load(), polls.Load(), lastWhy.Load())
	}
	t.Logf("B's endpoint held in all %d looks across A's restart", polls.Load())
}
