//go:build linux

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestServiceWithEgressPolicy: a client whose egress policy allows only
// app=db reaches the db Service's ClusterIP (Membrane translates it to a
// backend before policy, so the policy sees the backend's identity), and
// both backends answer; a Service whose backend is app=cache stays
// unreachable. The cluster has no kube-proxy and no
// kube-controller-manager, so the ClusterIP works only through Membrane's
// translation and the test writes the EndpointSlices itself, as the
// endpointslice controller would.
func TestServiceWithEgressPolicy(t *testing.T) {
	c := requireCluster(t)
	n := c.nodes[0]
	ctx := context.Background()
	ns := c.namespace(t, "svc", nil)
	pods := c.createPods(t,
		podSpec(ns, "db-1", n.name, map[string]string{"app": "db"}),
		podSpec(ns, "db-2", n.name, map[string]string{"app": "db"}),
		podSpec(ns, "cache", n.name, map[string]string{"app": "cache"}),
		podSpec(ns, "client", n.name, map[string]string{"app": "client"}))
	from := mustNetns(t, pods[ns+"/client"])
	dbIP := c.service(t, ns, "db", pods[ns+"/db-1"], pods[ns+"/db-2"])
	cacheIP := c.service(t, ns, "cache", pods[ns+"/cache"])

	tcp, port80 := corev1.ProtocolTCP, intstr.FromInt32(80)
	pol := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "client-to-db"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port80}},
			}},
		},
	}
	if _, err := c.client.NetworkingV1().NetworkPolicies(ns).Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyErr(t, "the cache Service denied by the egress policy", func() error {
		if who, err := dial(from, cacheIP, 80, "tcp", 2*time.Second); err == nil {
			return fmt.Errorf("cache Service %s answered (%s)", cacheIP, who)
		}
		return nil
	})
	seen := map[string]bool{}
	testutil.EventuallyErr(t, "the db Service reached, both backends answering", func() error {
		who, err := dial(from, dbIP, 80, "tcp", 2*time.Second)
		if err != nil {
			return fmt.Errorf("db Service %s: %w", dbIP, err)
		}
		if who != ns+"/db-1" && who != ns+"/db-2" {
			return fmt.Errorf("db Service answered by %q", who)
		}
		seen[who] = true
		if len(seen) < 2 {
			return fmt.Errorf("only %v answered so far", seen)
		}
		return nil
	})
}

// service creates a ClusterIP Service on TCP 80 selecting the backends'
// app label and its EndpointSlice (ready endpoints: the backends), and
// returns the ClusterIP.
func (c *cluster) service(t *testing.T, ns, name string, backends ...*corev1.Pod) netip.Addr {
	t.Helper()
	ctx := context.Background()
	svc, err := c.client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": backends[0].Labels["app"]},
			Ports:    []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ready, portName, port, proto := true, "http", int32(80), corev1.ProtocolTCP
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-1", Labels: map[string]string{
			discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "membrane-e2e"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port, Protocol: &proto}},
	}
	for _, b := range backends {
		nodeName := b.Spec.NodeName
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{b.Status.PodIP}, Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			NodeName: &nodeName, TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: b.Name, UID: b.UID}})
	}
	if _, err := c.client.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		t.Fatalf("Service %s/%s ClusterIP %q: %v", ns, name, svc.Spec.ClusterIP, err)
	}
	return ip
}
