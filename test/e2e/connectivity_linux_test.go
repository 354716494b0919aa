//go:build linux

package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	conn "github.com/membrane-cni/membrane/pkg/clients/cluster"
	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// TestConnectivity runs `membranectl connectivity test` against the
// cluster as an operator would (inside the control plane's network
// namespace, with the admin kubeconfig), with upstream's agnhost image
// and an outside target: a listener on the control plane's underlay
// address, which is not a node and not a pod. Every check must pass
// (the L7 checks where the agents run the L7 proxy) and the namespace
// must be gone after. A second run whose outside target is a closed port
// must fail that check and exit non-zero: the checks can fail. Then
// `membranectl status --all-nodes` must read every node's agent.
func TestConnectivity(t *testing.T) {
	bin := os.Getenv("E2E_BIN_DIR")
	if bin == "" {
		t.Skip("set E2E_BIN_DIR to scripts/e2e-bin.sh's directory (its agnhost; make e2e and make conformance do)")
	}
	c := requireCluster(t)
	if err := c.importConformanceImages(bin); err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	if err := inNetns(fmt.Sprintf("/proc/%d/ns/net", c.cpPid), func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(apiIP.String(), "0"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	external := ln.Addr().String()

	rep, out, err := c.connectivity(t, "--external-target", external)
	if err != nil {
		t.Fatalf("connectivity test: %v\n%s", err, out)
	}
	want := map[string]string{
		"pod-to-pod/same-node": conn.Pass, "pod-to-service/cluster-ip": conn.Pass, "dns/service-name": conn.Pass,
		"pod-to-host/same-node": conn.Pass, "pod-to-world": conn.Pass,
		"network-policy/deny": conn.Pass, "network-policy/allow": conn.Pass, "network-policy/removed": conn.Pass,
	}
	if len(c.nodes) > 1 {
		want["pod-to-pod/other-node"] = conn.Pass
		want["pod-to-host/other-node"] = conn.Pass
	}
	if c.agentFlags["l7-proxy"] != "" {
		want["l7-policy/allowed-path"] = conn.Pass
		want["l7-policy/denied-path"] = conn.Pass
	}
	got := map[string]string{}
	for _, ch := range rep.Checks {
		got[ch.Name] = ch.Result
		t.Logf("%-28s %-4s %6s %s", ch.Name, ch.Result, ch.Took, ch.Detail)
	}
	for name, res := range want {
		if got[name] != res {
			t.Errorf("check %s: %q, want %q", name, got[name], res)
		}
	}
	if rep.Failed != 0 || rep.Cleanup != "" {
		t.Errorf("%d checks failed, cleanup %q", rep.Failed, rep.Cleanup)
	}
	if _, err := c.client.CoreV1().Namespaces().Get(t.Context(), rep.Namespace, metav1.GetOptions{}); err == nil {
		t.Errorf("namespace %s still there after the run", rep.Namespace)
	}

	// Every node's flows of the run, through the API server: the
	// cross-node connection seen on both nodes, the NetworkPolicy's drop.
	obs := c.ctl("observe", "--all-nodes", "--namespace", rep.Namespace, "-o", "json")
	var oout, oerr bytes.Buffer
	obs.Stdout, obs.Stderr = &oout, &oerr
	if err := obs.Run(); err != nil {
		t.Fatalf("observe --all-nodes: %v\n%s", err, oerr.String())
	}
	nodesSeen, dropped := map[string]int{}, 0
	for _, line := range strings.Split(strings.TrimSpace(oout.String()), "\n") {
		var f models.Flow
		if err := json.Unmarshal([]byte(line), &f); err != nil {
			t.Fatalf("observe --all-nodes line %q: %v", line, err)
		}
		nodesSeen[f.Node]++
		if f.Verdict == "dropped" && f.Source.Pod == "client" && f.Destination.Pod == "echo-a" {
			dropped++
		}
	}
	t.Logf("observe --all-nodes: flows per node %v, %d drops of client -> echo-a", nodesSeen, dropped)
	if len(nodesSeen) != len(c.nodes) || dropped == 0 {
		t.Errorf("observe --all-nodes: flows per node %v (want every node), %d NetworkPolicy drops (want some)", nodesSeen, dropped)
	}

	// A closed port outside: pod-to-world fails, the command exits 1.
	closed, err := net.Listen("tcp", "127.0.0.1:0") // a port number nothing listens on at apiIP
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(closed.Addr().String())
	closed.Close()
	rep, out, err = c.connectivity(t, "--external-target", net.JoinHostPort(apiIP.String(), port), "--check-timeout", "5s")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("closed outside target: exit %v, want 1\n%s", err, out)
	}
	for _, ch := range rep.Checks {
		if ch.Name == "pod-to-world" && ch.Result != conn.Fail {
			t.Errorf("pod-to-world to a closed port: %s (%s), want fail", ch.Result, ch.Detail)
		}
	}

	// status --all-nodes reads every agent.
	cmd := c.ctl("status", "--all-nodes", "-o", "json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("status --all-nodes: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	var nodes []conn.NodeStatus
	if err := json.Unmarshal(stdout.Bytes(), &nodes); err != nil {
		t.Fatalf("status --all-nodes: %v\n%s", err, stdout.String())
	}
	if len(nodes) != len(c.nodes) {
		t.Fatalf("status --all-nodes: %d nodes, want %d", len(nodes), len(c.nodes))
	}
	for _, n := range nodes {
		if n.Status == nil || n.Status.State != "ok" || n.Error != "" || n.Health == nil || n.PolicyRevision == 0 {
			t.Errorf("node %s: %+v", n.Node, n)
		}
	}
	table := c.ctl("status", "--all-nodes")
	tout, err := table.CombinedOutput()
	if err != nil {
		t.Fatalf("status --all-nodes (table): %v\n%s", err, tout)
	}
	for _, n := range c.nodes {
		if !strings.Contains(string(tout), n.name) {
			t.Errorf("status --all-nodes table lacks node %s:\n%s", n.name, tout)
		}
	}
	t.Logf("status --all-nodes:\n%s", tout)
}

// ctl is membranectl (the host build) inside the control plane's network
// namespace, with the admin kubeconfig.
func (c *cluster) ctl(args ...string) *exec.Cmd {
	full := append([]string{"-t", strconv.Itoa(c.cpPid), "-n", "--", filepath.Join(built, "membranectl")}, args...)
	full = append(full, "--kubeconfig", filepath.Join(c.Dir, "admin.kubeconfig"))
	return exec.Command(c.tools["nsenter"], full...)
}

// connectivity runs the connectivity test with agnhost (imported, never
// pulled) and returns its JSON report, its stderr and its exit.
func (c *cluster) connectivity(t *testing.T, args ...string) (*conn.ConnectivityReport, string, error) {
	t.Helper()
	full := append([]string{"connectivity", "test", "-o", "json", "--image", agnhostRef, "--image-pull-policy", "Never"}, args...)
	cmd := c.ctl(full...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var rep conn.ConnectivityReport
	if derr := json.Unmarshal(stdout.Bytes(), &rep); derr != nil {
		t.Fatalf("connectivity test printed no report (%v, exit %v):\n%s\n%s", derr, err, stdout.String(), stderr.String())
	}
	return &rep, stderr.String(), err
}
