package deploy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/membrane-cni/membrane/test/kubetest"
)

// TestChartApply renders the Helm chart (the Helm Go SDK, tools/chart)
// with the values of each mode users choose, decodes every object into
// its typed Kubernetes object, and applies the rendering to a real
// kube-apiserver, in a namespace of its own: the CRDs are accepted, the
// DaemonSet, RBAC and admission policies are valid, and the ConfigMap the
// agent reads holds the mode.
func TestChartApply(t *testing.T) {
	env := kubetest.Require(t)
	// The variants share the cluster-wide objects (ClusterRole, CRDs,
	// admission policy) with the plain manifests: put those back.
	t.Cleanup(func() { applyAll(t, env) })
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		sets []string
		want map[string]string // ConfigMap data the agent reads
	}{
		{"defaults", nil, map[string]string{"routing": "tunnel", "masquerade": "true", "ipam": "kubernetes", "identity-allocation-mode": "crd"}},
		{"native-kpr-proxies", []string{"routingMode=native", "kubeProxyReplacement=true", "k8sServiceHost=10.99.0.1",
			"k8sServicePort=6443", "l7Proxy=true", "dnsProxy=true", "clusterCIDRs={10.244.0.0/16}", "devices={eth0}"},
			map[string]string{"routing": "native", "kube-proxy-replacement": "true", "k8s-api-server": "https://10.99.0.1:6443",
				"l7-proxy": "/usr/local/bin/membrane-proxy", "dns-proxy": "true", "cluster-cidr": "10.244.0.0/16", "devices": "eth0"}},
		{"kvstore-tls", []string{"identityAllocationMode=kvstore", "kvstore.endpoints={https://10.99.0.2:2379}", "kvstore.tlsSecret=etcd-client",
			"nodeRestriction.enabled=false", "resources.requests.cpu=100m", "nodeSelector.kubernetes\\.io/os=linux", "masquerade=false"},
			map[string]string{"kvstore": "etcd", "etcd-endpoints": "https://10.99.0.2:2379", "masquerade": "false"}},
		{"static-local", []string{"ipam.mode=static", "ipam.ipv4Range=10.201.0.0/24", "identityAllocationMode=local",
			"image.repository=registry.example/membrane", "image.tag=v1", "image.pullPolicy=Always", "logLevel=debug"},
			map[string]string{"ipam": "static", "ipv4-range": "10.201.0.0/24", "identity-allocation-mode": "local", "log-level": "debug"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := "membrane-chart-" + tc.name
			objs := kubetest.MustRenderChart(t, ns, append([]string{"createNamespace=true"}, tc.sets...)...)
			for _, o := range objs {
				typed, err := scheme.Scheme.New(o.GroupVersionKind())
				if err != nil {
					if o.GetKind() == "CustomResourceDefinition" {
						continue // not in client-go's scheme; the API server checks it below
					}
					t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
				}
				if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, typed, true); err != nil {
					t.Fatalf("%s %s does not decode into %T: %v", o.GetKind(), o.GetName(), typed, err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if _, err := kubetest.Apply(ctx, env.Config, "membrane-chart-test", objs); err != nil {
				t.Fatalf("apply the chart's rendering: %v", err)
			}
			t.Cleanup(func() {
				_ = cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
			})
			ds, err := cs.AppsV1().DaemonSets(ns).Get(ctx, "membrane-agent", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			checkDaemonSet(t, ds.Spec.Template.Spec)
			checkImage(t, ds, tc.sets)
			cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "membrane-config", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.want {
				if cm.Data[k] != v {
					t.Errorf("ConfigMap %s = %q, want %q", k, cm.Data[k], v)
				}
			}
			crb, err := cs.RbacV1().ClusterRoleBindings().Get(ctx, "membrane-agent", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if crb.Subjects[0].Namespace != ns {
				t.Errorf("ClusterRoleBinding subject %+v, want the release's namespace", crb.Subjects[0])
			}
		})
	}
}

// checkImage checks every container runs the image the values name.
func checkImage(t *testing.T, ds *appsv1.DaemonSet, sets []string) {
	t.Helper()
	want := "localhost/membrane:dev"
	if strings.Contains(strings.Join(sets, ","), "image.tag=v1") {
		want = "registry.example/membrane:v1"
	}
	for _, c := range append(ds.Spec.Template.Spec.InitContainers, ds.Spec.Template.Spec.Containers...) {
		if c.Image != want {
			t.Errorf("container %s image %s, want %s", c.Name, c.Image, want)
		}
	}
}

// TestChartRefusesValues: the renderer reports the chart's refusal of
// impossible values with the chart's message.
func TestChartRefusesValues(t *testing.T) {
	_, err := kubetest.RenderChart("membrane-system", "identityAllocationMode=kvstore")
	if err == nil || !strings.Contains(err.Error(), "identityAllocationMode kvstore needs kvstore.endpoints") {
		t.Fatalf("render with kvstore identities and no endpoints: %v", err)
	}
}
