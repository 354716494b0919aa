package k8s

import (
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

func TestPodLabels(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "web", Labels: map[string]string{
			"app": "web", "app.kubernetes.io/name": "shop",
			// A pod may not claim another namespace or its labels.
			LabelNamespace: "kube-system", LabelNamespaceLabels + "team": "root",
		}},
		Spec: corev1.PodSpec{ServiceAccountName: "shop"},
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "prod", Labels: map[string]string{
		"team": "a", strings.Repeat("k", 240): "too-long-once-prefixed",
	}}}
	got := PodLabels(pod, ns, log).Strings()
	want := []string{"k8s:app.kubernetes.io/name=shop", "k8s:app=web", "k8s:io.cilium.k8s.namespace.labels.team=a",
		"k8s:io.cilium.k8s.policy.serviceaccount=shop", "k8s:io.kubernetes.pod.namespace=prod"}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("PodLabels = %v\nwant %v", got, want)
	}
	if got := PodLabels(pod, nil, log).Strings(); slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, "namespace.labels") }) {
		t.Fatalf("without a cached namespace: %v, want no namespace labels", got)
	}
}

func TestDesiredAndDiff(t *testing.T) {
	mk := func(ss ...string) labels.Labels {
		ls, err := labels.ParseSet(ss)
		if err != nil {
			t.Fatal(err)
		}
		return ls
	}
	cur := mk("cni:network=n", "k8s:app=a", "k8s:tier=t", "k8s:io.kubernetes.pod.namespace=x")
	pod := mk("k8s:app=b", "k8s:io.kubernetes.pod.namespace=x")
	want := desiredLabels(cur, pod)
	if !want.Equal(mk("cni:network=n", "k8s:app=b", "k8s:io.kubernetes.pod.namespace=x")) {
		t.Fatalf("desired = %v", want)
	}
	add, del := diffLabels(cur, want)
	if !labels.Labels(add).Equal(mk("k8s:app=b")) || !labels.Labels(del).Equal(mk("k8s:tier")) {
		t.Fatalf("diff = add %v del %v, want add k8s:app=b del k8s:tier", add, del)
	}
	if got := cur.Remove(del).Add(add); !got.Equal(want) {
		t.Fatalf("patched = %v, want %v", got, want)
	}
	// The init identity's label never stays.
	if got := desiredLabels(initLabels, pod); !got.Equal(pod) {
		t.Fatalf("desired from init = %v, want %v", got, pod)
	}
}

// Issue #35: a pod's named container ports, sidecars' included; unnamed
// and invalid ports are left out.
func TestPodNamedPorts(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}, Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{
			{Name: "init", Ports: []corev1.ContainerPort{{Name: "init-port", ContainerPort: 1}}},
			{Name: "sidecar", RestartPolicy: &always, Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9100}}},
		},
		Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{
			{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
			{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
			{ContainerPort: 81},
			{Name: "Bad_Name", ContainerPort: 82},
		}}},
	}}
	if got := PodNamedPorts(pod, slog.New(slog.DiscardHandler)).String(); got != "dns/UDP=53,http/TCP=8080,metrics/TCP=9100" {
		t.Fatalf("PodNamedPorts = %s", got)
	}
}
