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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
	"github.com/membrane-cni/membrane/test/netpolmodel"
)

// namedDenyCNPs: x/a takes any port from namespace z (besides the
// NetworkPolicy's 80 and 81 from y) and denies its port serve-80-tcp to
// every peer; x/c, otherwise open, denies x/b's serve-80-tcp.
const namedDenyCNPs = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: a-from-z, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: a}}
  ingress:
  - fromEndpoints: [{matchLabels: {k8s:io.kubernetes.pod.namespace: z}}]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: a-deny-named, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: a}}
  ingressDeny:
  - toPorts: [{ports: [{port: serve-80-tcp, protocol: TCP}]}]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: c-deny-named, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: c}}
  enableDefaultDeny: {egress: false}
  egressDeny:
  - toEndpoints: [{matchLabels: {pod: b}}]
    toPorts: [{ports: [{port: serve-80-tcp, protocol: TCP}]}]
`

// Issue #36: deny entries on a named port through a real API server and
// the real datapath, as Cilium resolves them. A CiliumNetworkPolicy's
// ingressDeny on serve-80-tcp drops exactly x/a's port of that name (80)
// although a NetworkPolicy allows it from y and a CNP allows z on any
// port; an egressDeny on serve-80-tcp toward x/b drops x/c's connections
// to x/b's port of that name and nothing else. Then x/a and x/b are
// replaced by pods naming port 81 serve-80-tcp (a pod's ports cannot
// change in place): both denies move to 81.
func TestNamedPortDeny(t *testing.T) {
	env := kubetest.Require(t)
	w := newWorldOpts(t, "10.232.7.0/24", env, true)
	xa, xb, xc := w.pod("x", "a"), w.pod("x", "b"), w.pod("x", "c")
	p80, p81 := intstr.FromInt32(80), intstr.FromInt32(81)
	w.createPolicy(t, "x", "a-from-y", networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "a"}},
		Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "y"}}}},
			Ports: []networkingv1.NetworkPolicyPort{{Port: &p80}, {Port: &p81}},
		}},
	}, xa, false)
	w.createCNPs(t, env, namedDenyCNPs)

	tcp := func(port int) netpolmodel.ProbeKey { return netpolmodel.ProbeKey{Port: port, Proto: "TCP"} }
	// toA: what reaches x/a on a port the deny does not cover.
	toA := func(k netpolmodel.ProbeKey) func(src *worldPod) bool {
		return func(src *worldPod) bool {
			return src.NS == "z" || (src.NS == "y" && k.Proto == "TCP")
		}
	}
	// expect builds the model: denied is x/a's and x/b's number for
	// serve-80-tcp.
	expect := func(denied int) map[netpolmodel.ProbeKey]func(src, dst *worldPod) bool {
		out := map[netpolmodel.ProbeKey]func(src, dst *worldPod) bool{}
		for _, k := range []netpolmodel.ProbeKey{tcp(80), tcp(81), {Port: 80, Proto: "UDP"}} {
			out[k] = func(src, dst *worldPod) bool {
				switch {
				case src == dst:
					return true
				case dst == xa:
					return k != tcp(denied) && toA(k)(src)
				case src == xc && dst == xb:
					return k != tcp(denied)
				}
				return true
			}
		}
		return out
	}
	w.checkMatrices(t, "serve-80-tcp is 80", expect(80))

	// The computed policies hold the resolved denies, and the datapath
	// counted x/a's drops as deny-rule drops.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pa, err := w.c.EndpointPolicy(ctx, strconv.FormatInt(xa.ep.ID, 10))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(pa.Computed, func(e models.PolicyEntry) bool {
		return e.Deny && e.Direction == "ingress" && e.Port == 80 && e.Protocol == "TCP"
	}) {
		t.Errorf("x/a computed policy %+v: no ingress deny of TCP 80", pa.Computed)
	}
	if !slices.ContainsFunc(pa.Drops, func(d models.DropCounter) bool { return d.Reason == "policy-deny-rule" && d.Packets > 0 }) {
		t.Errorf("x/a drops %+v: no policy-deny-rule drops", pa.Drops)
	}
	if !slices.ContainsFunc(w.computed(ctx, t, xc), func(e models.PolicyEntry) bool {
		return e.Deny && e.Direction == "egress" && e.Port == 80 && e.Protocol == "TCP" && int64(e.Identity) == w.identityOf(ctx, t, xb)
	}) {
		t.Errorf("x/c computed policy %+v: no egress deny of TCP 80 to x/b", w.computed(ctx, t, xc))
	}

	// Replace x/a and x/b by pods naming 81 serve-80-tcp; wait until the
	// agent has the new numbers in both policies.
	renumbered := []corev1.ContainerPort{
		{Name: "serve-80-tcp", ContainerPort: 81, Protocol: corev1.ProtocolTCP},
		{Name: "serve-80-udp", ContainerPort: 80, Protocol: corev1.ProtocolUDP},
	}
	for _, p := range []*worldPod{xa, xb} {
		w.replacePod(ctx, t, p, renumbered)
	}
	xbID := w.identityOf(ctx, t, xb)
	testutil.EventuallyErr(t, "denies moved to 81", func() error {
		pa, err := w.c.EndpointPolicy(ctx, strconv.FormatInt(xa.ep.ID, 10))
		if err != nil {
			return err
		}
		pc, err := w.c.EndpointPolicy(ctx, strconv.FormatInt(xc.ep.ID, 10))
		if err != nil {
			return err
		}
		a, c := pa.Computed, pc.Computed
		if !slices.ContainsFunc(a, func(e models.PolicyEntry) bool { return e.Deny && e.Direction == "ingress" && e.Port == 81 }) ||
			slices.ContainsFunc(a, func(e models.PolicyEntry) bool { return e.Deny && e.Port == 80 }) {
			return fmt.Errorf("x/a computed %+v: want the ingress deny on 81, none on 80", a)
		}
		if !slices.ContainsFunc(c, func(e models.PolicyEntry) bool { return e.Deny && e.Port == 81 && int64(e.Identity) == xbID }) ||
			slices.ContainsFunc(c, func(e models.PolicyEntry) bool { return e.Deny && e.Port == 80 }) {
			return fmt.Errorf("x/c computed %+v: want the egress deny to x/b (%d) on 81, none on 80", c, xbID)
		}
		return nil
	})
	w.settle()
	w.checkMatrices(t, "serve-80-tcp is 81", expect(81))
}

// checkMatrices probes every pair for each key of allowed and compares
// with the model.
func (w *world) checkMatrices(t *testing.T, what string, allowed map[netpolmodel.ProbeKey]func(src, dst *worldPod) bool) {
	t.Helper()
	for _, k := range slices.SortedFunc(func(yield func(netpolmodel.ProbeKey) bool) {
		for k := range allowed {
			if !yield(k) {
				return
			}
		}
	}, func(a, b netpolmodel.ProbeKey) int { return strings.Compare(a.String(), b.String()) }) {
		want := netpolmodel.NewMatrix(len(w.pods))
		for i, src := range w.pods {
			for j, dst := range w.pods {
				want[i][j] = allowed[k](src, dst)
			}
		}
		got := w.observe(k, want)
		for i, src := range w.pods {
			for j, dst := range w.pods {
				if got[i][j] != want[i][j] {
					t.Errorf("%s: %s: %s -> %s reached = %v, want %v", what, k, src, dst, got[i][j], want[i][j])
				}
			}
		}
	}
}

// computed returns p's computed policy entries.
func (w *world) computed(ctx context.Context, t *testing.T, p *worldPod) []models.PolicyEntry {
	t.Helper()
	pol, err := w.c.EndpointPolicy(ctx, strconv.FormatInt(p.ep.ID, 10))
	if err != nil {
		t.Fatal(err)
	}
	return pol.Computed
}

// identityOf returns p's endpoint's identity.
func (w *world) identityOf(ctx context.Context, t *testing.T, p *worldPod) int64 {
	t.Helper()
	ep, err := w.c.EndpointGet(ctx, strconv.FormatInt(p.ep.ID, 10))
	if err != nil || ep.Identity == nil {
		t.Fatalf("endpoint of %s: %+v, %v", p, ep, err)
	}
	return ep.Identity.ID
}

// replacePod deletes p's pod object and creates it again with the
// container ports cports (a pod's ports cannot change in place): the
// agent relabels p's endpoint from the new object, as it would the
// endpoint of a pod recreated under the same name.
func (w *world) replacePod(ctx context.Context, t *testing.T, p *worldPod, cports []corev1.ContainerPort) {
	t.Helper()
	pods := w.kube.CoreV1().Pods(p.NS)
	if err := pods.Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("pod %s not deleted: %v", p, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.NS, Name: p.Name, Labels: map[string]string{"pod": p.Name}},
		Spec: corev1.PodSpec{NodeName: kubeNode, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause", Ports: cports}}}}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// createCNPs applies the cilium.io objects of docs and waits until the
// agent holds each (deleted at the end of t).
func (w *world) createCNPs(t *testing.T, env *kubetest.Env, docs string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	objs, err := kubetest.ReadObjects([]byte(docs))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubetest.Apply(ctx, env.Config, kubetest.FieldManager, objs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kubetest.Delete(context.Background(), env.Config, objs) })
	for _, o := range objs {
		for {
			list, err := w.c.PolicyList(ctx)
			if err == nil && slices.ContainsFunc(list.Policies, func(p *models.Policy) bool {
				return p.Namespace == o.GetNamespace() && p.Name == o.GetName()
			}) {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("policy %s not in the agent: %v", fmt.Sprintf("%s/%s", o.GetNamespace(), o.GetName()), err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	w.settle()
}
