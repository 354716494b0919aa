package k8s_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/test/kubetest"
)

var (
	mepGVR = v2.Resource(v2.EndpointResource)
	crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	crdMu  sync.Mutex
)

// installEndpointCRD creates the MembraneEndpoint CRD from deploy/crds
// (once per API server) and waits until objects of it can be listed.
func installEndpointCRD(t testing.TB, dyn dynamic.Interface) {
	t.Helper()
	// Every CRD of deploy/crds: the agent waits for its policy CRDs'
	// caches at start.
	kubetest.Require(t).InstallCRDs(t)
	crdMu.Lock()
	defer crdMu.Unlock()
	raw, err := os.ReadFile("../../../deploy/crds/membraneendpoints.membrane.io.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := yaml.Unmarshal(raw, &obj); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = dyn.Resource(crdGVR).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create CRD: %v", err)
	}
	for {
		if _, err := dyn.Resource(mepGVR).List(ctx, metav1.ListOptions{Limit: 1}); err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("MembraneEndpoint CRD never served")
		case <-time.After(100 * time.Millisecond):
		}
	}
}

type testAgent struct {
	*cluster
	a    *agent.Agent
	fake *datapath.Fake
	dyn  dynamic.Interface
	stop func()
}

// startAgent starts a fake-datapath agent in Kubernetes mode for node;
// mutate adjusts the config. The CRD is installed first.
func startAgent(t testing.TB, node string, mutate func(*agent.Config)) *testAgent {
	t.Helper()
	ta, err := tryStartAgent(t, node, mutate)
	if err != nil {
		t.Fatalf("agent.Start: %v", err)
	}
	return ta
}

