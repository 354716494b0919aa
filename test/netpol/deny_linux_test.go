package netpol

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/test/kubetest"
	"github.com/membrane-cni/membrane/test/netpolmodel"
)

// Issue #36: deny rules and ICMP rules through a real API server and the
// real datapath. A MembraneNetworkPolicy's ingressDeny beats a Kubernetes
// NetworkPolicy's allow (Cilium's precedence across kinds); an egressDeny
// of ICMP echo with enableDefaultDeny false stops a pod's pings and
// nothing else; an icmps allow lets pings through a default-deny ingress
// that TCP does not pass.
func TestDenyAndICMP(t *testing.T) {
	env := kubetest.Require(t)
	w := newWorldWith(t, "10.232.3.0/24", env)
	xa, xb, xc, yb := w.pod("x", "a"), w.pod("x", "b"), w.pod("x", "c"), w.pod("y", "b")
	port80 := intstr.FromInt32(80)
	w.createPolicy(t, "x", "allow-y-80", networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "a"}},
		Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "y"}}}},
			Ports: []networkingv1.NetworkPolicyPort{{Port: &port80}},
		}},
	}, xa, false)
	w.createMNP(t, env, `apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata: {name: deny-yb, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: a}}
  ingressDeny:
  - fromEndpoints: [{matchLabels: {pod: b, k8s:io.kubernetes.pod.namespace: "y"}}]
---
apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata: {name: no-ping-out, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: b}}
  enableDefaultDeny: {egress: false}
  egressDeny:
  - icmps: [{fields: [{type: EchoRequest}]}]
---
apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata: {name: ping-only, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: c}}
  ingress:
  - fromEntities: [cluster]
    icmps: [{fields: [{type: 8}]}]
`)
	for _, tc := range []struct {
		k       netpolmodel.ProbeKey
		allowed func(src, dst *worldPod) bool
	}{
		// x/a: port 80 from y but y/b (the deny beats the allow); x/b
		// sends no pings; x/c takes pings only.
		{netpolmodel.ProbeKey{Port: 80, Proto: "TCP"}, func(src, dst *worldPod) bool {
			switch {
			case src == dst:
				return true
			case dst == xa:
				return src.NS == "y" && src != yb
			}
			return dst != xc
		}},
		{netpolmodel.ProbeKey{Port: 81, Proto: "TCP"}, func(src, dst *worldPod) bool {
			return src == dst || (dst != xa && dst != xc)
		}},
		{netpolmodel.ProbeKey{Proto: "ICMP"}, func(src, dst *worldPod) bool {
			return src == dst || (src != xb && dst != xa)
		}},
	} {
		want := netpolmodel.NewMatrix(len(w.pods))
		for i, src := range w.pods {
			for j, dst := range w.pods {
				want[i][j] = tc.allowed(src, dst)
			}
		}
		got := w.observe(tc.k, want)
		for i, src := range w.pods {
			for j, dst := range w.pods {
				if got[i][j] != want[i][j] {
					t.Errorf("%s: %s -> %s reached = %v, want %v", tc.k, src, dst, got[i][j], want[i][j])
				}
			}
		}
	}
	// The agent reports the deny entries and the drops they caused.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := w.c.EndpointPolicy(ctx, strconv.FormatInt(xa.ep.ID, 10))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(p.Realized, func(e models.RealizedPolicyEntry) bool { return e.Deny && e.Packets > 0 }) {
		t.Errorf("x/a realised policy %+v: no deny entry with packets", p.Realized)
	}
	if !slices.ContainsFunc(p.Drops, func(d models.DropCounter) bool { return d.Reason == "policy-deny-rule" && d.Packets > 0 }) {
		t.Errorf("x/a drops %+v: no policy-deny-rule drops", p.Drops)
	}
	pb, err := w.c.EndpointPolicy(ctx, strconv.FormatInt(xb.ep.ID, 10))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(pb.Computed, func(e models.PolicyEntry) bool {
		return e.Deny && e.Protocol == "ICMP" && e.ICMPType == "8" && e.Direction == "egress"
	}) {
		t.Errorf("x/b computed policy %+v: no egress deny of ICMP type 8", pb.Computed)
	}
}

// createMNP creates the MembraneNetworkPolicy objects of docs and waits
// until the agent holds each.
func (w *world) createMNP(t *testing.T, env *kubetest.Env, docs string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range splitYAML(docs) {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{Object: obj}
		res := dyn.Resource(v2.Resource(v2.ResourceNetworkPolicies)).Namespace(u.GetNamespace())
		if _, err := res.Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = res.Delete(context.Background(), u.GetName(), metav1.DeleteOptions{}) })
		for {
			list, err := w.c.PolicyList(ctx)
			if err == nil && slices.ContainsFunc(list.Policies, func(p *models.Policy) bool {
				return p.Namespace == u.GetNamespace() && p.Name == u.GetName()
			}) {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("policy %s/%s not in the agent", u.GetNamespace(), u.GetName())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	w.settle()
}

// splitYAML splits a multi-document YAML string at its "---" lines.
func splitYAML(docs string) []string {
	var out []string
	for _, d := range strings.Split(docs, "\n---\n") {
		if strings.TrimSpace(d) != "" {
			out = append(out, d)
		}
	}
	return out
}
