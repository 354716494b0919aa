package k8s_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/membrane-cni/membrane/pkg/agent"
	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// deleteAtCleanup deletes the policy custom resource resource ns/name
// ("" ns: cluster-scoped) when the test ends: the package's API server
// runs no namespace controller, so deleting a namespace leaves its
// objects, which later tests' agents would import.
func (k *cluster) deleteAtCleanup(t *testing.T, resource, ns, name string) {
	t.Helper()
	r := k.dyn(t).Resource(v2.Resource(resource))
	t.Cleanup(func() {
		if ns == "" {
			_ = r.Delete(context.Background(), name, metav1.DeleteOptions{})
			return
		}
		_ = r.Namespace(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// createNetworkPolicy creates np and deletes it when the test ends.
func (k *cluster) createNetworkPolicy(t *testing.T, np *networkingv1.NetworkPolicy) {
	t.Helper()
	nps := k.cs.NetworkingV1().NetworkPolicies(np.Namespace)
	if _, err := nps.Create(k.ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nps.Delete(context.Background(), np.Name, metav1.DeleteOptions{}) })
}

// endpointPolicy returns the computed and realised policy of endpoint id.
func (k *cluster) endpointPolicy(t *testing.T, id int64) *models.EndpointPolicy {
	t.Helper()
	p, err := k.c.EndpointPolicy(k.ctx, fmt.Sprint(id))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// warningEvent reports whether namespace ns holds a Warning event with
// reason on the object name of kind whose message contains every want.
func (k *cluster) warningEvent(t *testing.T, ns, kind, name, reason string, want ...string) (bool, string) {
	t.Helper()
	evs, err := k.cs.CoreV1().Events(ns).List(k.ctx, metav1.ListOptions{})
	if err != nil {
		return false, err.Error()
	}
	var seen []string
	for _, e := range evs.Items {
		if e.InvolvedObject.Name != name || e.InvolvedObject.Kind != kind {
			continue
		}
		seen = append(seen, e.Reason+": "+e.Message)
		if e.Type == corev1.EventTypeWarning && e.Reason == reason && !slices.ContainsFunc(want, func(w string) bool { return !strings.Contains(e.Message, w) }) {
			return true, ""
		}
	}
	return false, fmt.Sprintf("events of %s %s/%s: %q", kind, ns, name, seen)
}

// Issue #32 item 2: policies of namespace sec-a whose subject names other
// namespaces (a NetworkPolicy podSelector on the namespace label, a
// MembraneNetworkPolicy endpointSelector NotIn [sec-a], a podSelector
// "namespace label Exists") select only pods of sec-a: the pods of sec-b
// and kube-system keep their ingress open.
func TestNamespacedPolicyConfinedToItsNamespace(t *testing.T) {
	k := startK8sAgent(t, 10*time.Second)
	k.namespace(t, "sec-a", nil)
	k.namespace(t, "sec-b", nil)
	k.pod(t, "sec-a", "x", map[string]string{"app": "x"})
	k.pod(t, "sec-b", "y", map[string]string{"app": "x", "canary": "yes"})
	k.pod(t, "kube-system", "sec-z", map[string]string{"app": "x", "canary": "yes"})
	t.Cleanup(func() {
		_ = k.cs.CoreV1().Pods("kube-system").Delete(context.Background(), "sec-z", metav1.DeleteOptions{})
	})
	epA, epB, epSys := k.endpoint(t, "sec-a", "x"), k.endpoint(t, "sec-b", "y"), k.endpoint(t, "kube-system", "sec-z")

	for _, np := range []*networkingv1.NetworkPolicy{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "sec-a", Name: "reach-b"}, Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"io.kubernetes.pod.namespace": "sec-b"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "sec-a", Name: "every-namespace"}, Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "io.kubernetes.pod.namespace", Operator: metav1.LabelSelectorOpExists}}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}},
	} {
		k.createNetworkPolicy(t, np)
	}
	k.deleteAtCleanup(t, v2.ResourceNetworkPolicies, "sec-a", "reach-others")
	k.apply(t, `apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata: {name: reach-others, namespace: sec-a}
spec:
  endpointSelector:
    matchExpressions: [{key: io.kubernetes.pod.namespace, operator: NotIn, values: [sec-a]}]
  ingress: []
`)
	k.eventually(t, "the three policies in force; sec-a's pod isolated", func() (bool, string) {
		names, p := k.policyNames(t), k.endpointPolicy(t, epA.ID)
		return hasAll(names, "sec-a/reach-b", "sec-a/every-namespace", "sec-a/reach-others") && p.IngressEnforced && p.RealizedIngressEnforced,
			fmt.Sprintf("policies %v, sec-a/x ingress enforced %v/%v", names, p.IngressEnforced, p.RealizedIngressEnforced)
	})
	// A canary created after them isolates the other namespaces' pods in
	// egress: once their policy shows it, it was computed from a
	// revision that includes the three policies above.
	k.apply(t, `apiVersion: membrane.io/v2
kind: MembraneClusterwideNetworkPolicy
metadata: {name: sec-canary}
spec:
  endpointSelector: {matchLabels: {canary: "yes"}}
  egress: []
`)
	k.deleteAtCleanup(t, v2.ResourceClusterwideNetworkPolicies, "", "sec-canary")
	for _, ep := range []*models.Endpoint{epB, epSys} {
		k.eventually(t, fmt.Sprintf("endpoint %d's policy includes the canary", ep.ID), func() (bool, string) {
			p := k.endpointPolicy(t, ep.ID)
			return p.EgressEnforced && p.RealizedEgressEnforced, fmt.Sprintf("egress enforced %v/%v", p.EgressEnforced, p.RealizedEgressEnforced)
		})
		if p := k.endpointPolicy(t, ep.ID); p.IngressEnforced || p.RealizedIngressEnforced {
			t.Errorf("endpoint %d (%v): ingress enforced %v/%v by policies of namespace sec-a", ep.ID, ep.Labels, p.IngressEnforced, p.RealizedIngressEnforced)
		}
	}
}

