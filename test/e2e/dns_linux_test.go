//go:build linux

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// coreDNSImage is the cluster DNS's image: CoreDNS from
// scripts/coredns.sh, imported into every node's containerd.
const coreDNSImage = "localhost/coredns:v1.15.0"

// installDNS creates the cluster DNS of testdata/coredns.yaml (kubeadm's
// CoreDNS addon: ServiceAccount, RBAC, Corefile, Deployment, the kube-dns
// Service at dnsIP) with one replica per node up to two. It does not wait:
// the scheduler places the pods once nodes are Ready; a test that needs
// names waits for the Deployment (waitDNS).
func (c *cluster) installDNS(ctx context.Context, nodes int) error {
	raw, err := os.ReadFile("testdata/coredns.yaml")
	if err != nil {
		return err
	}
	manifest := strings.NewReplacer("@IMAGE@", coreDNSImage, "@REPLICAS@", strconv.Itoa(min(nodes, 2)),
		"@DNS_IP@", dnsIP.String(), "@DOMAIN@", clusterDomain).Replace(string(raw))
	decode := scheme.Codecs.UniversalDeserializer().Decode
	for _, doc := range strings.Split(manifest, "\n---\n") {
		obj, _, err := decode([]byte(doc), nil, nil)
		if err != nil {
			return fmt.Errorf("testdata/coredns.yaml: %w", err)
		}
		opts := metav1.CreateOptions{}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			_, err = c.client.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, opts)
		case *rbacv1.ClusterRole:
			_, err = c.client.RbacV1().ClusterRoles().Create(ctx, o, opts)
		case *rbacv1.ClusterRoleBinding:
			_, err = c.client.RbacV1().ClusterRoleBindings().Create(ctx, o, opts)
		case *corev1.ConfigMap:
			_, err = c.client.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, opts)
		case *appsv1.Deployment:
			_, err = c.client.AppsV1().Deployments(o.Namespace).Create(ctx, o, opts)
		case *corev1.Service:
			_, err = c.client.CoreV1().Services(o.Namespace).Create(ctx, o, opts)
		default:
			return fmt.Errorf("testdata/coredns.yaml: unexpected %T", obj)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("cluster DNS: create %T: %w", obj, err)
		}
	}
	return nil
}

// waitDNS waits until every CoreDNS replica is available (ready: the
// kubernetes plugin has synced with the API server, reached through the
// kubernetes Service with its projected token).
func (c *cluster) waitDNS(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	testutil.EventuallyErr(t, "the cluster DNS available", func() error {
		d, err := c.client.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Spec.Replicas == nil || d.Status.AvailableReplicas < *d.Spec.Replicas {
			return fmt.Errorf("coredns: %d of %v replicas available", d.Status.AvailableReplicas, d.Spec.Replicas)
		}
		return nil
	})
}

// ask sends one request line to the probe at to:80 from the netns at
// from and returns its answer without the answering pod's name.
func ask(from string, to netip.Addr, line string) (string, error) {
	var answer string
	err := inNetns(from, func() error {
		conn, err := net.DialTimeout("tcp", netip.AddrPortFrom(to, 80).String(), 5*time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
		if _, err := fmt.Fprintln(conn, line); err != nil {
			return err
		}
		got, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			return err
		}
		_, answer, _ = strings.Cut(strings.TrimSuffix(got, "\n"), " ")
		return nil
	})
	return answer, err
}

// TestClusterDNS: a pod resolves through the cluster DNS (CoreDNS behind
// the kube-dns Service, which only Membrane's Service translation makes
// reachable: no kube-proxy) with its own resolver and kubelet's
// resolv.conf: the kubernetes Service by its full name, a test Service
// by its short name (the namespace's search domain), and connects to
// that Service by name. Its pod has the projected service-account token
// (ServiceAccount admission, tokens from the controller manager).
func TestClusterDNS(t *testing.T) {
	c := requireCluster(t)
	c.waitDNS(t)
	ns := c.namespace(t, "dns", nil)
	pods := c.createPods(t,
		podSpec(ns, "web", "", map[string]string{"app": "web"}),
		podSpec(ns, "client", "", map[string]string{"app": "client"}))
	client := pods[ns+"/client"]
	webIP := c.service(t, ns, "web", "app", "web")
	from, clientIP := mustNetns(t, client), podIP(t, client)

	token := false
	for _, v := range client.Spec.Volumes {
		token = token || (v.Projected != nil && strings.HasPrefix(v.Name, "kube-api-access-"))
	}
	if !token {
		t.Errorf("pod %s/client has no projected service-account token volume: %+v", ns, client.Spec.Volumes)
	}
	kubernetesIP := serviceCIDR.Addr().Next()
	for _, tc := range []struct{ name, want string }{
		{"kubernetes.default.svc." + clusterDomain, kubernetesIP.String()},
		{"kubernetes.default", kubernetesIP.String()},
		{"web", webIP.String()},
		{"web." + ns + ".svc." + clusterDomain, webIP.String()},
	} {
		testutil.EventuallyErr(t, "resolve "+tc.name+" in the pod", func() error {
			got, err := ask(from, clientIP, "resolve "+tc.name)
			if err != nil {
				return err
			}
			if got != tc.want {
				return fmt.Errorf("resolve %s: %q, want %s", tc.name, got, tc.want)
			}
			return nil
		})
	}
	testutil.EventuallyErr(t, "connect to the web Service by name", func() error {
		got, err := ask(from, clientIP, "connect web:80")
		if err != nil {
			return err
		}
		if who, _, _ := strings.Cut(got, " "); who != ns+"/web" {
			return fmt.Errorf("connect web:80: answer %q, want one from %s/web", got, ns)
		}
		return nil
	})
}
