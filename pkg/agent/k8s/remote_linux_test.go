package k8s_test

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestRemoteEndpointsInKernelFromAPIServer: another node's
// MembraneEndpoint reaches the Linux datapath's BPF ipcache map of an
// agent in Kubernetes mode, and leaves it when the object is deleted.
func TestRemoteEndpointsInKernelFromAPIServer(t *testing.T) {
	testutil.RequireRoot(t)
	host := testutil.NewNS(t, "mbt-k8sremote")
	bpffs := t.TempDir()
	if err := unix.Mount("bpf", bpffs, "bpf", 0, ""); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(bpffs, unix.MNT_DETACH) })
	k := startAgent(t, "kernel-a", func(c *agent.Config) {
		c.Datapath, c.Fake = "linux", nil
		c.Linux = datapath.LinuxConfig{HostNetns: host.Path, BPFFS: bpffs, TeardownDelay: -1}
	})
	dumper, ok := k.a.System.Datapath.(interface {
		DumpIPCache(context.Context) (map[netip.Prefix]identity.NumericIdentity, error)
	})
	if !ok {
		t.Fatalf("datapath %T cannot dump its ipcache", k.a.System.Datapath)
	}
	if _, err := k.cs.CoreV1().Namespaces().Create(k.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kernel-remote"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = k.cs.CoreV1().Namespaces().Delete(context.Background(), "kernel-remote", metav1.DeleteOptions{})
	})
	createNode(t, k.cs, "kernel-b", []string{"10.233.7.0/24"}, "192.0.2.99")
	createMEP(t, k.dyn, "kernel-remote", "db", "kernel-b", "10.233.7.9", 70707, "192.0.2.99")
	p := netip.MustParsePrefix("10.233.7.9/32")
	inKernel := func() (identity.NumericIdentity, string) {
		m, err := dumper.DumpIPCache(k.ctx)
		if err != nil {
			t.Fatal(err)
		}
		return m[p], fmt.Sprintf("kernel map has %d entries, %s -> %d", len(m), p, m[p])
	}
	k.eventually(t, "remote endpoint in the kernel ipcache", func() (bool, string) {
		id, why := inKernel()
		return id == 70707, why
	})
	if err := k.dyn.Resource(mepGVR).Namespace("kernel-remote").Delete(k.ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	k.eventually(t, "deleted remote endpoint leaves the kernel ipcache", func() (bool, string) {
		id, why := inKernel()
		return id == 0, why
	})
}

// TestRemoteEndpointKeptAcrossRestart: an agent restarted on the same
// bpffs (a DaemonSet upgrade) never drops another node's endpoint from
// the kernel ipcache while it starts. The map an earlier agent left is
// pruned only once the watcher's remote endpoints reached it; pruned
// before, in native routing that endpoint's traffic was taken for world
// (and denied by policy) until the watcher put it back.
func TestRemoteEndpointKeptAcrossRestart(t *testing.T) {
	testutil.RequireRoot(t)
	host := testutil.NewNS(t, "mbt-k8srestart")
	bpffs := t.TempDir()
	if err := unix.Mount("bpf", bpffs, "bpf", 0, ""); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(bpffs, unix.MNT_DETACH) })
	linux := func(c *agent.Config) {
		c.Datapath, c.Fake = "linux", nil
		c.Linux = datapath.LinuxConfig{HostNetns: host.Path, BPFFS: bpffs, TeardownDelay: -1}
	}
	k := startAgent(t, "restart-a", linux)
	if _, err := k.cs.CoreV1().Namespaces().Create(k.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "restart-remote"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = k.cs.CoreV1().Namespaces().Delete(context.Background(), "restart-remote", metav1.DeleteOptions{})
	})
	createNode(t, k.cs, "restart-b", []string{"10.233.8.0/24"}, "192.0.2.98")
	createMEP(t, k.dyn, "restart-remote", "db", "restart-b", "10.233.8.9", 70708, "192.0.2.98")
	p := netip.MustParsePrefix("10.233.8.9/32")
	held := func() (bool, string) {
		m, err := datapath.ReadPinnedIPCache(bpffs)
		if err != nil {
			return false, err.Error()
		}
		return m[p].Identity == 70708, fmt.Sprintf("kernel map has %d entries, %s -> %+v", len(m), p, m[p])
	}
	k.eventually(t, "remote endpoint in the kernel ipcache", held)
	k.stop()

	var polls, missing atomic.Int64
	var lastWhy atomic.Value
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
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
	k2 := startAgent(t, "restart-a", linux)
	k2.eventually(t, "the restarted agent's remote endpoints synced", func() (bool, string) {
		st, err := k2.c.Status(k2.ctx)
		if err != nil || st.K8s == nil {
			return false, fmt.Sprint(err)
		}
		return st.K8s.RemoteEndpointsSynced, fmt.Sprintf("remote endpoints %d synced %v", st.K8s.RemoteEndpoints, st.K8s.RemoteEndpointsSynced)
	})
	// The prune follows the sync: keep looking a while longer.
	for n := polls.Load() + 200; polls.Load() < n; {
		runtime.Gosched()
	}
	close(stop)
	<-done
	if missing.Load() != 0 {
		t.Fatalf("the remote endpoint was missing from the kernel ipcache in %d of %d looks while the agent restarted (last: %v)",
			missing.Load(), polls.Load(), lastWhy.Load())
	}
	t.Logf("remote endpoint held in all %d looks across the restart", polls.Load())
}