// Issue #35: a NetworkPolicy on a named port the selected pod does not
// declare is in force and allows nothing: the pod is isolated (this test
// relied on named ports being refused before issue #35; the refusal of
// a part is TestMembraneNetworkPolicyPartiallyRefused's, and
// test/netpol's TestRefusedFieldIsolates on the datapath).
func TestNetworkPolicyUndeclaredNamedPortIsolates(t *testing.T) {
	k := startK8sAgent(t, 10*time.Second)
	k.namespace(t, "np-bad", nil)
	k.pod(t, "np-bad", "server", map[string]string{"app": "server"})
	k.pod(t, "np-bad", "client", map[string]string{"app": "client"})
	server, client := k.endpoint(t, "np-bad", "server"), k.endpoint(t, "np-bad", "client")
	named := intstr.FromString("http") // the pods declare no ports
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "np-bad", Name: "named-port"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &named}}}},
		},
	}
	k.createNetworkPolicy(t, np)
	k.eventually(t, "the policy in force, the server isolated with nothing allowed", func() (bool, string) {
		p := k.endpointPolicy(t, server.ID)
		return slices.Contains(k.policyNames(t), "np-bad/named-port") && p.IngressEnforced && p.RealizedIngressEnforced &&
				len(p.Computed) == 0 && len(p.Realized) == 0,
			fmt.Sprintf("policies %v, ingress enforced %v/%v, computed %v", k.policyNames(t), p.IngressEnforced, p.RealizedIngressEnforced, p.Computed)
	})
	if p := k.endpointPolicy(t, client.ID); p.IngressEnforced {
		t.Errorf("client (not selected): ingress enforced")
	}
	st, err := k.c.Status(k.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.K8s.PoliciesPartial != 0 {
		t.Errorf("a named port counted as refused: %+v", st.K8s)
	}
}

