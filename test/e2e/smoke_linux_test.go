//go:build linux

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestSmoke is the one-node check CI runs: pods created through the API
// and placed by the scheduler reach Running with addresses from Membrane
// (from their Node's podCIDR; status.podIP is the agent's endpoint for
// that pod), reach each other and their node, and a NetworkPolicy first
// denies, then (with an allow rule) admits traffic.
func TestSmoke(t *testing.T) {
	c := requireCluster(t)
	ns := c.namespace(t, "smoke", nil)
	pods := c.createPods(t,
		podSpec(ns, "a", "", map[string]string{"app": "a"}),
		podSpec(ns, "b", "", map[string]string{"app": "b"}))
	a, b := pods[ns+"/a"], pods[ns+"/b"]

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, p := range []string{"a", "b"} {
		pod := pods[ns+"/"+p]
		n := c.nodeOf(t, pod)
		cl := client.New(n.agentSocket())
		eps, err := cl.EndpointList(ctx, nil)
		cl.Close()
		if err != nil {
			t.Fatalf("agent endpoints on %s: %v", n.name, err)
		}
		ip := podIP(t, pod)
		if !n.cidr.Contains(ip) {
			t.Errorf("pod %s: podIP %s outside the node's Membrane range %s", p, ip, n.cidr)
		}
		found := false
		for _, ep := range eps {
			if ep.K8sNamespace == ns && ep.K8sPodName == p {
				found = true
				if ep.Addressing == nil || ep.Addressing.IPv4 != ip.String() {
					t.Errorf("pod %s: status.podIP %s, Membrane endpoint %d addressing %+v", p, ip, ep.ID, ep.Addressing)
				}
			}
		}
		if !found {
			t.Errorf("pod %s: no Membrane endpoint among %d", p, len(eps))
		}
	}

	// The agent as the chart runs it (its pod-bound token through
	// admission.yaml) publishes its health endpoint's address on its Node
	// for the other agents' probes.
	hn := c.nodeOf(t, a)
	testutil.EventuallyErr(t, "the health endpoint's address on Node "+hn.name, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cl := client.New(hn.agentSocket())
		defer cl.Close()
		st, err := cl.Status(ctx)
		if err != nil || st.Health == nil || st.Health.IP == "" {
			return fmt.Errorf("agent health %+v, %v", st, err)
		}
		node, err := c.client.CoreV1().Nodes().Get(ctx, hn.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := node.Annotations["network.membrane.io/ipv4-health-ip"]; got != st.Health.IP {
			return fmt.Errorf("annotation %q, health endpoint %s", got, st.Health.IP)
		}
		return nil
	})

	fromA := mustNetns(t, a)
	expect(t, fromA, b, 80, "tcp", true)
	expect(t, fromA, b, 81, "udp", true)
	expect(t, mustNetns(t, b), a, 80, "tcp", true)
	// Pod to node: kubelet's port on the node's underlay address.
	n := c.nodeOf(t, a)
	if err := dialTCP(fromA, n.ip, 10250, 5*time.Second); err != nil {
		t.Errorf("pod a -> node %s:10250: %v", n.ip, err)
	}

	// Deny all ingress to b, then allow from a on TCP 80 only.
	np := c.client.NetworkingV1().NetworkPolicies(ns)
	deny := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-b"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "b"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}
	if _, err := np.Create(ctx, deny, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyErr(t, "deny-b enforced", func() error { return reachable(fromA, b, 80, "tcp", false) })
	expect(t, fromA, b, 81, "udp", false)
	expect(t, mustNetns(t, b), a, 80, "tcp", true) // egress of b is not selected

	port80 := intstr.FromInt32(80)
	tcp := corev1.ProtocolTCP
	allow := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "allow-a-to-b-80"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "b"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port80}},
			}},
		},
	}
	if _, err := np.Create(ctx, allow, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyErr(t, "allow-a-to-b-80 enforced", func() error { return reachable(fromA, b, 80, "tcp", true) })
	expect(t, fromA, b, 81, "tcp", false)
	expect(t, fromA, b, 80, "udp", false)
}

// reachable probes once and says whether the outcome is the wanted one.
func reachable(from string, to podLike, port int, proto string, want bool) error {
	ip, err := netip.ParseAddr(to.Status.PodIP)
	if err != nil {
		return fmt.Errorf("pod %s/%s podIP %q: %w", to.Namespace, to.Name, to.Status.PodIP, err)
	}
	who, err := dial(from, ip, port, proto, 2*time.Second)
	got := err == nil && who == to.Namespace+"/"+to.Name
	if got != want {
		return fmt.Errorf("%s %s:%d reachable=%v (answer %q, %v), want %v", proto, to.Status.PodIP, port, got, who, err, want)
	}
	return nil
}

// expect fails t unless one probe has the wanted outcome.
func expect(t *testing.T, from string, to podLike, port int, proto string, want bool) {
	t.Helper()
	if err := reachable(from, to, port, proto, want); err != nil {
		t.Errorf("to %s/%s: %v", to.Namespace, to.Name, err)
	}
}

func mustNetns(t *testing.T, p podLike) string {
	t.Helper()
	ns, err := podNetns(p)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// podLike is a pod as the API server reports it.
type podLike = *corev1.Pod

// dialTCP opens (and closes) a TCP connection from the netns at from.
func dialTCP(from string, to netip.Addr, port int, timeout time.Duration) error {
	return inNetns(from, func() error {
		conn, err := net.DialTimeout("tcp", netip.AddrPortFrom(to, uint16(port)).String(), timeout)
		if err != nil {
			return err
		}
		return conn.Close()
	})
}
