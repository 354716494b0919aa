//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// hostSnapshot summarises what teardown must leave as it found it: the
// host's links, the network namespaces of all processes, host mounts,
// the e2e cgroups and the host bpffs's entries. Other suites run concurrently, so the numbers are
// for the log; teardown's own check (leftovers) is exact.
func hostSnapshot() string {
	links, _ := net.Interfaces()
	nets := map[string]bool{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if ns, err := os.Readlink("/proc/" + e.Name() + "/ns/net"); err == nil {
			nets[ns] = true
		}
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	cgs, _ := filepath.Glob("/sys/fs/cgroup/*/membrane-e2e-*")
	// The agents' pins live in each node's own bpffs, never the host's.
	pins, _ := os.ReadDir("/sys/fs/bpf")
	return fmt.Sprintf("{links %d, netns %d, mounts %d, e2e cgroups %d, host bpffs entries %d}",
		len(links), len(nets), bytes.Count(mi, []byte("\n")), len(cgs), len(pins))
}

// namespace creates a namespace with labels and deletes it at the end of
// the test: the namespace controller deletes its pods (kubelet runs their
// CNI DELs) and everything else in it; the cleanup waits until it is gone.
func (c *cluster) namespace(t *testing.T, name string, labels map[string]string) string {
	t.Helper()
	ctx := context.Background()
	_, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() { c.deleteNamespace(t, name) })
	return name
}

// deleteNamespace deletes ns and waits until the namespace controller has
// finished (its pods gone, the namespace removed).
func (c *cluster) deleteNamespace(t *testing.T, ns string) {
	ctx := context.Background()
	if err := c.client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete namespace %s: %v", ns, err)
		return
	}
	if err := testutil.WaitFor(3*time.Minute, func() bool {
		_, err := c.client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}); err != nil {
		t.Errorf("namespace %s not deleted: %v", ns, err)
	}
}

// deletePods deletes every pod in ns and waits until kubelet removed
// them, at most limit; it returns how long that took.
func (c *cluster) deletePods(t *testing.T, ns string, limit time.Duration) time.Duration {
	ctx := context.Background()
	t0 := time.Now()
	if err := c.client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Errorf("delete pods in %s: %v", ns, err)
		return 0
	}
	left := 0
	if err := testutil.WaitFor(limit, func() bool {
		l, err := c.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			left = len(l.Items)
		}
		return err == nil && left == 0
	}); err != nil {
		t.Errorf("pods in %s not gone: %v (%d left)", ns, err, left)
	}
	return time.Since(t0)
}

// podSpec is a probe pod; the scheduler places it unless node names the
// node it must run on (a test that needs it there).
func podSpec(ns, name, node string, labels map[string]string) *corev1.Pod {
	zero := int64(1)
	env := func(k, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: k, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: &zero,
			EnableServiceLinks:            new(bool),
			Containers: []corev1.Container{{
				Name: "probe", Image: probeImage, ImagePullPolicy: corev1.PullNever,
				Env: []corev1.EnvVar{env("POD_NAME", "metadata.name"), env("POD_NAMESPACE", "metadata.namespace"), env("POD_UID", "metadata.uid")},
			}},
		},
	}
}

// createPods creates pods and waits until all are Running with an IP.
func (c *cluster) createPods(t *testing.T, pods ...*corev1.Pod) map[string]*corev1.Pod {
	t.Helper()
	ctx := context.Background()
	for _, p := range pods {
		if _, err := c.client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create pod %s/%s: %v", p.Namespace, p.Name, err)
		}
	}
	out := map[string]*corev1.Pod{}
	for _, p := range pods {
		got, err := c.waitRunning(ctx, p.Namespace, p.Name)
		if err != nil {
			t.Fatal(err)
		}
		out[p.Namespace+"/"+p.Name] = got
	}
	return out
}

// waitRunning waits until the pod is Running with a pod IP.
func (c *cluster) waitRunning(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	var pod *corev1.Pod
	err := testutil.WaitFor(3*time.Minute, func() bool {
		p, err := c.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		pod = p
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != ""
	})
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s not Running with an IP: %w (last status %+v)", ns, name, err, statusOf(pod))
	}
	return pod, nil
}

func statusOf(p *corev1.Pod) any {
	if p == nil {
		return nil
	}
	return p.Status
}

// nodeOf is the node the pod runs on.
func (c *cluster) nodeOf(t testing.TB, p *corev1.Pod) *node {
	t.Helper()
	for _, n := range c.nodes {
		if n.name == p.Spec.NodeName {
			return n
		}
	}
	t.Fatalf("pod %s/%s: on node %q, not one of the cluster's", p.Namespace, p.Name, p.Spec.NodeName)
	return nil
}

// podIP is the pod's status.podIP.
func podIP(t testing.TB, p *corev1.Pod) netip.Addr {
	t.Helper()
	ip, err := netip.ParseAddr(p.Status.PodIP)
	if err != nil {
		t.Fatalf("pod %s/%s: podIP %q: %v", p.Namespace, p.Name, p.Status.PodIP, err)
	}
	return ip
}

// podNetns is the network namespace of the pod's probe container, found
// by its POD_UID environment (the pods' processes are visible from the
// host: no pid namespace is shared with the nodes).
func podNetns(p *corev1.Pod) (string, error) {
	want := []byte("POD_UID=" + string(p.UID) + "\x00")
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !bytes.Contains(env, want) {
			continue
		}
		return "/proc/" + e.Name() + "/ns/net", nil
	}
	return "", fmt.Errorf("no process of pod %s/%s (uid %s)", p.Namespace, p.Name, p.UID)
}

// dial connects from the network namespace at from to addr:port over
// proto ("tcp" or "udp") and exchanges one line; it returns who answered
// (the server pod's namespace/name) or an error.
func dial(from string, to netip.Addr, port int, proto string, timeout time.Duration) (string, error) {
	var conn net.Conn
	addr := netip.AddrPortFrom(to, uint16(port)).String()
	if err := inNetns(from, func() error {
		var err error
		conn, err = net.DialTimeout(proto, addr, timeout)
		return err
	}); err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.Write([]byte("probe\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", proto, addr, err)
	}
	who, _, _ := strings.Cut(line, " ")
	return who, nil
}