// A MembraneNetworkPolicy with a refused entry field (fromNodes) is in force
// without that entry: its status says which part is refused and why, and
// the Accepted condition is False with reason PolicyPartiallyRefused.
func TestMembraneNetworkPolicyPartiallyRefused(t *testing.T) {
	k := startK8sAgent(t, 10*time.Second)
	k.namespace(t, "mnp-part", nil)
	k.pod(t, "mnp-part", "server", map[string]string{"app": "server"})
	k.pod(t, "mnp-part", "client", map[string]string{"app": "client"})
	server, client := k.endpoint(t, "mnp-part", "server"), k.endpoint(t, "mnp-part", "client")
	k.deleteAtCleanup(t, v2.ResourceNetworkPolicies, "mnp-part", "part")
	k.apply(t, `apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata: {name: part, namespace: mnp-part}
spec:
  endpointSelector: {matchLabels: {app: server}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: client}}]
    fromNodes: [{matchLabels: {node: n1}}]
  - fromEndpoints: [{matchLabels: {app: client}}]
    toPorts: [{ports: [{port: "443", protocol: TCP}]}]
`)
	idClient := uint32(client.Identity.ID)
	k.eventually(t, "the second entry in force, the first refused", func() (bool, string) {
		c, r, enf := k.ingressFrom(t, server.ID, 443)
		p := k.endpointPolicy(t, server.ID)
		return enf && slices.Equal(c, []uint32{idClient}) && slices.Equal(r, []uint32{idClient}) && len(p.Computed) == 1,
			fmt.Sprintf("computed %v realized %v enforced %v", p.Computed, r, enf)
	})
	k.eventually(t, "status.nodes[node] names the refused part", func() (bool, string) {
		st, ok := k.nodeStatus(t, v2.ResourceNetworkPolicies, "mnp-part", "part")
		refused, _ := st["refused"].([]any)
		conds, _ := st["conditions"].([]any)
		var cond map[string]any
		if len(conds) == 1 {
			cond, _ = conds[0].(map[string]any)
		}
		return ok && st["ok"] == false && st["enforcing"] == true && len(refused) == 1 &&
				strings.Contains(fmt.Sprint(refused[0]), `spec.ingress[0] allows nothing: spec.ingress[0].fromNodes: needs --enable-node-selector-labels`) &&
				cond["type"] == v2.ConditionAccepted && cond["status"] == "False" && cond["reason"] == "PolicyPartiallyRefused",
			fmt.Sprint(st)
	})
	k.eventually(t, "Warning event naming the field", func() (bool, string) {
		return k.warningEvent(t, "mnp-part", v2.KindNetworkPolicy, "part", "PolicyPartiallyRefused", "spec.ingress[0].fromNodes")
	})
}

// On an agent without an L7 proxy, the L7 rules of a custom resource are
// a refused field: the entry holding them allows nothing, the pods stay
// isolated, and status.nodes[node] says why.
func TestMembraneNetworkPolicyL7WithoutProxy(t *testing.T) {
	k := startK8sAgent(t, 10*time.Second, func(c *agent.Config) { c.Actors.NoL7 = true })
	k.namespace(t, "mnp-l7", nil)
	k.pod(t, "mnp-l7", "b", map[string]string{"app": "b"})
	b := k.endpoint(t, "mnp-l7", "b")
	k.deleteAtCleanup(t, v2.ResourceNetworkPolicies, "mnp-l7", "http-only")
	k.apply(t, `apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata: {name: http-only, namespace: mnp-l7}
spec:
  endpointSelector: {matchLabels: {app: b}}
  ingress:
  - toPorts:
    - ports: [{port: "80", protocol: TCP}]
      rules: {http: [{method: GET, path: /public}]}
`)
	k.eventually(t, "refused part on status.nodes[node]", func() (bool, string) {
		st, ok := k.nodeStatus(t, v2.ResourceNetworkPolicies, "mnp-l7", "http-only")
		errMsg, _ := st["error"].(string)
		return ok && st["ok"] == false && st["enforcing"] == true && strings.Contains(errMsg, "rules.http needs the L7 proxy"), fmt.Sprint(st)
	})
	k.eventually(t, "b isolated, nothing allowed", func() (bool, string) {
		p := k.endpointPolicy(t, b.ID)
		return slices.Contains(k.policyNames(t), "mnp-l7/http-only") && p.IngressEnforced && p.RealizedIngressEnforced && len(p.Computed) == 0,
			fmt.Sprintf("ingress enforced %v/%v computed %v", p.IngressEnforced, p.RealizedIngressEnforced, p.Computed)
	})
}
