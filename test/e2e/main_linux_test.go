//go:build linux

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// theCluster is the cluster TestMain brought up (nil: the tests skip, or
// fail under CI, with skipReason).
var (
	theCluster *cluster
	skipReason = "set MEMBRANE_E2E=1 to run the end-to-end suite (make e2e, make e2e-smoke)"
	// built holds membrane-agent, membrane-cni and the image tarballs.
	built string
	tools map[string]string
)

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "e2e %s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	defer kubetest.RemoveChartTool()
	if os.Getenv("MEMBRANE_E2E_DOWN") == "1" {
		if err := downAll(); err != nil {
			logf("e2e-down: %v", err)
			return 1
		}
		logf("e2e-down: nothing left")
		return 0
	}
	if os.Getenv("MEMBRANE_E2E") != "1" {
		return m.Run()
	}
	if err := prepare(); err != nil {
		skipReason = err.Error()
		if testutil.InCI() {
			logf("CI is set and the e2e suite cannot run: %v", err)
			return 1
		}
		return m.Run()
	}
	keep := os.Getenv("E2E_KEEP") == "1"
	if !keep {
		defer os.RemoveAll(built)
	}
	nodes := 2
	if v := os.Getenv("E2E_NODES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 8 {
			logf("E2E_NODES=%q: want 1..8", v)
			return 1
		}
		nodes = n
	}
	ctx := context.Background()
	before := hostSnapshot()
	c, err := up(ctx, clusterConfig{Nodes: nodes, CNI: "membrane", Bin: kubetest.BinDir(), Tools: tools, Built: built})
	if err != nil {
		logf("%v", err)
		return 1
	}
	theCluster = c
	code := m.Run()
	if keep {
		// The kept cluster's agents run from built: make e2e-down removes it.
		c.Built = built
		if err := c.saveState(); err != nil {
			logf("save state: %v", err)
		}
		logf("E2E_KEEP=1: cluster %s stays up; kubectl: nsenter -t %d -n %s --kubeconfig %s get pods -A -o wide; remove with make e2e-down",
			c.Dir, c.cpPid, filepath.Join(c.bin, "kubectl"), filepath.Join(c.Dir, "admin.kubeconfig"))
		return code
	}
	if code != 0 {
		dumpLogs(c)
	}
	t0 := time.Now()
	if err := c.down(ctx); err != nil {
		logf("teardown: %v", err)
		return 1
	}
	after := hostSnapshot()
	logf("teardown in %s; host before %s, after %s", time.Since(t0).Round(time.Millisecond), before, after)
	return code
}

// prepare finds the programs the cluster needs and builds Membrane's
// binaries and the pod images. It fails (rather than skips) when anything
// is missing: the caller decides by CI.
func prepare() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("the e2e suite needs root")
	}
	for _, b := range []string{"etcd-embed", "kube-apiserver", "kubelet", "kube-controller-manager", "kube-scheduler"} {
		if _, err := os.Stat(filepath.Join(kubetest.BinDir(), b)); err != nil {
			return fmt.Errorf("%s missing: run scripts/kube-bin.sh kubelet kube-scheduler kube-controller-manager (%w)", b, err)
		}
	}
	coredns := os.Getenv("E2E_COREDNS")
	if coredns == "" {
		coredns = filepath.Join(os.Getenv("HOME"), ".cache", "membrane", "coredns-v1.15.0", "coredns")
	}
	if _, err := os.Stat(coredns); err != nil {
		return fmt.Errorf("coredns missing: run scripts/coredns.sh (%w)", err)
	}
	tools = map[string]string{}
	for _, t := range []struct {
		name string
		dirs []string
	}{
		{"containerd", nil}, {"runc", nil}, {"ctr", nil}, {"unshare", nil}, {"nsenter", nil}, {"ip", nil},
		{"sleep", nil}, {"loopback", []string{"/usr/lib/cni", "/opt/cni/bin"}},
	} {
		p, err := exec.LookPath(t.name)
		for _, d := range t.dirs {
			if err == nil {
				break
			}
			if _, serr := os.Stat(filepath.Join(d, t.name)); serr == nil {
				p, err = filepath.Join(d, t.name), nil
			}
		}
		if err != nil {
			return fmt.Errorf("%s missing (apt-get install containerd runc containernetworking-plugins iproute2 util-linux)", t.name)
		}
		tools[t.name] = p
	}
	dir, err := os.MkdirTemp("", "membrane-e2e-build-")
	if err != nil {
		return err
	}
	built = dir
	// Static: they run in the nodes' mount namespaces and images. The
	// Membrane images, as make image builds them, in two versions.
	if err := buildMembraneImages(dir); err != nil {
		return err
	}
	if err := writeImage(filepath.Join(dir, "pause"), "localhost/pause:v1", "65535:65535", filepath.Join(dir, "pause.tar")); err != nil {
		return err
	}
	if err := writeImage(coredns, coreDNSImage, "", filepath.Join(dir, "coredns.tar")); err != nil {
		return err
	}
	return writeImage(filepath.Join(dir, "probe"), probeImage, "", filepath.Join(dir, "probe.tar"))
}

// probeImage is the test pods' image (testdata/probe, imported into every
// node's containerd).
const probeImage = "localhost/membrane-e2e-probe:v1"

// requireCluster returns the cluster or skips (fails under CI).
func requireCluster(t *testing.T) *cluster {
	t.Helper()
	if theCluster != nil {
		return theCluster
	}
	if testutil.InCI() && os.Getenv("MEMBRANE_E2E") == "1" {
		t.Fatalf("e2e cluster not available under CI: %s", skipReason)
	}
	t.Skip(skipReason)
	return nil
}

// dumpLogs prints the tail of every component's log after a failure.
func dumpLogs(c *cluster) {
	logs, _ := filepath.Glob(filepath.Join(c.Dir, "*.log"))
	more, _ := filepath.Glob(filepath.Join(c.Dir, "node-*", "*.log"))
	// The agent pods' containers (kubelet's podLogsDir).
	agents, _ := filepath.Glob(filepath.Join(c.Dir, "node-*", "pod-logs", agentNamespace+"_*", "*", "*.log"))
	for _, f := range append(append(logs, more...), agents...) {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		logf("---- %s (tail)\n%s", f, tail(data, 40))
	}
}

func tail(data []byte, lines int) string {
	n := 0
	for i := len(data) - 1; i >= 0; i-- {
		if data[i] == '\n' {
			n++
			if n > lines {
				return string(data[i+1:])
			}
		}
	}
	return string(data)
}
