//go:build linux

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/image"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// The agent runs as users install it (issue 34): the Helm chart
// (deploy/helm/membrane) rendered with the Helm Go SDK (tools/chart) and
// applied, the DaemonSet's pod on every node from the image make image
// builds, imported into each node's containerd. Its init containers
// install membrane-cni and the conflist into the node's CNI directories
// (the node is NotReady until then), its agent container runs with the
// ServiceAccount's token.
const (
	agentNamespace = "membrane-system"
	agentRepo      = "localhost/membrane"
	// agentSelector selects the DaemonSet's pods.
	agentSelector = "app.kubernetes.io/name=membrane-agent"
	// agentNodeLabel is the node label the DaemonSet's nodeSelector wants
	// ("pod"); a test that needs a host-process agent on a node sets it
	// to "host" and the DaemonSet controller removes the node's pod
	// (hostAgent).
	agentNodeLabel = "membrane-e2e.io/agent"
	// The two versions of the image (make image's -X main.version): the
	// suite installs versionA; TestUpgradeUnderTraffic rolls to versionB
	// and back.
	versionA = "e2e-a"
	versionB = "e2e-b"
)

// Paths inside every node's mount namespace, the same on each node (one
// DaemonSet template serves them all): bind mounts of the node's own CNI
// directories and of its pod cgroup in the cgroup2 hierarchy (the chart's
// cni.binPath, cni.confPath, cgroup.hostRoot). Under the node's private
// /run: nothing of the host's is written.
const (
	nodeCNIBin  = "/run/e2e/cni/bin"
	nodeCNIConf = "/run/e2e/cni/net.d"
	nodeCgroup2 = "/run/e2e/cgroup2"
)

// buildMembraneImages builds the four programs static, as make image does
// (-trimpath -s -w, -X main.version), with the pause and probe programs,
// into dir, and writes the image tarballs membrane-<version>.tar for
// versionA and versionB (which differ in membrane-agent's version string
// only). dir's membrane-agent and membrane-cni are versionA's: the
// host-process agent and the plugin tests exec.
func buildMembraneImages(dir string) error {
	pkgs := []string{"github.com/membrane-cni/membrane/cmd/membrane-agent", "github.com/membrane-cni/membrane/cmd/membrane-cni",
		"github.com/membrane-cni/membrane/cmd/membrane-proxy", "github.com/membrane-cni/membrane/cmd/membranectl"}
	if err := goBuildStatic(dir, versionA, append(slices.Clone(pkgs), "../cri/testdata/pause", "./testdata/probe")...); err != nil {
		return err
	}
	bdir := filepath.Join(dir, versionB)
	if err := os.MkdirAll(bdir, 0o755); err != nil {
		return err
	}
	if err := goBuildStatic(bdir, versionB, pkgs[0]); err != nil {
		return err
	}
	for _, p := range image.Programs {
		if p == "membrane-agent" {
			continue
		}
		if err := os.Link(filepath.Join(dir, p), filepath.Join(bdir, p)); err != nil {
			return err
		}
	}
	for v, bin := range map[string]string{versionA: dir, versionB: bdir} {
		spec, err := image.Membrane(agentRepo+":"+v, bin, "../../deploy/05-membrane.conflist", v)
		if err != nil {
			return err
		}
		if _, err := image.Write(spec, filepath.Join(dir, "membrane-"+v+".tar")); err != nil {
			return err
		}
	}
	return nil
}

