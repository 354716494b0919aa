package netpol

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
	"github.com/membrane-cni/membrane/test/netpolmodel"
)

// Issue #35: upstream's named-port cases ("should allow ingress access on
// one named port", "... from namespace on one named port", "should allow
// egress access on one named port") and a named port whose protocol the
// pod does not declare it with, through a real API server and the real
// datapath. Every pod's container declares serve-80-tcp, serve-80-udp,
// serve-81-tcp and serve-81-udp (kubeObjects); the agent learns them from
// the pod objects. Then, identity-relevant labels: two pods that differ
// only in pod-template-hash share one identity, and a policy selecting
// on pod-template-hash selects nothing.
func TestNamedPorts(t *testing.T) {
	env := kubetest.Require(t)
	w := newWorldWith(t, "10.232.2.0/24", env)
	xa := w.pod("x", "a")
	tcp := func(port int) netpolmodel.ProbeKey { return netpolmodel.ProbeKey{Port: port, Proto: "TCP"} }
	udp := func(port int) netpolmodel.ProbeKey { return netpolmodel.ProbeKey{Port: port, Proto: "UDP"} }
	named := func(name string, proto corev1.Protocol) networkingv1.NetworkPolicyPort {
		p := intstr.FromString(name)
		return networkingv1.NetworkPolicyPort{Port: &p, Protocol: &proto}
	}
	selA := metav1.LabelSelector{MatchLabels: map[string]string{"pod": "a"}}
	for _, tc := range []struct {
		name string
		spec networkingv1.NetworkPolicySpec
		// allowed says, per probe, whether src reaches dst (pairs not
		// involving x/a in the policy's direction stay open).
		allowed map[netpolmodel.ProbeKey]func(src, dst *worldPod) bool
	}{
		{"ingress on one named port", networkingv1.NetworkPolicySpec{PodSelector: selA,
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{named("serve-80-tcp", corev1.ProtocolTCP)}}}},
			map[netpolmodel.ProbeKey]func(src, dst *worldPod) bool{
				tcp(80): func(src, dst *worldPod) bool { return true },
				tcp(81): func(src, dst *worldPod) bool { return dst != xa || src == dst },
				udp(80): func(src, dst *worldPod) bool { return dst != xa || src == dst },
			}},
		{"ingress from namespace on one named port", networkingv1.NetworkPolicySpec{PodSelector: selA,
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "y"}}}},
				Ports: []networkingv1.NetworkPolicyPort{named("serve-81-tcp", corev1.ProtocolTCP)}}}},
			map[netpolmodel.ProbeKey]func(src, dst *worldPod) bool{
				tcp(81): func(src, dst *worldPod) bool { return dst != xa || src == dst || src.NS == "y" },
				tcp(80): func(src, dst *worldPod) bool { return dst != xa || src == dst },
			}},
		{"egress on one named port", networkingv1.NetworkPolicySpec{PodSelector: selA, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{named("serve-81-udp", corev1.ProtocolUDP)}}}},
			map[netpolmodel.ProbeKey]func(src, dst *worldPod) bool{
				udp(81): func(src, dst *worldPod) bool { return true },
				tcp(81): func(src, dst *worldPod) bool { return src != xa || src == dst },
				udp(80): func(src, dst *worldPod) bool { return src != xa || src == dst },
			}},
		{"named port with a protocol the pod does not declare it with", networkingv1.NetworkPolicySpec{PodSelector: selA,
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{named("serve-80-tcp", corev1.ProtocolUDP)}}}},
			map[netpolmodel.ProbeKey]func(src, dst *worldPod) bool{
				tcp(80): func(src, dst *worldPod) bool { return dst != xa || src == dst },
				udp(80): func(src, dst *worldPod) bool { return dst != xa || src == dst },
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			egress := len(tc.spec.PolicyTypes) == 1 && tc.spec.PolicyTypes[0] == networkingv1.PolicyTypeEgress
			w.createPolicy(t, "x", "named", tc.spec, xa, egress)
			keys := slices.SortedFunc(func(yield func(netpolmodel.ProbeKey) bool) {
				for k := range tc.allowed {
					if !yield(k) {
						return
					}
				}
			}, func(a, b netpolmodel.ProbeKey) int { return strings.Compare(a.String(), b.String()) })
			for _, k := range keys {
				want := netpolmodel.NewMatrix(len(w.pods))
				for i, src := range w.pods {
					for j, dst := range w.pods {
						want[i][j] = tc.allowed[k](src, dst)
					}
				}
				got := w.observe(k, want)
				for i, src := range w.pods {
					for j, dst := range w.pods {
						if got[i][j] != want[i][j] {
							t.Errorf("%s: %s -> %s reached = %v, want %v", k, src, dst, got[i][j], want[i][j])
						}
					}
				}
			}
		})
	}

	t.Run("pods differing only in pod-template-hash share an identity", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		yb, yc := w.pod("y", "b"), w.pod("y", "c")
		for pod, hash := range map[*worldPod]string{yb: "5d4f8c6b7", yc: "6c9d7f5b8"} {
			patch := `{"metadata":{"labels":{"pod":"rollout","pod-template-hash":"` + hash + `"}}}`
			if _, err := w.kube.CoreV1().Pods(pod.NS).Patch(ctx, pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		var b, c *models.Endpoint
		for {
			var err1, err2 error
			b, err1 = w.c.EndpointGet(ctx, strconv.FormatInt(yb.ep.ID, 10))
			c, err2 = w.c.EndpointGet(ctx, strconv.FormatInt(yc.ep.ID, 10))
			// Both relabelled and their identities resolved again (the
			// labels change first, the identity after).
			if err1 == nil && err2 == nil && slices.Contains(b.Labels, "k8s:pod=rollout") && slices.Contains(c.Labels, "k8s:pod=rollout") &&
				b.Identity != nil && c.Identity != nil && slices.Contains(b.Identity.Labels, "k8s:pod=rollout") && slices.Contains(c.Identity.Labels, "k8s:pod=rollout") {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("pods not relabelled: %v %v %+v %+v", err1, err2, b, c)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if b.Identity == nil || c.Identity == nil || b.Identity.ID != c.Identity.ID {
			t.Fatalf("identities %+v and %+v, want one", b.Identity, c.Identity)
		}
		for _, l := range append(b.Labels, c.Labels...) {
			if strings.Contains(l, "pod-template-hash") {
				t.Fatalf("endpoint label %s: pod-template-hash is not identity-relevant", l)
			}
		}
		// A rollout step: y/b's pod-template-hash changes (a new
		// ReplicaSet's pods carry another). Its identity stays and no
		// endpoint regenerates. The audit annotation patched after the
		// hash is the barrier: the watcher handles one pod's updates in
		// order, so once y/b shows audit mode the agent has had a pod
		// object with the new hash. Only y/b regenerates, for the audit
		// mode.
		w.settle()
		regens := func() map[int64]uint64 {
			out := map[int64]uint64{}
			for _, p := range w.pods {
				ep, err := w.c.EndpointGet(ctx, strconv.FormatInt(p.ep.ID, 10))
				if err != nil {
					t.Fatal(err)
				}
				out[p.ep.ID] = ep.Regenerations
			}
			return out
		}
		before := regens()
		for _, patch := range []string{`{"metadata":{"labels":{"pod-template-hash":"7e8f9a0b1"}}}`,
			`{"metadata":{"annotations":{"` + k8s.AuditAnnotation + `":"enabled"}}}`} {
			if _, err := w.kube.CoreV1().Pods(yb.NS).Patch(ctx, yb.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		testutil.Eventually(t, "y/b in audit mode (the barrier)", func() bool {
			ep, err := w.c.EndpointGet(ctx, strconv.FormatInt(yb.ep.ID, 10))
			return err == nil && ep.PolicyAuditMode
		})
		w.settle()
		if ep, err := w.c.EndpointGet(ctx, strconv.FormatInt(yb.ep.ID, 10)); err != nil || ep.Identity == nil || ep.Identity.ID != b.Identity.ID {
			t.Fatalf("y/b after the rollout step: %+v (%v), want identity %d kept", ep, err, b.Identity.ID)
		}
		for id, n := range regens() {
			if id != yb.ep.ID && n != before[id] {
				t.Errorf("endpoint %d regenerated %d times for a pod-template-hash change (%d -> %d)", id, n-before[id], before[id], n)
			}
		}
		unaudit := `{"metadata":{"annotations":{"` + k8s.AuditAnnotation + `":null}}}`
		if _, err := w.kube.CoreV1().Pods(yb.NS).Patch(ctx, yb.Name, types.MergePatchType, []byte(unaudit), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, "y/b out of audit mode", func() bool {
			ep, err := w.c.EndpointGet(ctx, strconv.FormatInt(yb.ep.ID, 10))
			return err == nil && !ep.PolicyAuditMode
		})
		// A policy selecting on the filtered label selects nothing (as in
		// Cilium): y/b stays open once the agent has the policy.
		hashSel := metav1.LabelSelector{MatchLabels: map[string]string{"pod-template-hash": "5d4f8c6b7"}}
		w.createPolicy(t, "y", "by-hash", networkingv1.NetworkPolicySpec{PodSelector: hashSel}, nil, false)
		p, err := w.c.EndpointPolicy(ctx, strconv.FormatInt(yb.ep.ID, 10))
		if err != nil || p.IngressEnforced {
			t.Fatalf("y/b policy %+v (%v): a selector on pod-template-hash selected it", p, err)
		}
		if got := w.observe(tcp(80), nil); !got[slices.Index(w.pods, w.pod("x", "b"))][slices.Index(w.pods, yb)] {
			t.Error("x/b -> y/b refused")
		}
	})
}

// createPolicy creates the NetworkPolicy ns/name (deleted at the end of
// t), waits until the agent has it and, when subject is given, enforces
// it on subject (ingress, or egress), then until the datapath realises
// every endpoint's policy.
func (w *world) createPolicy(t *testing.T, ns, name string, spec networkingv1.NetworkPolicySpec, subject *worldPod, egress bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
	if _, err := w.kube.NetworkingV1().NetworkPolicies(ns).Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = w.kube.NetworkingV1().NetworkPolicies(ns).Delete(ctx, name, metav1.DeleteOptions{})
		for {
			list, err := w.c.PolicyList(ctx)
			if err == nil && !slices.ContainsFunc(list.Policies, func(p *models.Policy) bool { return p.Namespace == ns && p.Name == name }) {
				break
			}
			if ctx.Err() != nil {
				t.Errorf("policy %s/%s not deleted in the agent", ns, name)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		w.settle()
	})
	for {
		list, err := w.c.PolicyList(ctx)
		ok := err == nil && slices.ContainsFunc(list.Policies, func(p *models.Policy) bool { return p.Namespace == ns && p.Name == name })
		if ok && subject != nil {
			p, err := w.c.EndpointPolicy(ctx, strconv.FormatInt(subject.ep.ID, 10))
			ok = err == nil && ((!egress && p.IngressEnforced) || (egress && p.EgressEnforced))
		}
		if ok {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("policy %s/%s not in force in the agent", ns, name)
		}
		time.Sleep(50 * time.Millisecond)
	}
	w.settle()
}
