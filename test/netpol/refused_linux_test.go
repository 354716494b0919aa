package netpol

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"

	"github.com/membrane-cni/membrane/test/kubetest"
	"github.com/membrane-cni/membrane/test/netpolmodel"
)

// Issue #32 item 8 through a real API server and the real datapath: a
// policy selecting x/a whose only ingress rule the agent refuses must
// still isolate x/a (Kubernetes isolates a pod any policy selects): no pod
// reaches it on any port, the other pods stay reachable, and a Warning
// event on the policy names the cause.
//
// The refused field this relies on is fromNodes in a
// MembraneNetworkPolicy's ingress entry, refused without
// --enable-node-selector-labels (issue #36; it relied on named ports
// until issue #35 implemented them, then on icmps).
func TestRefusedFieldIsolates(t *testing.T) {
	env := kubetest.Require(t)
	w := newWorldWith(t, "10.232.1.0/24", env)
	var obj map[string]any
	if err := yaml.Unmarshal([]byte(`apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata: {name: refused-from-nodes, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: a}}
  ingress:
  - fromEndpoints: [{}]
    fromNodes: [{matchLabels: {node: n1}}]
`), &obj); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	np := &unstructured.Unstructured{Object: obj}
	res := dyn.Resource(v2.Resource(v2.ResourceNetworkPolicies)).Namespace("x")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := res.Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = res.Delete(context.Background(), np.GetName(), metav1.DeleteOptions{}) })
	server := w.pod("x", "a")
	// Bounded wait for the policy to reach x/a; without it (the policy
	// refused whole) the probes below show the traffic that gets through.
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, err := w.c.EndpointPolicy(ctx, strconv.FormatInt(server.ep.ID, 10))
		if err == nil && p.IngressEnforced {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("x/a: ingress not enforced 30 s after the NetworkPolicy was created (policy %+v, err %v)", p, err)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	w.settle()
	for _, k := range []netpolmodel.ProbeKey{{Port: 80, Proto: "TCP"}, {Port: 81, Proto: "TCP"}, {Port: 80, Proto: "UDP"}} {
		got := w.observe(k, nil)
		for i, src := range w.pods {
			for j, dst := range w.pods {
				// Connections to x/a are refused (but from itself); every
				// other pair stays open.
				want := dst != server || src == dst
				if got[i][j] != want {
					t.Errorf("%s: %s -> %s reached = %v, want %v", k, src, dst, got[i][j], want)
				}
			}
		}
	}
	var seen []string
	for time.Now().Before(deadline.Add(30 * time.Second)) {
		evs, err := w.kube.CoreV1().Events("x").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		seen = seen[:0]
		for _, e := range evs.Items {
			if e.InvolvedObject.Kind != v2.KindNetworkPolicy || e.InvolvedObject.Name != np.GetName() {
				continue
			}
			seen = append(seen, e.Reason+": "+e.Message)
			if e.Type == corev1.EventTypeWarning && e.Reason == "PolicyPartiallyRefused" &&
				strings.Contains(e.Message, "spec.ingress[0].fromNodes") {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("no PolicyPartiallyRefused Warning event naming spec.ingress[0].fromNodes; events: %s",
		fmt.Sprint(slices.Clone(seen)))
}