// goBuildStatic is make image's build: static, -trimpath, stripped, the
// version in main.version.
func goBuildStatic(dir, version string, pkgs ...string) error {
	args := append([]string{"build", "-trimpath", "-ldflags", "-s -w -X main.version=" + version, "-o", dir + "/"}, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// chartValues are the e2e cluster's values (Helm's --set syntax) for the
// image tag: the API server at its address (no kube-proxy translates the
// kubernetes Service before the agent runs), the cluster's pod CIDR, the
// node paths above, the kube-proxy replacement with
// E2E_KUBE_PROXY_REPLACEMENT=1, the routing mode E2E_ROUTING (tunnel or
// native; the chart's default, tunnel, when unset).
func chartValues(tag string) []string {
	sets := []string{"createNamespace=true",
		"image.repository=" + agentRepo, "image.tag=" + tag, "image.pullPolicy=Never",
		"k8sServiceHost=" + apiIP.String(), "k8sServicePort=6443",
		"clusterCIDRs={" + clusterCIDR.String() + "}",
		"cni.binPath=" + nodeCNIBin, "cni.confPath=" + nodeCNIConf,
		"nodeSelector." + strings.ReplaceAll(agentNodeLabel, ".", `\.`) + "=pod",
	}
	if kubeProxyReplacement() {
		sets = append(sets, "kubeProxyReplacement=true", "devices={eth0}", "cgroup.hostRoot="+nodeCgroup2)
	}
	if os.Getenv("E2E_L7") == "1" {
		// The L7 proxy on (make conformance: the connectivity test's L7
		// checks).
		sets = append(sets, "l7Proxy=true")
	}
	if r := os.Getenv("E2E_ROUTING"); r != "" {
		// native: the nodes share the underlay bridge, so routes to each
		// other's pod CIDRs via their addresses work (default: tunnel).
		sets = append(sets, "routingMode="+r)
	}
	if caps := agentCapabilities(); caps != nil {
		sets = append(sets, "securityContext.capabilities.agent={"+strings.Join(caps, ",")+"}")
	}
	return sets
}

// chartCapabilities are the chart's default agent capabilities and their
// numbers (linux/capability.h).
var chartCapabilities = []struct {
	name string
	bit  uint
}{{"NET_ADMIN", 12}, {"NET_RAW", 13}, {"BPF", 39}, {"PERFMON", 38}, {"SYS_ADMIN", 21}, {"SYS_RESOURCE", 24},
	{"IPC_LOCK", 14}, {"KILL", 5}, {"DAC_OVERRIDE", 1}, {"FOWNER", 3}, {"CHOWN", 0}}

// agentCapabilities is the chart's list without the capabilities this
// process's bounding set lacks (runc cannot grant those: "unable to
// apply caps"), nil when it has them all. This machine runs without
// CAP_SYS_RESOURCE, which the agent needs only on kernels before 5.11.
func agentCapabilities() []string {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil
	}
	var bnd uint64
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "CapBnd:"); ok {
			bnd, err = strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return nil
			}
		}
	}
	var caps []string
	for _, c := range chartCapabilities {
		if bnd&(1<<c.bit) != 0 {
			caps = append(caps, c.name)
		}
	}
	if len(caps) == len(chartCapabilities) {
		return nil
	}
	return caps
}

// installMembrane renders the chart for the image tag and applies it
// (server-side, as helm install or upgrade would write the objects); it
// keeps the ConfigMap's flags for the host-process agent (agentArgs).
func (c *cluster) installMembrane(ctx context.Context, tag string) error {
	objs, err := c.renderChart(tag)
	if err != nil {
		return err
	}
	flags := map[string]string{}
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" && o.GetName() == "membrane-config" {
			data, _, _ := unstructuredStrings(o.Object, "data")
			for k, v := range data {
				if !strings.HasSuffix(k, ".conflist") {
					flags[k] = v
				}
			}
		}
	}
	if len(flags) == 0 {
		return fmt.Errorf("the chart rendered no membrane-config ConfigMap")
	}
	if _, err := kubetest.Apply(ctx, c.cfg, "membrane-e2e", objs); err != nil {
		return fmt.Errorf("apply the chart: %w", err)
	}
	c.agentFlags = flags
	return nil
}

// renderChart renders the chart for the image tag with the cluster's
// values.
func (c *cluster) renderChart(tag string) ([]*unstructured.Unstructured, error) {
	objs, err := kubetest.RenderChart(agentNamespace, append(chartValues(tag), c.values...)...)
	if err != nil {
		return nil, fmt.Errorf("render the chart: %w", err)
	}
	return objs, nil
}

// unstructuredStrings reads a map of strings at path.
func unstructuredStrings(obj map[string]any, path string) (map[string]string, bool, error) {
	m, ok := obj[path].(map[string]any)
	if !ok {
		return nil, false, nil
	}
	out := map[string]string{}
	for k, v := range m {
		if s, ok := v.(string); ok {
			out[k] = s
		}
	}
	return out, true, nil
}

// kubeProxyReplacement reports E2E_KUBE_PROXY_REPLACEMENT=1 (make
// conformance sets it).
func kubeProxyReplacement() bool { return os.Getenv("E2E_KUBE_PROXY_REPLACEMENT") == "1" }

