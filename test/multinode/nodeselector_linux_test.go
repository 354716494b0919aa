package multinode

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
)

const toDBNodes = `apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata: {name: to-db-nodes, namespace: default}
spec:
  endpointSelector: {}
  egress:
  - toNodes: [{matchLabels: {role: db}}]
    toPorts: [{ports: [{port: "7005", protocol: TCP}]}]
`

// peerNode creates another node's Node object: labels, one InternalIP
// and a pod CIDR.
func peerNode(t *testing.T, cs kubernetes.Interface, name string, lbls map[string]string, addr netip.Addr, podCIDR string) {
	t.Helper()
	ctx := context.Background()
	n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls},
		Spec: corev1.NodeSpec{PodCIDR: podCIDR, PodCIDRs: []string{podCIDR}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr.String()}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestNodeSelectorLabels: with --enable-node-selector-labels the other
// nodes' addresses get per-node identities from their Node labels, and a
// pod's egress toNodes (a MembraneNetworkPolicy from the API server) reaches the address of the node whose labels match and not
// another node's, on the BPF datapath with real TCP; relabelling the
// other node lets it in.
func TestNodeSelectorLabels(t *testing.T) {
	testutil.RequireRoot(t)
	env := kubetest.StartOwn(t)
	env.InstallCRDs(t)
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	h := newHostFWNode(t, env, cs, "nsl-self", map[string]string{"role": "self"}, "10.236.7.0/24", "192.168.242",
		"--enable-node-selector-labels")
	// The outside netns stands for both other nodes: db at h.out, web at
	// a second address; it routes the pods' range back through the node.
	web := netip.MustParseAddr("192.168.242.3")
	onl := h.outside.Netlink(t)
	eth0, err := onl.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	a, _ := netlink.ParseAddr(web.String() + "/24")
	a.Flags = unix.IFA_F_NODAD
	if err := onl.AddrAdd(eth0, a); err != nil {
		t.Fatal(err)
	}
	_, podNet, _ := net.ParseCIDR("10.236.7.0/24")
	if err := onl.RouteAdd(&netlink.Route{Dst: podNet, Gw: h.addr.AsSlice()}); err != nil {
		t.Fatal(err)
	}
	peerNode(t, cs, "nsl-db", map[string]string{"role": "db"}, h.out, "10.250.1.0/24")
	peerNode(t, cs, "nsl-web", map[string]string{"role": "web"}, web, "10.250.2.0/24")
	for _, ip := range []netip.Addr{h.out, web} {
		testutil.EchoServer(t, h.outside, ip, 7005)
	}
	kpod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "nsl-client"},
		Spec: corev1.PodSpec{NodeName: h.name, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause"}}}}
	if _, err := cs.CoreV1().Pods("default").Create(context.Background(), kpod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.CoreV1().Pods("default").Delete(context.Background(), "nsl-client", metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	})
	pod := h.node.AddPod("nsl-client")
	reach := func(ip netip.Addr) bool { return testutil.Exchange(pod.NS, ip, 7005, hostProbeTimeout) == nil }
	check := func(what string, db, webOK bool) {
		t.Helper()
		testutil.EventuallyErr(t, what, func() error {
			if got := reach(h.out); got != db {
				return fmt.Errorf("pod -> db node %s reached = %v, want %v", h.out, got, db)
			}
			if got := reach(web); got != webOK {
				return fmt.Errorf("pod -> web node %s reached = %v, want %v", web, got, webOK)
			}
			return nil
		})
	}
	// The nodes' addresses carry per-node identities, one per label set.
	testutil.EventuallyErr(t, "per-node identities in the ipcache", func() error {
		es, err := h.c.IPCache(context.Background())
		if err != nil {
			return err
		}
		ids := map[string]uint32{}
		for _, e := range es {
			ids[e.CIDR] = e.Identity
		}
		d, w := ids[h.out.String()+"/32"], ids[web.String()+"/32"]
		if !identity.IsNode(identity.NumericIdentity(d)) || !identity.IsNode(identity.NumericIdentity(w)) || d == w {
			return fmt.Errorf("ipcache: db node %d, web node %d; want two per-node identities", d, w)
		}
		// GET /v1/identity lists them (scope node) with the nodes' labels.
		for id, role := range map[uint32]string{d: "db", w: "web"} {
			got, err := h.c.Identity(context.Background(), int64(id))
			if err != nil || got.Scope != "node" || !slices.Contains(got.Labels, "node:role="+role) {
				return fmt.Errorf("GET /v1/identity/%d = %+v, %v; want scope node with node:role=%s", id, got, err, role)
			}
		}
		all, err := h.c.Identities(context.Background())
		if err != nil || !slices.ContainsFunc(all, func(i *models.Identity) bool { return i.ID == int64(d) && i.Scope == "node" }) {
			return fmt.Errorf("GET /v1/identity lacks the db node's identity %d (%v)", d, err)
		}
		return nil
	})
	check("no policy", true, true)

	applyPolicy(t, env, toDBNodes)
	check("toNodes role=db: the db node only", true, false)

	relabelNode(t, cs, "nsl-web", "role", "db")
	check("web node relabelled role=db: both", true, true)
}
