package install

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/domain/ifname"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
	"github.com/membrane-cni/membrane/test/nodeharness"
	"github.com/membrane-cni/membrane/test/nodesnap"
)

// TestCleanupRestoresNode: a node is snapshotted (devices, addresses,
// routes of every table, rules, nftables, tc qdiscs and filters of every
// device, the bpffs, the CNI directories); install-cni installs the
// plugin and the conflist; the agent runs with masquerade, the L7 and
// DNS proxies, the health endpoint and a remote node over the tunnel,
// with two pods; it stops (SIGTERM keeps everything, for a restore),
// the pods' runtime is gone; then `membrane-agent cleanup` runs, twice
// (idempotent), and the node must equal its snapshot.
func TestCleanupRestoresNode(t *testing.T) {
	n := nodeharness.New(t, nodeharness.Options{Prefix: "mbt-uninst", IPv4Range: "10.77.0.0/24", OwnBPFFS: true})
	// The node's own uplink, as on a real node: the agent picks its
	// address for the tunnel and the masquerade.
	mustExec(t, n, "ip", "link", "add", "uplink0", "type", "veth", "peer", "name", "uplink0p")
	mustExec(t, n, "ip", "addr", "add", "192.168.77.1/24", "dev", "uplink0")
	mustExec(t, n, "ip", "link", "set", "uplink0", "up")
	mustExec(t, n, "ip", "link", "set", "lo", "up")
	// Another program's tc filter on the uplink: cleanup leaves it alone.
	mustExec(t, n, "tc", "qdisc", "add", "dev", "uplink0", "clsact")
	mustExec(t, n, "tc", "filter", "add", "dev", "uplink0", "ingress", "prio", "7", "protocol", "all", "u32", "match", "u32", "0", "0", "classid", "1:1")
	cniBin, cniConf := filepath.Join(n.Dir, "opt-cni-bin"), filepath.Join(n.Dir, "etc-cni-net.d")
	for _, d := range []string{cniBin, cniConf} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(cniConf, "99-other.conflist"), []byte(`{"name":"other"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, n, cniBin, cniConf)

	install := exec.Command(nodeharness.Bin("membrane-agent"), "install-cni", "--plugin", nodeharness.Bin("membrane-cni"),
		"--conflist", filepath.Join(kubetest.RepoRoot(), "deploy", "05-membrane.conflist"), "--cni-bin-dir", cniBin, "--cni-conf-dir", cniConf)
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("install-cni: %v\n%s", err, out)
	}
	nodes := filepath.Join(n.Dir, "nodes.yaml")
	if err := os.WriteFile(nodes, []byte("- {name: other, addresses: [192.168.77.2], podCIDRs: [10.78.0.0/24]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := n.Process("--http-addr", "", "--masquerade", "--cluster-cidr", "10.77.0.0/16", "--nodes-file", nodes,
		"--l7-proxy", nodeharness.Bin("membrane-proxy"), "--l7-xds-socket", xdsSocket(n),
		"--dns-proxy", "--enable-health=true")
	p.Start()
	a := n.AddPod("a")
	n.AddPod("b")
	testutil.Eventually(t, "the route to the remote node's pods", func() bool {
		out, _ := n.NS.Exec("ip", "route", "show", "10.78.0.0/24")
		return strings.Contains(out, "10.78.0.0/24")
	})
	p.Stop()
	installed := snapshot(t, n, cniBin, cniConf)
	if diff := nodesnap.Diff(before, installed); len(diff) < 5 {
		t.Fatalf("the install changed too little for this test to mean anything:\n%s", strings.Join(diff, "\n"))
	}
	// The runtime removed one pod's namespace (and so its veth); the
	// other pod still runs: cleanup removes its host veth.
	a.NS.Remove()
	// The kernel destroys a's netns, and its veth, asynchronously.
	testutil.Eventually(t, "pod b's and the health endpoint's host veths left", func() bool { return hostVeths(t, n) == 2 })

	for i := range 2 {
		cmd := cleanupCmd(n, cniBin, cniConf)
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		exited, err := n.NS.StartPinned(cmd)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-exited:
		case <-time.After(time.Minute):
			t.Fatal("cleanup did not end")
		}
		if !cmd.ProcessState.Success() {
			t.Fatalf("cleanup %d: %v\n%s", i+1, cmd.ProcessState, out.String())
		}
		t.Logf("cleanup %d:\n%s", i+1, out.String())
	}
	// --wait (the uninstall DaemonSet's container): clean, then running
	// until SIGTERM, then a clean exit.
	waitCmd := cleanupCmd(n, cniBin, cniConf, "--wait")
	var waitOut testutil.LogBuffer
	waitCmd.Stdout, waitCmd.Stderr = &waitOut, &waitOut
	exited, err := n.NS.StartPinned(waitCmd)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "cleanup --wait done and waiting", func() bool { return strings.Contains(waitOut.String(), "node cleaned up") })
	select {
	case <-exited:
		t.Fatalf("cleanup --wait exited before SIGTERM: %v\n%s", waitCmd.ProcessState, waitOut.String())
	default:
	}
	if err := waitCmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(time.Minute):
		t.Fatal("cleanup --wait ignored SIGTERM")
	}
	if !waitCmd.ProcessState.Success() {
		t.Fatalf("cleanup --wait: %v\n%s", waitCmd.ProcessState, waitOut.String())
	}
	after := snapshot(t, n, cniBin, cniConf)
	if diff := nodesnap.Diff(before, after); len(diff) > 0 {
		t.Fatalf("the node after cleanup differs from before the install:\n%s", strings.Join(diff, "\n"))
	}
	for _, p := range []string{n.StateDir, n.Socket, n.DeleteQueue, xdsSocket(n), datapath.L7AccessSocket(xdsSocket(n))} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind (%v)", p, err)
		}
	}
}

// cleanupCmd is membrane-agent cleanup for the node's paths, with extra
// flags.
func cleanupCmd(n *nodeharness.Node, cniBin, cniConf string, extra ...string) *exec.Cmd {
	args := append([]string{"cleanup", "--cni-bin-dir", cniBin, "--cni-conf-dir", cniConf, "--bpffs", n.BPFFS,
		"--state-dir", n.StateDir, "--socket", n.Socket, "--delete-queue-dir", n.DeleteQueue, "--l7-xds-socket", xdsSocket(n)}, extra...)
	return exec.Command(nodeharness.Bin("membrane-agent"), args...)
}

// xdsSocket is the node's agent's L7 xDS socket.
func xdsSocket(n *nodeharness.Node) string { return filepath.Join(n.Dir, "xds.sock") }

// hostVeths counts the node's veths that the agent names (ifname.Managed).
func hostVeths(t *testing.T, n *nodeharness.Node) int {
	t.Helper()
	links, err := n.NS.Netlink(t).LinkList()
	if err != nil {
		t.Fatal(err)
	}
	c := 0
	for _, l := range links {
		if l.Type() == "veth" && ifname.Managed(l.Attrs().Name) {
			c++
		}
	}
	return c
}

func mustExec(t *testing.T, n *nodeharness.Node, name string, args ...string) {
	t.Helper()
	if out, err := n.NS.Exec(name, args...); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// snapshot is the node's state (test/nodesnap): network, BPF and the
// files under its bpffs and dirs.
func snapshot(t *testing.T, n *nodeharness.Node, dirs ...string) []string {
	t.Helper()
	lines, err := nodesnap.Take(nodesnap.Node{Exec: n.NS.Exec, Do: n.NS.Do, Dirs: append([]string{n.BPFFS}, dirs...)})
	if err != nil {
		t.Fatal(err)
	}
	return lines
}