// agentPod returns n's agent pod (the DaemonSet's, not being deleted) or
// an error saying why there is none yet.
func (c *cluster) agentPod(ctx context.Context, n *node) (*corev1.Pod, error) {
	pods, err := c.client.CoreV1().Pods(agentNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: agentSelector, FieldSelector: "spec.nodeName=" + n.name})
	if err != nil {
		return nil, err
	}
	var live []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	if len(live) != 1 {
		return nil, fmt.Errorf("%d agent pods on %s", len(live), n.name)
	}
	return &live[0], nil
}

// waitAgentPod waits until n's agent pod is Ready (its readiness probe,
// membranectl status) and answers on the node's socket, and returns it.
func (c *cluster) waitAgentPod(ctx context.Context, n *node, limit time.Duration) (*corev1.Pod, error) {
	var pod *corev1.Pod
	var last error
	cl := client.New(n.agentSocket())
	defer cl.Close()
	err := testutil.WaitFor(limit, func() bool {
		if last = n.failed(); last != nil {
			return true
		}
		pod, last = c.agentPod(ctx, n)
		if last != nil {
			return false
		}
		if !podReady(pod) {
			last = fmt.Errorf("pod %s not Ready: %s", pod.Name, podState(pod))
			return false
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, last = cl.Status(sctx)
		return last == nil
	})
	if err == nil {
		err = last
	}
	if err != nil {
		return nil, fmt.Errorf("agent pod on %s: %w (last: %v)", n.name, err, last)
	}
	return pod, nil
}

func podReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podState summarises a pod's containers for an error.
func podState(p *corev1.Pod) string {
	var b strings.Builder
	fmt.Fprintf(&b, "phase %s", p.Status.Phase)
	for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
		fmt.Fprintf(&b, "; %s ready=%v restarts=%d", cs.Name, cs.Ready, cs.RestartCount)
		switch {
		case cs.State.Waiting != nil:
			fmt.Fprintf(&b, " waiting %s %s", cs.State.Waiting.Reason, cs.State.Waiting.Message)
		case cs.State.Terminated != nil:
			fmt.Fprintf(&b, " terminated %s (%d)", cs.State.Terminated.Reason, cs.State.Terminated.ExitCode)
		}
	}
	return b.String()
}

// setAgentLabel sets n's agentNodeLabel.
func (c *cluster) setAgentLabel(ctx context.Context, n *node, value string) error {
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, agentNodeLabel, value)
	_, err := c.client.CoreV1().Nodes().Patch(ctx, n.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// hostAgent hands node n from the DaemonSet's pod to a membrane-agent
// process the test controls (n.procs["agent"]), for the tests that kill
// or stop the agent and start it again at a moment of their choosing: a
// SIGKILLed container would be restarted by kubelet at once, and a
// deleted pod recreated by the DaemonSet controller. The node's label
// takes it out of the DaemonSet's nodeSelector (the controller deletes
// its pod: SIGTERM, which releases nothing), then the process starts on
// the same state, socket and pins, with the ConfigMap's flags. At the
// end of the test the process is stopped (SIGTERM) and the node handed
// back: the DaemonSet's pod restores the state again.
func (c *cluster) hostAgent(t *testing.T, n *node) {
	t.Helper()
	ctx := context.Background()
	if err := c.setAgentLabel(ctx, n, "host"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.stopAgent(); err != nil {
			t.Errorf("stop the host agent: %v", err)
		}
		if err := c.setAgentLabel(ctx, n, "pod"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.waitAgentPod(ctx, n, 3*time.Minute); err != nil {
			t.Fatalf("node %s handed back to the DaemonSet: %v", n.name, err)
		}
	})
	if err := testutil.WaitFor(2*time.Minute, func() bool {
		pods, err := c.client.CoreV1().Pods(agentNamespace).List(ctx, metav1.ListOptions{
			LabelSelector: agentSelector, FieldSelector: "spec.nodeName=" + n.name})
		return err == nil && len(pods.Items) == 0
	}); err != nil {
		t.Fatalf("the DaemonSet's pod on %s not gone: %v", n.name, err)
	}
	if err := n.startAgent(ctx); err != nil {
		t.Fatalf("host agent on %s: %v", n.name, err)
	}
}
