package multinode

import (
	"context"
	"net/netip"
	"net/url"
	"path/filepath"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// kubeAPIHost is the underlay host number of the netns that forwards to
// the test's kube-apiserver (address .153).
const kubeAPIHost = 152

// newKubeCluster makes n nodes in routing mode whose agents run in
// Kubernetes mode on a kube-apiserver of the test's own (reached through
// a forwarder on the underlay): a Node object per node (its underlay
// addresses as InternalIPs, its pod ranges as spec.podCIDRs) is created
// before the agents start; args are added to every agent's.
func newKubeCluster(t *testing.T, routing string, n int, netNum int, args []string) (*cluster, kubernetes.Interface) {
	t.Helper()
	testutil.RequireRoot(t)
	env := kubetest.StartOwn(t)
	env.InstallCRDs(t)
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, net: netNum, routing: routing, dir: t.TempDir(), args: args}
	c.makeUnderlay()
	fwd := c.attach("mbm-kapi", kubeAPIHost, "eth0")
	addr, _ := c.underlayAddrs(kubeAPIHost)
	u, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	forward(t, fwd, netip.AddrPortFrom(addr, uint16(port)), u.Host)
	kc, err := clientcmd.LoadFromFile(env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range kc.Clusters {
		cl.Server = "https://" + netip.AddrPortFrom(addr, uint16(port)).String()
		cl.TLSServerName = u.Hostname() // the serving certificate's address
	}
	c.kubeconfig = filepath.Join(c.dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, c.kubeconfig); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		nd := c.newNode(i)
		c.nodes = append(c.nodes, nd)
		ctx := context.Background()
		obj, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nd.name},
			Spec: corev1.NodeSpec{PodCIDR: nd.cidr4.String(), PodCIDRs: []string{nd.cidr4.String(), nd.cidr6.String()}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.CoreV1().Nodes().Delete(context.Background(), nd.name, metav1.DeleteOptions{}) })
		obj.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: nd.addr4.String()},
			{Type: corev1.NodeInternalIP, Address: nd.addr6.String()}}
		if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c.outside = c.attach("mbm-out", 199, "eth0")
	c.startNodes()
	return c, cs
}
