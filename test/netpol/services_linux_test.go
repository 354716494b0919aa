package netpol

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// Issue #36: toServices through a real API server and the real
// datapath. By name, a Service with a selector allows its pods (the
// selector as an endpoint selector in the Service's namespace), one
// without allows its EndpointSlice's addresses; by selector, the
// Services whose labels match. Changing the EndpointSlice or the
// Service's selector moves what is allowed without a policy change.
func TestToServices(t *testing.T) {
	env := kubetest.Require(t)
	w := newWorldWith(t, "10.232.4.0/24", env)
	out := newOutside(t, w, "10.233.4.1", "10.233.4.2", "10.233.4.3")
	e1, e2 := out.Addrs[0], out.Addrs[1]
	for _, a := range out.Addrs {
		testutil.EchoServer(t, out.NS, a, 80)
	}
	xa, ya, yb, yc, zb := w.pod("x", "a"), w.pod("y", "a"), w.pod("y", "b"), w.pod("y", "c"), w.pod("z", "b")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	svc := func(ns, name string, lbls, sel map[string]string) {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls},
			Spec: corev1.ServiceSpec{Selector: sel, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(80)}}}}
		if _, err := w.kube.CoreV1().Services(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.kube.CoreV1().Services(ns).Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}
	svc("y", "db", nil, map[string]string{"pod": "b"})
	svc("y", "cache", map[string]string{"tier": "cache"}, map[string]string{"pod": "c"})
	svc("z", "cache", map[string]string{"tier": "cache"}, map[string]string{"pod": "b"})
	svc("z", "ext", nil, nil)
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "z", Name: "ext-1",
		Labels: map[string]string{discoveryv1.LabelServiceName: "ext"}}, AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{e1.String()}}}}
	slice, err := w.kube.DiscoveryV1().EndpointSlices("z").Create(ctx, slice, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = w.kube.DiscoveryV1().EndpointSlices("z").Delete(context.Background(), "ext-1", metav1.DeleteOptions{})
	})
	w.createMNP(t, env, `apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata: {name: to-services, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: a}}
  egress:
  - toServices:
    - k8sService: {serviceName: db, namespace: "y"}
    - k8sService: {serviceName: ext, namespace: z}
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
  - toServices:
    - k8sServiceSelector: {selector: {matchLabels: {tier: cache}}, namespace: "y"}
`)
	reach := func(dst netip.Addr, port int) bool {
		return testutil.Exchange(xa.ns, dst, port, probeTimeout) == nil
	}
	expect := func(what string, want map[string]bool, probes map[string]func() bool) {
		t.Helper()
		testutil.EventuallyErr(t, what, func() error {
			for name, p := range probes {
				if got := p(); got != want[name] {
					return fmt.Errorf("x/a -> %s reached = %v, want %v", name, got, want[name])
				}
			}
			return nil
		})
	}
	probes := map[string]func() bool{
		"y/a:80": func() bool { return reach(ya.IP, 80) },
		"y/b:80": func() bool { return reach(yb.IP, 80) },
		"y/b:81": func() bool { return reach(yb.IP, 81) },
		"y/c:81": func() bool { return reach(yc.IP, 81) },
		"z/b:81": func() bool { return reach(zb.IP, 81) },
		"e1:80":  func() bool { return reach(e1, 80) },
		"e2:80":  func() bool { return reach(e2, 80) },
	}
	expect("toServices by name and by selector", map[string]bool{"y/b:80": true, "y/c:81": true, "e1:80": true}, probes)

	// The external Service's backend moves: e2, no longer e1.
	slice.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{e2.String()}}}
	if _, err := w.kube.DiscoveryV1().EndpointSlices("z").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("the EndpointSlice's new address", map[string]bool{"y/b:80": true, "y/c:81": true, "e2:80": true}, probes)
	// GET /v1/policy says what each toServices peer resolves to.
	testutil.EventuallyErr(t, "GET /v1/policy shows the backends", func() error {
		list, err := w.c.PolicyList(ctx)
		if err != nil {
			return err
		}
		got := map[string]string{}
		for _, p := range list.Policies {
			for _, s := range p.Selected {
				for _, svc := range s.Services {
					got[s.Selector+" "+svc.Namespace+"/"+svc.Name] = fmt.Sprint(svc.Selector, svc.Addresses, len(s.Identities))
				}
			}
		}
		want := map[string]string{
			"service{y/db} y/db":                             "map[pod:b] [] 1",
			"service{z/ext} z/ext":                           fmt.Sprint(map[string]string(nil), []string{e2.String()}, 1),
			"service{y labels{any:tier In (cache)}} y/cache": "map[pod:c] [] 1",
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("selections %v, want %v", got, want)
		}
		return nil
	})

	// y/db selects pod a now: y/a, no longer y/b.
	db, err := w.kube.CoreV1().Services("y").Get(ctx, "db", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	db.Spec.Selector = map[string]string{"pod": "a"}
	if _, err := w.kube.CoreV1().Services("y").Update(ctx, db, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("the Service's new selector", map[string]bool{"y/a:80": true, "y/c:81": true, "e2:80": true}, probes)
}