func tryStartAgent(t testing.TB, node string, mutate func(*agent.Config)) (*testAgent, error) {
	t.Helper()
	env := kubetest.Require(t)
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	installEndpointCRD(t, dyn)
	dir := t.TempDir()
	cfg := agent.Config{
		Socket:    filepath.Join(dir, "run", "a.sock"),
		StateDir:  filepath.Join(dir, "state"),
		IPv4Range: netip.MustParsePrefix("10.204.0.0/24"),
		Datapath:  "fake",
		Fake:      datapath.NewFake(1),
		// Identities per node: cluster identities (MembraneIdentity) are
		// tested in pkg/agent/k8s/identitycrd.
		K8s: &k8s.Config{Kubeconfig: env.Kubeconfig, NodeName: node, PodWait: 10 * time.Second, SyncTimeout: time.Minute,
			Identity: k8s.IdentityConfig{Mode: k8s.IdentityLocal}},
	}
	if mutate != nil {
		mutate(&cfg)
	}
	a, err := agent.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return nil, err
	}
	c := client.New(cfg.Socket)
	var once sync.Once
	stop := func() {
		once.Do(func() {
			c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := a.Stop(ctx); err != nil {
				t.Errorf("agent stop: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	k := startK8sClients(t, env, c)
	return &testAgent{cluster: k, a: a, fake: cfg.Fake, dyn: dyn, stop: stop}, nil
}

func startK8sClients(t testing.TB, env *kubetest.Env, c *client.Client) *cluster {
	t.Helper()
	k := &cluster{c: c}
	var err error
	if k.cs, err = newClientset(env); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	k.ctx = ctx
	return k
}

// podOn creates pod ns/name on node and returns it.
func (k *cluster) podOn(t *testing.T, node, ns, name string, lbls map[string]string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause"}}},
	}
	p, err := k.cs.CoreV1().Pods(ns).Create(k.ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// addressedEndpoint creates a pod's endpoint with addresses from the
// agent's IPAM, as membrane-cni does on ADD.
func (k *cluster) addressedEndpoint(t *testing.T, ns, pod string) *models.Endpoint {
	t.Helper()
	r, err := k.c.IPAMAllocate(k.ctx, "", ns+"/"+pod)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := k.c.EndpointCreate(k.ctx, "container-id:"+ns+"-"+pod, &models.EndpointChangeRequest{
		K8sNamespace: ns, K8sPodName: pod, SyncBuild: true, Addressing: r.Address,
		Labels: []string{"cni:network=test", "k8s:io.kubernetes.pod.namespace=" + ns},
	})
	if err != nil {
		t.Fatalf("create endpoint of %s/%s: %v", ns, pod, err)
	}
	return ep
}

// mepStatus reads ns/name's MembraneEndpoint (nil: absent).
func mepStatus(t *testing.T, ctx context.Context, dyn dynamic.Interface, ns, name string) (*unstructured.Unstructured, *v2.EndpointStatus) {
	t.Helper()
	u, err := dyn.Resource(mepGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var mep v2.MembraneEndpoint
	if err := fromUnstructured(u, &mep); err != nil {
		t.Fatal(err)
	}
	return u, &mep.Status
}

// TestEndpointStatusObjects: a pod's endpoint gets a MembraneEndpoint
// (owned by the pod, labelled with the node) with its ID, identity,
// addresses and state; a relabel changes the identity in it; the
// endpoint's deletion deletes it.
func TestEndpointStatusObjects(t *testing.T) {
	k := startAgent(t, nodeName, nil)
	k.namespace(t, "mep-a", nil)
	pod := k.podOn(t, nodeName, "mep-a", "web", map[string]string{"app": "web"})
	ep := k.addressedEndpoint(t, "mep-a", "web")
	var first int64
	k.eventually(t, "object written", func() (bool, string) {
		u, st := mepStatus(t, k.ctx, k.dyn, "mep-a", "web")
		if st == nil {
			return false, "no object"
		}
		owners := u.GetOwnerReferences()
		ok := st.ID == ep.ID && st.Identity != nil && st.Identity.ID == ep.Identity.ID && st.State == "ready" &&
			st.Networking.IPv4 == ep.Addressing.IPv4 && st.Networking.NodeName == nodeName &&
			len(owners) == 1 && owners[0].UID == pod.UID && u.GetLabels()[v2.EndpointNodeLabel] == nodeName &&
			slices.Contains(st.Identity.Labels, "k8s:app=web")
		if st.Identity != nil {
			first = st.Identity.ID
		}
		return ok, fmt.Sprintf("object %+v owners %v; endpoint %d identity %d", st, owners, ep.ID, ep.Identity.ID)
	})

	pod.Labels = map[string]string{"app": "web-v2"}
	if _, err := k.cs.CoreV1().Pods("mep-a").Update(k.ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.eventually(t, "relabel reaches the object", func() (bool, string) {
		cur := k.get(t, ep.ID)
		_, st := mepStatus(t, k.ctx, k.dyn, "mep-a", "web")
		if st == nil || st.Identity == nil || !identityResolved(cur) {
			return false, fmt.Sprintf("object %+v", st)
		}
		return st.Identity.ID == cur.Identity.ID && st.Identity.ID != first && slices.Contains(st.Identity.Labels, "k8s:app=web-v2"),
			fmt.Sprintf("object identity %d, endpoint %d, first %d", st.Identity.ID, cur.Identity.ID, first)
	})

	if err := k.c.EndpointDelete(k.ctx, fmt.Sprint(ep.ID)); err != nil {
		t.Fatal(err)
	}
	k.eventually(t, "object deleted with the endpoint", func() (bool, string) {
		_, st := mepStatus(t, k.ctx, k.dyn, "mep-a", "web")
		return st == nil, fmt.Sprintf("object %+v", st)
	})
}

// TestEndpointStatusOrphansDeleted: at start, objects of this node whose
// endpoint does not exist are deleted; other nodes' objects stay.
func TestEndpointStatusOrphansDeleted(t *testing.T) {
	env := kubetest.Require(t)
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	installEndpointCRD(t, dyn)
	cs, err := newClientset(env)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mep-orphans"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.CoreV1().Namespaces().Delete(context.Background(), "mep-orphans", metav1.DeleteOptions{})
	})
	createMEP(t, dyn, "mep-orphans", "ghost", nodeName, "10.204.0.250", 1234, "")
	createMEP(t, dyn, "mep-orphans", "elsewhere", "node-z", "10.230.0.9", 1235, "192.0.2.30")
	k := startAgent(t, nodeName, nil)
	k.eventually(t, "orphan deleted at start", func() (bool, string) {
		_, st := mepStatus(t, k.ctx, dyn, "mep-orphans", "ghost")
		return st == nil, fmt.Sprintf("object %+v", st)
	})
	if _, st := mepStatus(t, k.ctx, dyn, "mep-orphans", "elsewhere"); st == nil {
		t.Fatal("another node's object was deleted")
	}
}

// createMEP writes a MembraneEndpoint as node's agent would.
func createMEP(t testing.TB, dyn dynamic.Interface, ns, name, node, ip string, id int64, nodeIP string) {
	t.Helper()
	u := mepObject(ns, name, node, ip, id, nodeIP)
	if _, err := dyn.Resource(mepGVR).Namespace(ns).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create membraneendpoint %s/%s: %v", ns, name, err)
	}
}

func mepObject(ns, name, node, ip string, id int64, nodeIP string) *unstructured.Unstructured {
	st := map[string]any{"id": int64(7), "state": "ready", "policyRevision": int64(1),
		"networking": map[string]any{"ipv4": ip, "nodeName": node, "nodeIP": nodeIP}}
	if id != 0 {
		st["identity"] = map[string]any{"id": id, "labels": []any{"k8s:app=" + name}}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v2.GroupVersion.String(), "kind": v2.EndpointKind,
		"metadata": map[string]any{"name": name, "namespace": ns, "labels": map[string]any{v2.EndpointNodeLabel: node}},
		"status":   st,
	}}
}

// remoteRow is the index's ipcache row for ip (nil: none).
func remoteRow(a *agent.Agent, ip string) *index.IPCacheEntry {
	p := netip.MustParsePrefix(ip + "/32")
	for _, e := range a.Index.IPCache() {
		if e.Prefix == p {
			return e
		}
	}
	return nil
}

// TestRemoteEndpointsFromAPIServer: another node's objects land in the
// ipcache (index with the node as tunnel endpoint, and the datapath),
// follow identity changes and go when deleted; this node's own objects
// are not remote.
func TestRemoteEndpointsFromAPIServer(t *testing.T) {
	env := kubetest.Require(t)
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	installEndpointCRD(t, dyn)
	cs, err := newClientset(env)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "remote-a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), "remote-a", metav1.DeleteOptions{}) })
	// The objects' node: their addresses lie in its pod CIDR.
	createNode(t, cs, "node-r", []string{"10.231.0.0/24"}, "192.0.2.51")
	// Present before the agent starts: the first full replacement.
	createMEP(t, dyn, "remote-a", "before", "node-r", "10.231.0.1", 50001, "192.0.2.51")
	k := startAgent(t, "node-q", nil)
	k.eventually(t, "existing remote endpoint in the ipcache", func() (bool, string) {
		e := remoteRow(k.a, "10.231.0.1")
		return e != nil && e.Identity == 50001 && e.Source == index.SourceRemote && e.TunnelEndpoint == netip.MustParseAddr("192.0.2.51") &&
			k.fake.IPCache()[netip.MustParsePrefix("10.231.0.1/32")] == 50001, fmt.Sprintf("row %+v", e)
	})
	createMEP(t, dyn, "remote-a", "after", "node-r", "10.231.0.2", 50002, "192.0.2.51")
	createMEP(t, dyn, "remote-a", "own", "node-q", "10.231.0.3", 50003, "")
	createMEP(t, dyn, "remote-a", "no-identity", "node-r", "10.231.0.4", 0, "192.0.2.51")
	k.eventually(t, "new remote endpoint in the ipcache", func() (bool, string) {
		e := remoteRow(k.a, "10.231.0.2")
		return e != nil && e.Identity == 50002 && k.fake.IPCache()[netip.MustParsePrefix("10.231.0.2/32")] == 50002, fmt.Sprintf("row %+v", e)
	})
	// Changed identity and address.
	u, err := dyn.Resource(mepGVR).Namespace("remote-a").Get(ctx, "before", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(u.Object, int64(50011), "status", "identity", "id")
	_ = unstructured.SetNestedField(u.Object, "10.231.0.11", "status", "networking", "ipv4")
	if _, err := dyn.Resource(mepGVR).Namespace("remote-a").Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.eventually(t, "update followed", func() (bool, string) {
		e, old := remoteRow(k.a, "10.231.0.11"), remoteRow(k.a, "10.231.0.1")
		_, oldInDP := k.fake.IPCache()[netip.MustParsePrefix("10.231.0.1/32")]
		return e != nil && e.Identity == 50011 && old == nil && !oldInDP, fmt.Sprintf("new %+v old %+v", e, old)
	})
	if err := dyn.Resource(mepGVR).Namespace("remote-a").Delete(ctx, "after", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	k.eventually(t, "delete followed", func() (bool, string) {
		_, inDP := k.fake.IPCache()[netip.MustParsePrefix("10.231.0.2/32")]
		return remoteRow(k.a, "10.231.0.2") == nil && !inDP, "still there"
	})
	// Handled in order with the delete above: own and identity-less
	// objects claim nothing.
	for _, ip := range []string{"10.231.0.3", "10.231.0.4"} {
		if e := remoteRow(k.a, ip); e != nil {
			t.Fatalf("%s in the ipcache: %+v", ip, e)
		}
	}
	st, err := k.c.Status(k.ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Other tests' objects of other nodes count too (the API server has
	// no namespace controller to remove them).
	if st.K8s == nil || !st.K8s.RemoteEndpointsSynced || st.K8s.RemoteEndpoints < 1 {
		t.Fatalf("status k8s = %+v, want remote endpoints synced, at least 1 held", st.K8s)
	}
}

// TestRemoteEndpointsTwoAgents: a pod's endpoint on node b is written by
// b's agent and lands in a's ipcache with b's address.
func TestRemoteEndpointsTwoAgents(t *testing.T) {
	env := kubetest.Require(t)
	cs, err := newClientset(env)
	if err != nil {
		t.Fatal(err)
	}
	createNode(t, cs, "two-b", []string{"10.232.0.0/24"}, "192.0.2.62")
	a := startAgent(t, "two-a", nil)
	b := startAgent(t, "two-b", func(c *agent.Config) { c.IPv4Range = netip.MustParsePrefix("10.232.0.0/24") })
	b.namespace(t, "two", nil)
	b.podOn(t, "two-b", "two", "db", map[string]string{"app": "db"})
	ep := b.addressedEndpoint(t, "two", "db")
	ip := ep.Addressing.IPv4
	a.eventually(t, "b's pod in a's ipcache", func() (bool, string) {
		e := remoteRow(a.a, ip)
		return e != nil && e.Identity == identity.NumericIdentity(ep.Identity.ID) && e.TunnelEndpoint == netip.MustParseAddr("192.0.2.62") &&
			a.fake.IPCache()[netip.MustParsePrefix(ip+"/32")] == e.Identity, fmt.Sprintf("row %+v", e)
	})
	if err := b.c.EndpointDelete(b.ctx, fmt.Sprint(ep.ID)); err != nil {
		t.Fatal(err)
	}
	a.eventually(t, "b's deleted pod leaves a's ipcache", func() (bool, string) {
		e := remoteRow(a.a, ip)
		return e == nil, fmt.Sprintf("row %+v", e)
	})
	if e := remoteRow(b.a, ip); e != nil && e.Source == index.SourceRemote {
		t.Fatalf("b holds its own pod as remote: %+v", e)
	}
}

// createNode creates a Node with pod CIDRs and an InternalIP (removed at
// cleanup).
func createNode(t testing.TB, cs kubernetes.Interface, name string, cidrs []string, internalIP string) *corev1.Node {
	t.Helper()
	ctx := context.Background()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDRs: cidrs}}
	if len(cidrs) > 0 {
		n.Spec.PodCIDR = cidrs[0]
	}
	n, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	if internalIP != "" {
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: internalIP}, {Type: corev1.NodeHostName, Address: name}}
		if n, err = cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// TestIPAMKubernetes: with --ipam kubernetes the agent allocates from
// the Node's spec.podCIDRs (IPv4 only, and dual-stack with the IPv6 /64
// used from its start), waits for a Node that has none yet, fails
// clearly when none come, and reports a change of them while running.
func TestIPAMKubernetes(t *testing.T) {
	env := kubetest.Require(t)
	cs, err := newClientset(env)
	if err != nil {
		t.Fatal(err)
	}
	kube := func(c *agent.Config) {
		c.IPAM = agent.IPAMKubernetes
		c.IPv4Range = netip.Prefix{}
		c.K8s.PodCIDRWait = time.Minute
	}
	t.Run("ipv4", func(t *testing.T) {
		createNode(t, cs, "cidr-v4", []string{"10.240.1.0/24"}, "192.0.2.71")
		k := startAgent(t, "cidr-v4", kube)
		k.namespace(t, "cidr-v4", nil)
		k.podOn(t, "cidr-v4", "cidr-v4", "p", nil)
		ep := k.addressedEndpoint(t, "cidr-v4", "p")
		got := netip.MustParseAddr(ep.Addressing.IPv4)
		if !netip.MustParsePrefix("10.240.1.0/24").Contains(got) || ep.Addressing.IPv6 != "" {
			t.Fatalf("addresses %+v, want an IPv4 from 10.240.1.0/24 only", ep.Addressing)
		}
		// The Node is re-created with another CIDR (spec.podCIDRs is
		// immutable): reported, not applied.
		if err := cs.CoreV1().Nodes().Delete(k.ctx, "cidr-v4", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		createNode(t, cs, "cidr-v4", []string{"10.240.9.0/24"}, "192.0.2.71")
		k.eventually(t, "pod CIDR change reported", func() (bool, string) {
			st, err := k.c.Status(k.ctx)
			if err != nil || st.K8s == nil {
				return false, fmt.Sprint(err)
			}
			return st.K8s.PodCIDRWarning != "" && slices.Equal(st.K8s.PodCIDRs, []string{"10.240.1.0/24"}), fmt.Sprintf("%+v", st.K8s)
		})
		k.podOn(t, "cidr-v4", "cidr-v4", "q", nil)
		again := k.addressedEndpoint(t, "cidr-v4", "q")
		if a := netip.MustParseAddr(again.Addressing.IPv4); !netip.MustParsePrefix("10.240.1.0/24").Contains(a) {
			t.Fatalf("address %s after the change, want the range in use", a)
		}
	})
	t.Run("dual-stack", func(t *testing.T) {
		createNode(t, cs, "cidr-ds", []string{"10.240.2.0/24", "fd00:240:2::/64"}, "192.0.2.72")
		k := startAgent(t, "cidr-ds", kube)
		k.namespace(t, "cidr-ds", nil)
		k.podOn(t, "cidr-ds", "cidr-ds", "p", nil)
		ep := k.addressedEndpoint(t, "cidr-ds", "p")
		ad := ep.Addressing
		v4, v6 := netip.MustParseAddr(ad.IPv4), netip.MustParseAddr(ad.IPv6)
		if !netip.MustParsePrefix("10.240.2.0/24").Contains(v4) || !netip.MustParsePrefix("fd00:240:2::/104").Contains(v6) {
			t.Fatalf("addresses %+v, want 10.240.2.0/24 and fd00:240:2::/104", ad)
		}
	})
	t.Run("waits for the node", func(t *testing.T) {
		type started struct {
			k   *testAgent
			err error
		}
		// Created without CIDRs, so no start can finish before they come.
		n := createNode(t, cs, "cidr-late", nil, "")
		done := make(chan started, 1)
		go func() {
			k, err := tryStartAgent(t, "cidr-late", kube)
			done <- started{k, err}
		}()
		n.Spec.PodCIDR, n.Spec.PodCIDRs = "10.240.3.0/24", []string{"10.240.3.0/24"}
		if _, err := cs.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		r := <-done
		if r.err != nil {
			t.Fatalf("agent.Start: %v", r.err)
		}
		st, err := r.k.c.IPAMStatus(r.k.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.IPv4 == nil || st.IPv4.Cidr != "10.240.3.0/24" {
			t.Fatalf("ipam status %+v, want range 10.240.3.0/24", st)
		}
	})
	t.Run("no pod cidrs", func(t *testing.T) {
		createNode(t, cs, "cidr-none", nil, "")
		_, err := tryStartAgent(t, "cidr-none", func(c *agent.Config) {
			kube(c)
			c.K8s.PodCIDRWait = time.Second
		})
		if !errors.Is(err, k8s.ErrNoPodCIDRs) {
			t.Fatalf("start without pod CIDRs: %v, want ErrNoPodCIDRs", err)
		}
	})
}

// recordingSink is an in-memory k8s.NodeSink: it keeps the last set.
type recordingSink struct {
	mu   sync.Mutex
	last []datapath.RemoteNode
	n    int
}

func (s *recordingSink) SyncNodes(_ context.Context, source string, nodes []datapath.RemoteNode) error {
	if source != k8s.NodeSource {
		return fmt.Errorf("source %q", source)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last, s.n = slices.Clone(nodes), s.n+1
	return nil
}

func (s *recordingSink) find(name string) (datapath.RemoteNode, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.IndexFunc(s.last, func(n datapath.RemoteNode) bool { return n.Name == name })
	if i < 0 {
		return datapath.RemoteNode{}, false
	}
	return s.last[i], true
}

// TestNodesReachTheSink: other nodes (InternalIP, pod CIDRs) reach the
// node sink as full sets; a deleted node leaves the set; this node is
// never in it.
func TestNodesReachTheSink(t *testing.T) {
	env := kubetest.Require(t)
	cs, err := newClientset(env)
	if err != nil {
		t.Fatal(err)
	}
	sink := &recordingSink{}
	createNode(t, cs, "sink-self", []string{"10.241.0.0/24"}, "192.0.2.80")
	k := startAgent(t, "sink-self", func(c *agent.Config) { c.K8s.Nodes = sink })
	createNode(t, cs, "sink-other", []string{"10.241.1.0/24", "fd00:241:1::/64"}, "192.0.2.81")
	k.eventually(t, "other node in the sink", func() (bool, string) {
		n, ok := sink.find("sink-other")
		want := datapath.RemoteNode{Name: "sink-other", Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.81")},
			PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.241.1.0/24"), netip.MustParsePrefix("fd00:241:1::/64")}}
		return ok && n.Name == want.Name && slices.Equal(n.Addrs, want.Addrs) && slices.Equal(n.PodCIDRs, want.PodCIDRs), fmt.Sprintf("%+v", n)
	})
	if _, ok := sink.find("sink-self"); ok {
		t.Fatal("this node handed over as a remote node")
	}
	if err := cs.CoreV1().Nodes().Delete(k.ctx, "sink-other", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	k.eventually(t, "deleted node leaves the sink", func() (bool, string) {
		_, ok := sink.find("sink-other")
		return !ok, "still there"
	})
}

func newClientset(env *kubetest.Env) (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(env.Config)
}

func fromUnstructured(u *unstructured.Unstructured, into any) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into)
}
