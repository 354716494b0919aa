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
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/membrane-cni/membrane/test/kubetest"
	"github.com/membrane-cni/membrane/test/netpolmodel"
)

// Issue #32 item 8, upstream's "should allow ingress access on one named
// port" through a real API server and the real datapath: a NetworkPolicy
// selecting x/a whose only ingress rule the agent refuses must still
// isolate x/a (Kubernetes isolates a pod any policy selects): no pod
// reaches it on any port, the other pods stay reachable, and a Warning
// event on the NetworkPolicy names the cause.
//
// The refused field this relies on is a named port (ports: [{port:
// serve-80-tcp}], which every pod's container declares). When named ports
// are implemented (issue #35) the agent will rightly allow port 80: then
// use another field the agent refuses.
func TestRefusedFieldIsolates(t *testing.T) {
	env := kubetest.Require(t)
	w := newWorldWith(t, "10.232.1.0/24", env)
	named := intstr.FromString("serve-80-tcp") // the refused field
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "allow-named-port"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "a"}},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &named}}}},
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := w.kube.NetworkingV1().NetworkPolicies("x").Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = w.kube.NetworkingV1().NetworkPolicies("x").Delete(context.Background(), np.Name, metav1.DeleteOptions{})
	})
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
			if e.InvolvedObject.Kind != "NetworkPolicy" || e.InvolvedObject.Name != np.Name {
				continue
			}
			seen = append(seen, e.Reason+": "+e.Message)
			if e.Type == corev1.EventTypeWarning && e.Reason == "PolicyPartiallyRefused" &&
				strings.Contains(e.Message, "spec.ingress[0]") && strings.Contains(e.Message, `named port "serve-80-tcp"`) {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("no PolicyPartiallyRefused Warning event naming spec.ingress[0] and the named port; events: %s",
		fmt.Sprint(slices.Clone(seen)))
}
