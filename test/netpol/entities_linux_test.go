package netpol

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// Issue #36: the entities remote-node and kube-apiserver through a real
// API server and the real datapath. The API server (one of the test's
// own) advertises an address outside the node, as one running elsewhere
// would: its own EndpointSlice (default/kubernetes) names it, the agent
// gives it the kube-apiserver identity and toEntities: kube-apiserver
// reaches it (a stand-in listens there, on the API server's port).
// Another node's Node object gives its InternalIP the remote-node
// identity: fromEntities and toEntities remote-node admit it and no
// other outside address; cluster includes both.
func TestEntitiesRemoteNodeAndAPIServer(t *testing.T) {
	testutil.RequireRoot(t)
	env := kubetest.StartOwn(t, "--advertise-address=10.233.5.2")
	w := newWorldWith(t, "10.232.5.0/24", env)
	out := newOutside(t, w, "10.233.5.1", "10.233.5.2", "10.233.5.3", "10.233.5.4")
	api, peer, stranger := out.Addrs[0], out.Addrs[1], out.Addrs[2]
	u, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	apiPort, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range out.Addrs {
		testutil.EchoServer(t, out.NS, a, 80)
		testutil.EchoServer(t, out.NS, a, apiPort)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "peer-node"}, Spec: corev1.NodeSpec{PodCIDR: "10.244.99.0/24", PodCIDRs: []string{"10.244.99.0/24"}}}
	node, err = w.kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.kube.CoreV1().Nodes().Delete(context.Background(), "peer-node", metav1.DeleteOptions{}) })
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: peer.String()}}
	if _, err := w.kube.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.createMNP(t, env, fmt.Sprintf(`apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata: {name: to-apiserver, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: a}}
  egress:
  - toEntities: [kube-apiserver]
    toPorts: [{ports: [{port: "%d", protocol: TCP}]}]
---
apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata: {name: to-nodes, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: b}}
  egress:
  - toEntities: [remote-node]
---
apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata: {name: from-nodes, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: c}}
  ingress:
  - fromEntities: [remote-node]
---
apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata: {name: to-cluster, namespace: "y"}
spec:
  endpointSelector: {matchLabels: {pod: a}}
  egress:
  - toEntities: [cluster]
`, apiPort))
	xa, xb, xc, ya := w.pod("x", "a"), w.pod("x", "b"), w.pod("x", "c"), w.pod("y", "a")
	to := func(p *worldPod, dst netip.Addr, port int) func() bool {
		return func() bool { return testutil.Exchange(p.ns, dst, port, probeTimeout) == nil }
	}
	from := func(src netip.Addr, p *worldPod) func() bool {
		return func() bool { return exchangeFrom(out.NS, src, p.IP, 80, probeTimeout) == nil }
	}
	probes := map[string]func() bool{
		"x/a -> api":      to(xa, api, apiPort),
		"x/a -> peer":     to(xa, peer, apiPort),
		"x/a -> stranger": to(xa, stranger, apiPort),
		"x/b -> peer":     to(xb, peer, 80),
		"x/b -> stranger": to(xb, stranger, 80),
		"peer -> x/c":     from(peer, xc),
		"stranger -> x/c": from(stranger, xc),
		"y/a -> api":      to(ya, api, apiPort),
		"y/a -> peer":     to(ya, peer, 80),
		"y/a -> stranger": to(ya, stranger, 80),
		"y/a -> x/a":      to(ya, xa.IP, 81),
	}
	want := map[string]bool{"x/a -> api": true, "x/b -> peer": true, "peer -> x/c": true,
		"y/a -> api": true, "y/a -> peer": true, "y/a -> x/a": true}
	testutil.EventuallyErr(t, "remote-node and kube-apiserver enforced", func() error {
		for name, p := range probes {
			if got := p(); got != want[name] {
				return fmt.Errorf("%s reached = %v, want %v", name, got, want[name])
			}
		}
		return nil
	})
	// The node goes: its address is world again.
	if err := w.kube.CoreV1().Nodes().Delete(ctx, "peer-node", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want["x/b -> peer"], want["peer -> x/c"], want["y/a -> peer"] = false, false, false
	testutil.EventuallyErr(t, "the deleted node's address is world", func() error {
		for _, name := range []string{"x/b -> peer", "peer -> x/c", "y/a -> peer"} {
			if got := probes[name](); got != want[name] {
				return fmt.Errorf("%s reached = %v, want %v", name, got, want[name])
			}
		}
		return nil
	})
}

// exchangeFrom connects from src inside ns to dst:port and checks an echo,
// within timeout.
func exchangeFrom(ns *testutil.NS, src, dst netip.Addr, port int, timeout time.Duration) error {
	return ns.Do(func() error {
		d := net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{IP: src.AsSlice()}}
		c, err := d.Dial("tcp", net.JoinHostPort(dst.String(), strconv.Itoa(port)))
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return err
		}
		buf := make([]byte, 5)
		_, err = c.Read(buf)
		return err
	})
}
