//go:build linux

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestServiceWithEgressPolicy: a client whose egress policy allows only
// app=db reaches the db Service's ClusterIP (Membrane translates it to a
// backend before policy, so the policy sees the backend's identity), and
// both backends answer; a Service whose backend is app=cache stays
// unreachable. The cluster has no kube-proxy, so the ClusterIP works only
// through Membrane's translation of the EndpointSlices that the
// controller manager's EndpointSlice controller writes.
func TestServiceWithEgressPolicy(t *testing.T) {
	c := requireCluster(t)
	ctx := context.Background()
	ns := c.namespace(t, "svc", nil)
	pods := c.createPods(t,
		podSpec(ns, "db-1", "", map[string]string{"app": "db"}),
		podSpec(ns, "db-2", "", map[string]string{"app": "db"}),
		podSpec(ns, "cache", "", map[string]string{"app": "cache"}),
		podSpec(ns, "client", "", map[string]string{"app": "client"}))
	from := mustNetns(t, pods[ns+"/client"])
	dbIP := c.service(t, ns, "db", "app", "db")
	cacheIP := c.service(t, ns, "cache", "app", "cache")
	// Before the policy the cache Service answers: denied below means
	// denied by the policy, not an empty EndpointSlice.
	testutil.EventuallyErr(t, "the cache Service answers before the policy", func() error {
		who, err := dial(from, cacheIP, 80, "tcp", 2*time.Second)
		if err == nil && who != ns+"/cache" {
			err = fmt.Errorf("answered by %q", who)
		}
		return err
	})

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

// service creates a ClusterIP Service on TCP 80 selecting the pods
// labelled key=value and returns its ClusterIP; the EndpointSlice
// controller gives it their ready pods as endpoints.
func (c *cluster) service(t *testing.T, ns, name, key, value string) netip.Addr {
	t.Helper()
	svc, err := c.client.CoreV1().Services(ns).Create(context.Background(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{key: value},
			Ports:    []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		t.Fatalf("Service %s/%s ClusterIP %q: %v", ns, name, svc.Spec.ClusterIP, err)
	}
	return ip
}
