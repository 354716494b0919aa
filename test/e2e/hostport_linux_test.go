//go:build linux

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestHostPort: a pod's ports[].hostPort through kubelet. With the
// kube-proxy replacement the chart's hostPorts (auto) runs install-cni
// --host-ports bpf: the installed conflist has the portMappings
// capability, kubelet's mappings reach membrane-cni in runtimeConfig and
// the agent maps them in BPF. The pod answers at its node's address on
// the host port, TCP and UDP, from a pod on the other node, from the
// other node's own network namespace and from the control plane's
// (outside every node); once the pod is deleted nothing answers there.
func TestHostPort(t *testing.T) {
	c := requireCluster(t)
	if !kubeProxyReplacement() {
		t.Skip("needs the kube-proxy replacement (E2E_KUBE_PROXY_REPLACEMENT=1): without it the chart's hostPorts auto installs no hostPort support")
	}
	if len(c.nodes) < 2 {
		t.Skip("needs 2 nodes (E2E_NODES)")
	}
	n0, n1 := c.nodes[0], c.nodes[1]
	conf, err := os.ReadFile(filepath.Join(n0.dir, "net.d", "05-membrane.conflist"))
	if err != nil || !strings.Contains(string(conf), `"portMappings"`) {
		t.Fatalf("installed conflist has no portMappings capability (%v):\n%s", err, conf)
	}
	ns := c.namespace(t, "hostport", nil)
	srv := podSpec(ns, "server", n0.name, nil)
	srv.Spec.Containers[0].Ports = []corev1.ContainerPort{
		{ContainerPort: 80, HostPort: 30080, Protocol: corev1.ProtocolTCP},
		{ContainerPort: 81, HostPort: 30081, Protocol: corev1.ProtocolUDP},
	}
	pods := c.createPods(t, srv, podSpec(ns, "client", n1.name, nil))
	want := ns + "/server"
	froms := map[string]string{
		"a pod on " + n1.name: mustNetns(t, pods[ns+"/client"]),
		n1.name + "'s host":   n1.netnsPath(),
		"the control plane":   fmt.Sprintf("/proc/%d/ns/net", c.cpPid),
	}
	for what, from := range froms {
		for _, p := range []struct {
			proto string
			port  int
		}{{"tcp", 30080}, {"udp", 30081}} {
			testutil.EventuallyErr(t, fmt.Sprintf("%s %s:%d from %s", p.proto, n0.ip, p.port, what), func() error {
				return answers(from, n0.ip, p.port, p.proto, want)
			})
		}
	}
	ctx := context.Background()
	if err := c.client.CoreV1().Pods(ns).Delete(ctx, "server", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	from := froms["the control plane"]
	testutil.EventuallyErr(t, "the host port closed with its pod", func() error {
		if who, err := dial(from, n0.ip, 30080, "tcp", time.Second); err == nil {
			return fmt.Errorf("%s:30080 still answered by %s", n0.ip, who)
		}
		return nil
	})
}

// answers dials addr:port over proto from the netns at from and checks
// that want (namespace/name) answered.
func answers(from string, addr netip.Addr, port int, proto, want string) error {
	who, err := dial(from, addr, port, proto, 2*time.Second)
	if err != nil {
		return err
	}
	if who != want {
		return fmt.Errorf("answered by %q, want %s", who, want)
	}
	return nil
}
