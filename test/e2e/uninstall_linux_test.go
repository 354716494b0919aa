//go:build linux

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
	"github.com/membrane-cni/membrane/test/nodesnap"
)

// TestUninstall installs Membrane on a 2-node cluster of its own and
// uninstalls it as docs/install.md says, then checks that every node is
// as it was before the install. The nodes come up without a CNI; each
// is snapshotted (test/nodesnap, in the node's network and mount
// namespaces: devices, addresses, routes of every table, rules,
// permanent neighbours, nftables and legacy iptables, qdiscs, tc and TCX
// programs on every device, the BPF programs attached to the node's pod
// cgroup, the node's bpffs, CNI directories, /run/membrane,
// /var/lib/membrane and /run/netns). Then the chart is applied with
// every feature that leaves something on a node (the kube-proxy
// replacement with socket-level translation on the pod cgroup and
// from_netdev on eth0, BPF hostPorts, the L7 and DNS proxies,
// masquerade, health, the tunnel), pods talk across nodes directly and
// through a Service, and the nodes are drained. The uninstall: the
// chart's objects deleted (helm uninstall: the CRDs stay), then
// deploy/kubernetes/uninstall/cleanup.yaml applied (with the cluster's
// image and CNI paths, as a user with other paths would edit it) until
// its pod runs on every node, then deleted. Each node must then equal
// its snapshot (what kubelet removes once pods are gone is waited for).
func TestUninstall(t *testing.T) {
	c := requireCluster(t)
	if c.cni != "membrane" {
		t.Skip("needs the Membrane images")
	}
	ctx := context.Background()
	t0 := time.Now()
	values := []string{"kubeProxyReplacement=true", "devices={eth0}", "cgroup.hostRoot=" + nodeCgroup2, "l7Proxy=true", "dnsProxy=true"}
	u, err := up(ctx, clusterConfig{Nodes: 2, CNI: "membrane", Bin: c.bin, Tools: c.tools, Built: built, Deferred: true, Values: values})
	if err != nil {
		t.Fatalf("cluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dumpLogs(u)
		}
		if err := u.down(context.Background()); err != nil {
			t.Errorf("cluster teardown: %v", err)
		}
	})
	n0, n1 := u.nodes[0], u.nodes[1]
	before := map[string][]string{}
	for _, n := range u.nodes {
		before[n.name] = u.snapshot(t, n)
	}
	tUp := time.Since(t0)

	if err := u.installMembrane(ctx, versionA); err != nil {
		t.Fatal(err)
	}
	if err := u.waitInstalled(ctx); err != nil {
		t.Fatal(err)
	}
	tInstalled := time.Since(t0)
	ns := u.namespace(t, "uninstall", nil)
	pods := u.createPods(t,
		podSpec(ns, "client", n0.name, map[string]string{"app": "client"}),
		podSpec(ns, "server", n1.name, map[string]string{"app": "server"}))
	client, server := pods[ns+"/client"], pods[ns+"/server"]
	svcIP := u.tcpUDPService(t, ns, "server", "app", "server")
	from := mustNetns(t, client)
	for proto, svcPort := range map[string]int{"tcp": 80, "udp": 81} {
		testutil.EventuallyErr(t, proto+" pod to pod across nodes", func() error { return reachable(from, server, 80, proto, true) })
		testutil.EventuallyErr(t, proto+" through the Service", func() error {
			return answers(from, svcIP, svcPort, proto, ns+"/server")
		})
	}
	// The install must show in every part of the snapshot the uninstall
	// is checked on, else a leftover there could pass unseen.
	for _, n := range u.nodes {
		diff := strings.Join(nodesnap.Diff(before[n.name], u.snapshot(t, n)), "\n")
		for _, want := range []string{"+ link: ", "+ route4: ", "+ nft: table inet membrane", "+ filter ", "+ cgroup ",
			"+ file: /sys/fs/bpf/membrane/", "+ file: " + nodeCNIConf + "/05-membrane.conflist", "+ file: " + nodeCNIBin + "/membrane-cni"} {
			if !strings.Contains(diff, want) {
				t.Errorf("%s: the install shows no %q in the snapshot:\n%s", n.name, want, diff)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// Drain: the test's pods and the cluster DNS go (kubelet runs their
	// CNI DELs while the agents are up).
	tDrain := time.Now()
	u.deleteNamespace(t, ns)
	scale := []byte(`{"spec":{"replicas":0}}`)
	if _, err := u.client.AppsV1().Deployments("kube-system").Patch(ctx, "coredns", "application/merge-patch+json", scale, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	u.waitOnlyAgents(t)
	// helm uninstall: the chart's objects but its CRDs.
	objs, err := u.renderChart(versionA)
	if err != nil {
		t.Fatal(err)
	}
	var release []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" {
			release = append(release, o)
		}
	}
	if err := kubetest.Delete(ctx, u.cfg, release); err != nil {
		t.Fatal(err)
	}
	u.waitNoPods(t, agentNamespace, agentSelector)
	// The cleanup step.
	cleanup := cleanupObjects(t)
	if _, err := kubetest.Apply(ctx, u.cfg, "membrane-e2e", cleanup); err != nil {
		t.Fatal(err)
	}
	u.waitCleaned(t)
	for _, n := range u.nodes {
		logs, _ := filepath.Glob(filepath.Join(n.dir, "pod-logs", "kube-system_membrane-cleanup-*", "cleanup", "*.log"))
		for _, f := range logs {
			data, _ := os.ReadFile(f)
			t.Logf("%s: membrane-agent cleanup:\n%s", n.name, data)
		}
	}
	if err := kubetest.Delete(ctx, u.cfg, cleanup); err != nil {
		t.Fatal(err)
	}
	u.waitNoPods(t, "kube-system", cleanupSelector)
	tUninstalled := time.Since(tDrain)

	for _, n := range u.nodes {
		var diff []string
		err := testutil.WaitFor(time.Minute, func() bool {
			diff = nodesnap.Diff(before[n.name], u.snapshot(t, n))
			return len(diff) == 0
		})
		if err != nil {
			t.Errorf("%s after the uninstall differs from before the install (- before only, + after only):\n%s", n.name, strings.Join(diff, "\n"))
		}
	}
	t.Logf("cluster up %s, installed %s, drain and uninstall %s, total %s", tUp.Round(time.Millisecond), (tInstalled - tUp).Round(time.Millisecond),
		tUninstalled.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
}

// cleanupSelector selects deploy/kubernetes/uninstall/cleanup.yaml's pods.
const cleanupSelector = "app.kubernetes.io/name=membrane-cleanup"

// cleanupObjects is deploy/kubernetes/uninstall/cleanup.yaml with the
// cluster's image and the nodes' CNI directories.
func cleanupObjects(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(kubetest.RepoRoot(), "deploy", "kubernetes", "uninstall", "cleanup.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.ReadObjects(raw)
	if err != nil {
		t.Fatal(err)
	}
	paths := map[string]string{"/opt/cni/bin": nodeCNIBin, "/etc/cni/net.d": nodeCNIConf}
	for _, o := range objs {
		spec, ok, _ := unstructured.NestedMap(o.Object, "spec", "template", "spec")
		if !ok {
			continue
		}
		for _, key := range []string{"initContainers", "containers"} {
			cs, _, _ := unstructured.NestedSlice(spec, key)
			for _, ci := range cs {
				cm := ci.(map[string]any)
				cm["image"] = agentRepo + ":" + versionA
				cm["imagePullPolicy"] = "Never"
			}
			_ = unstructured.SetNestedSlice(spec, cs, key)
		}
		vols, _, _ := unstructured.NestedSlice(spec, "volumes")
		for _, vi := range vols {
			hp, ok := vi.(map[string]any)["hostPath"].(map[string]any)
			if !ok {
				continue
			}
			if p, ok := paths[hp["path"].(string)]; ok {
				hp["path"] = p
			}
		}
		_ = unstructured.SetNestedSlice(spec, vols, "volumes")
		_ = unstructured.SetNestedMap(o.Object, spec, "spec", "template", "spec")
	}
	return objs
}

// snapshot is node n's state (test/nodesnap) in its network and mount
// namespaces.
func (c *cluster) snapshot(t *testing.T, n *node) []string {
	t.Helper()
	lines, err := nodesnap.Take(nodesnap.Node{
		Exec: func(name string, args ...string) (string, error) {
			out, err := exec.Command(c.tools["nsenter"], append([]string{"-t", strconv.Itoa(n.pid), "-n", "-m", "--", name}, args...)...).CombinedOutput()
			return string(out), err
		},
		Do:      func(fn func() error) error { return inNetns(n.netnsPath(), fn) },
		Root:    fmt.Sprintf("/proc/%d/root", n.pid),
		Dirs:    []string{"/sys/fs/bpf", nodeCNIBin, nodeCNIConf, "/run/membrane", "/var/lib/membrane", "/run/netns"},
		Cgroups: nodePodCgroup2(n),
	})
	if err != nil {
		t.Fatalf("snapshot of %s: %v", n.name, err)
	}
	return lines
}

// nodePodCgroup2 is n's pod cgroup in the cgroup2 hierarchy (the chart's
// cgroup.hostRoot with the kube-proxy replacement), if mounted.
func nodePodCgroup2(n *node) []string {
	if cg2 := testutil.Cgroup2Mount(); cg2 != "" {
		return []string{filepath.Join(cg2, n.cgroup)}
	}
	return nil
}

// waitOnlyAgents waits until the nodes run no pod but the agents'.
func (c *cluster) waitOnlyAgents(t *testing.T) {
	t.Helper()
	testutil.EventuallyErr(t, "the nodes drained", func() error {
		pods, err := c.client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.Namespace != agentNamespace && p.Spec.NodeName != "" {
				return fmt.Errorf("pod %s/%s on %s", p.Namespace, p.Name, p.Spec.NodeName)
			}
		}
		return nil
	})
}

// waitNoPods waits until no pod in ns matches selector (kubelet removed
// them).
func (c *cluster) waitNoPods(t *testing.T, ns, selector string) {
	t.Helper()
	if err := testutil.WaitFor(3*time.Minute, func() bool {
		pods, err := c.client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
		return err == nil && len(pods.Items) == 0
	}); err != nil {
		t.Fatalf("pods %s in %s not gone: %v", selector, ns, err)
	}
}

// waitCleaned waits until the cleanup DaemonSet's pod runs on every node:
// its init container (membrane-agent cleanup) succeeded there.
func (c *cluster) waitCleaned(t *testing.T) {
	t.Helper()
	var last string
	err := testutil.WaitFor(3*time.Minute, func() bool {
		pods, err := c.client.CoreV1().Pods("kube-system").List(context.Background(), metav1.ListOptions{LabelSelector: cleanupSelector})
		if err != nil {
			last = err.Error()
			return false
		}
		running := map[string]bool{}
		var states []string
		for _, p := range pods.Items {
			states = append(states, p.Spec.NodeName+": "+podState(&p))
			if p.Status.Phase == "Running" {
				running[p.Spec.NodeName] = true
			}
		}
		last = strings.Join(states, "; ")
		for _, n := range c.nodes {
			if !running[n.name] {
				return false
			}
		}
		return true
	})
	if err != nil {
		t.Fatalf("the cleanup pods not running on every node: %v (last: %s)", err, last)
	}
}
