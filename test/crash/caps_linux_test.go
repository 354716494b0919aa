package crash

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/membrane-cni/membrane/test/kubetest"
)

// TestDaemonSetCapabilities runs the agent as the DaemonSet does, not
// privileged: its capability bounding set is exactly the list in
// deploy/kubernetes/membrane.yaml, /proc/sys is read-only (as a
// container runtime mounts it) and the host's /proc/sys/net reaches it
// through --procfs. Two pods made by the real plugin on the BPF datapath
// then reach each other. Control runs without --procfs and without
// CAP_NET_ADMIN must fail, which shows the harness really confines the
// agent.
func TestDaemonSetCapabilities(t *testing.T) {
	caps := daemonSetCapabilities(t)
	for _, c := range []string{"bpf", "net_admin", "sys_admin"} {
		if !slices.Contains(caps, c) {
			t.Fatalf("the DaemonSet's agent capabilities %v lack %s", caps, c)
		}
	}
	without := slices.DeleteFunc(slices.Clone(caps), func(c string) bool { return c == "net_admin" })

	ap := linuxAgent(t, "10.254.7.0/24")
	procfs := filepath.Join(ap.Dir, "hostproc")
	ap.Wrap = containerLike(procfs, caps)
	if err := runToExit(t, ap, 30*time.Second); err == nil {
		t.Fatal("the agent ran without --procfs: /proc/sys is not read-only in the harness")
	}
	ap.Args = append(ap.Args, "--procfs", procfs)
	ap.Wrap = containerLike(procfs, without)
	if err := runToExit(t, ap, 30*time.Second); err == nil {
		t.Fatal("the agent ran without CAP_NET_ADMIN: the bounding set is not applied")
	}

	ap.Wrap = containerLike(procfs, caps)
	ap.Start()
	d := newCNIDriver(t, ap)
	w := newWorld(11)
	a, b := w.newPod(), w.newPod()
	d.mustAdd(t, a)
	ipB := d.mustAdd(t, b)
	if out, err := a.ns.Exec("ping", "-c", "3", "-i", "0.2", "-W", "2", ipB.String()); err != nil {
		t.Fatalf("pod a -> pod b with the DaemonSet's capabilities: %v\n%s", err, out)
	}
	for _, p := range []*pod{a, b} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := d.del(ctx, p); err != nil {
			t.Errorf("DEL %s: %v", p.name, err)
		}
		cancel()
	}
}

// containerLike is the command prefix that gives the agent a container's
// view: a mount namespace receiving the host's later mounts (as
// HostToContainer volumes do), /proc/sys read-only, the host's
// /proc/sys/net bound at <procfs>/sys/net, and a capability bounding set
// of caps only (root keeps no other capability across the exec).
func containerLike(procfs string, caps []string) []string {
	bounding := "-all"
	for _, c := range caps {
		bounding += ",+" + c
	}
	script := `set -e
mkdir -p "$1/sys/net"
mount --bind /proc/sys/net "$1/sys/net"
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys
shift
exec "$@"`
	return []string{"unshare", "--mount", "--propagation", "slave", "--", "sh", "-c", script, "sh", procfs,
		"setpriv", "--bounding-set", bounding, "--inh-caps", "-all", "--"}
}

// runToExit starts the agent and reports whether it became ready (nil)
// or exited first (its error).
func runToExit(t *testing.T, ap *agentProc, timeout time.Duration) error {
	t.Helper()
	var out bytes.Buffer
	cmd := ap.Command()
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := ap.NS.Do(cmd.Start); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		t.Logf("control run exited: %v: %s", err, lastLine(out.String()))
		return errors.Join(err, errors.New("exited"))
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		return nil
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// daemonSetCapabilities reads the agent container's added capabilities
// from the shipped DaemonSet, lowercased as setpriv names them.
func daemonSetCapabilities(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(kubetest.RepoRoot(), "deploy", "kubernetes", "membrane.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.ReadObjects(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() != "DaemonSet" {
			continue
		}
		var ds appsv1.DaemonSet
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &ds); err != nil {
			t.Fatal(err)
		}
		sc := ds.Spec.Template.Spec.Containers[0].SecurityContext
		if sc == nil || sc.Capabilities == nil || (sc.Privileged != nil && *sc.Privileged) {
			t.Fatal("the DaemonSet's agent container is privileged or lists no capabilities")
		}
		var caps []string
		for _, c := range sc.Capabilities.Add {
			caps = append(caps, strings.ToLower(string(c)))
		}
		return caps
	}
	t.Fatal("membrane.yaml has no DaemonSet")
	return nil
}
