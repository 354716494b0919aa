package k8s_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// podWithPorts creates a pod on this node whose container declares ports
// (name -> TCP port).
func (k *cluster) podWithPorts(t *testing.T, ns, name string, lbls map[string]string, ports map[string]int32) {
	t.Helper()
	var cps []corev1.ContainerPort
	for n, p := range ports {
		cps = append(cps, corev1.ContainerPort{Name: n, ContainerPort: p, Protocol: corev1.ProtocolTCP})
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls},
		Spec: corev1.PodSpec{NodeName: nodeName,
			Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause", Ports: cps}}},
	}
	if _, err := k.cs.CoreV1().Pods(ns).Create(k.ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// entries returns the computed entries of endpoint id in dir on TCP from
// or to peer, as ports.
func (k *cluster) entries(t *testing.T, id int64, dir string, peer int64) []uint16 {
	t.Helper()
	var out []uint16
	for _, e := range k.endpointPolicy(t, id).Computed {
		if e.Direction == dir && e.Protocol == "TCP" && int64(e.Identity) == peer {
			out = append(out, e.Port)
		}
	}
	slices.Sort(out)
	return out
}

// Issue #35 in Kubernetes mode: the agent takes the named ports from the
// pod objects' containers. Ingress on a named port allows each server
// pod's own number; egress to a named port allows, per peer identity, the
// numbers its pods declare, and a new pod of that identity numbering the
// name differently recomputes the clients' policy. The two servers
// differ only in pod-template-hash, which is not identity-relevant: they
// share one identity (issue #35, identity-relevant labels).
func TestNamedPortsFromPods(t *testing.T) {
	k := startK8sAgent(t, 10*time.Second)
	k.namespace(t, "named", nil)
	k.podWithPorts(t, "named", "server-1", map[string]string{"app": "server", "pod-template-hash": "5d4f8c6b7"}, map[string]int32{"http": 8080, "metrics": 9100})
	k.pod(t, "named", "client", map[string]string{"app": "client"})
	s1, client := k.endpoint(t, "named", "server-1"), k.endpoint(t, "named", "client")
	if s1.Identity == nil || client.Identity == nil {
		t.Fatalf("identities %+v %+v", s1.Identity, client.Identity)
	}
	for _, l := range s1.Labels {
		if l == "k8s:pod-template-hash=5d4f8c6b7" {
			t.Fatalf("labels %v: pod-template-hash is not identity-relevant", s1.Labels)
		}
	}
	http := intstr.FromString("http")
	tcp := corev1.ProtocolTCP
	port := []networkingv1.NetworkPolicyPort{{Port: &http, Protocol: &tcp}}
	k.createNetworkPolicy(t, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "named", Name: "client-out"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}}}},
				Ports: port}},
		},
	})
	k.createNetworkPolicy(t, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "named", Name: "server-in"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
				Ports: port}},
		},
	})
	server, cid := s1.Identity.ID, client.Identity.ID
	k.eventually(t, "egress to the server's http (8080), ingress on its own http", func() (bool, string) {
		out, in := k.entries(t, client.ID, "egress", server), k.entries(t, s1.ID, "ingress", cid)
		return slices.Equal(out, []uint16{8080}) && slices.Equal(in, []uint16{8080}), fmt.Sprintf("egress %v ingress %v", out, in)
	})

	// A rollout: a new server pod, same labels but its pod-template-hash,
	// numbering http 8081.
	k.podWithPorts(t, "named", "server-2", map[string]string{"app": "server", "pod-template-hash": "6c9d7f5b8"}, map[string]int32{"http": 8081})
	s2 := k.endpoint(t, "named", "server-2")
	if s2.Identity == nil || s2.Identity.ID != server {
		t.Fatalf("server-2 identity %+v, want server-1's %d (pod-template-hash left out)", s2.Identity, server)
	}
	k.eventually(t, "the client's egress reaches both numbers of the identity; each server admits its own", func() (bool, string) {
		out := k.entries(t, client.ID, "egress", server)
		in1, in2 := k.entries(t, s1.ID, "ingress", cid), k.entries(t, s2.ID, "ingress", cid)
		return slices.Equal(out, []uint16{8080, 8081}) && slices.Equal(in1, []uint16{8080}) && slices.Equal(in2, []uint16{8081}),
			fmt.Sprintf("egress %v ingress server-1 %v server-2 %v", out, in1, in2)
	})

	// The first server goes: its number goes from the client's policy.
	if err := k.c.EndpointDelete(k.ctx, fmt.Sprint(s1.ID)); err != nil {
		t.Fatal(err)
	}
	k.eventually(t, "only server-2's number left", func() (bool, string) {
		out := k.entries(t, client.ID, "egress", server)
		return slices.Equal(out, []uint16{8081}), fmt.Sprintf("egress %v", out)
	})
}

// A pod cached only after its ADD (the endpoint starts with the init
// identity) gets its named ports with its labels.
func TestNamedPortsOfLatePod(t *testing.T) {
	k := startK8sAgent(t, 200*time.Millisecond)
	k.namespace(t, "late-named", nil)
	http := intstr.FromString("http")
	k.createNetworkPolicy(t, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "late-named", Name: "in"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "late"}},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &http}}}},
		},
	})
	ep := k.endpoint(t, "late-named", "late")
	if !slices.Equal(ep.Labels, []string{"reserved:init"}) {
		t.Fatalf("endpoint before its pod: labels %v, want reserved:init", ep.Labels)
	}
	k.podWithPorts(t, "late-named", "late", map[string]string{"app": "late"}, map[string]int32{"http": 8088})
	k.eventually(t, "relabelled, ingress open on its own http", func() (bool, string) {
		in := k.entries(t, ep.ID, "ingress", 0)
		return slices.Equal(in, []uint16{8088}), fmt.Sprintf("ingress from any %v", in)
	})
}
