package identitycrd_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// node is an in-process agent in Kubernetes mode (fake datapath) with
// the default identity allocation mode (crd).
type node struct {
	name string
	c    *client.Client
}

// startAgent starts an agent for node name against rc, with its own
// state directory and pod range.
func startAgent(t *testing.T, rc *rest.Config, name, cidr string) *node {
	t.Helper()
	dir := t.TempDir()
	cfg := agent.Config{
		Socket:    filepath.Join(dir, "run", "a.sock"),
		StateDir:  filepath.Join(dir, "state"),
		IPv4Range: netip.MustParsePrefix(cidr),
		Datapath:  "fake",
		Fake:      datapath.NewFake(1),
		K8s:       &k8s.Config{REST: rc, NodeName: name, PodWait: 10 * time.Second, SyncTimeout: time.Minute},
	}
	cfg.Actors.Endpoint.RetryMin, cfg.Actors.Endpoint.RetryMax = 50*time.Millisecond, 500*time.Millisecond
	cfg.Actors.ClusterIdentity.CallTimeout = 3 * time.Second
	a, err := agent.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("agent.Start %s: %v", name, err)
	}
	c := client.New(cfg.Socket)
	t.Cleanup(func() {
		c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := a.Stop(ctx); err != nil {
			t.Errorf("agent %s stop: %v", name, err)
		}
	})
	return &node{name: name, c: c}
}

// createPod creates a pod on node with labels and service account sa.
func createPod(t *testing.T, cs kubernetes.Interface, ns, name, node, sa string, lbls map[string]string) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: sa, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause"}}}}
	if _, err := cs.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func createNamespace(t *testing.T, cs kubernetes.Interface, name string) {
	t.Helper()
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

// endpoint creates the pod's endpoint as membrane-cni does on ADD.
func (n *node) endpoint(t *testing.T, ns, pod string) *models.Endpoint {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	ep, err := n.c.EndpointCreate(ctx, "container-id:"+n.name+"-"+pod, &models.EndpointChangeRequest{
		K8sNamespace: ns, K8sPodName: pod, SyncBuild: true,
		Labels: []string{"cni:network=test", "k8s:io.kubernetes.pod.namespace=" + ns},
	})
	if err != nil {
		t.Fatalf("%s: create endpoint of %s/%s: %v", n.name, ns, pod, err)
	}
	return ep
}

func (n *node) identities(t *testing.T) map[int64]*models.Identity {
	t.Helper()
	ids, err := n.c.Identities(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[int64]*models.Identity)
	for _, id := range ids {
		out[id.ID] = id
	}
	return out
}

func (n *node) status(t *testing.T) *models.Status {
	t.Helper()
	st, err := n.c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (n *node) get(t *testing.T, id int64) *models.Endpoint {
	t.Helper()
	ep, err := n.c.EndpointGet(context.Background(), fmt.Sprint(id))
	if err != nil {
		t.Fatal(err)
	}
	return ep
}

// TestAgentsShareClusterIdentity: two agents (nodes) in Kubernetes mode
// give pods with the same labels the same identity, the MembraneIdentity
// object holds those labels and both nodes' use, and an identity
// allocated on one node appears on the other as a remote one.
func TestAgentsShareClusterIdentity(t *testing.T) {
	e := env(t)
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	na, nb := uniq("e2e-a"), uniq("e2e-b")
	a := startAgent(t, e.Config, na, "10.211.0.0/24")
	b := startAgent(t, e.Config, nb, "10.212.0.0/24")
	ns := uniq("ident")
	createNamespace(t, cs, ns)
	createPod(t, cs, ns, "web-a", na, "web", map[string]string{"app": "web"})
	createPod(t, cs, ns, "web-b", nb, "web", map[string]string{"app": "web"})
	createPod(t, cs, ns, "db-b", nb, "db", map[string]string{"app": "db"})
	epA, epB := a.endpoint(t, ns, "web-a"), b.endpoint(t, ns, "web-b")
	if epA.Identity == nil || epB.Identity == nil || epA.Identity.ID != epB.Identity.ID {
		t.Fatalf("same labels, identities %+v and %+v", epA.Identity, epB.Identity)
	}
	id := epA.Identity.ID
	if id < int64(identity.MinLocalIdentity) || !slices.Contains(epA.Labels, "k8s:app=web") {
		t.Fatalf("endpoint A: identity %d labels %v", id, epA.Labels)
	}
	mi := getIdentity(t, e.Config, identity.NumericIdentity(id))
	if mi == nil || mi.Usage[na] == "" || mi.Usage[nb] == "" {
		t.Fatalf("MembraneIdentity %d: %+v, want both nodes in usage", id, mi)
	}
	if keyOf(mi) != mustLabels(t, epA.Labels...).Key() {
		t.Fatalf("MembraneIdentity %d labels %v, want the endpoint's %v", id, mi.SecurityLabels, epA.Labels)
	}
	if row := a.identities(t)[id]; row == nil || row.Scope != "cluster" || row.RefCount != 1 {
		t.Fatalf("GET /v1/identity on %s: %+v, want scope cluster, one reference", na, row)
	}
	db := b.endpoint(t, ns, "db-b")
	testutil.Eventually(t, "node B's db identity on node A", func() bool {
		row := a.identities(t)[db.Identity.ID]
		return row != nil && row.Scope == "remote" && row.RefCount == 0
	})
	st := a.status(t)
	if ci := st.ClusterIdentity; ci == nil || ci.Backend != "kubernetes" || !ci.Healthy || !ci.Synced || ci.InUse < 1 || ci.Waiting != 0 {
		t.Fatalf("status cluster-identity %+v", st.ClusterIdentity)
	}
}

// proxy forwards TCP connections to the API server; stop cuts every
// connection and refuses new ones (the API server is gone for the
// agent), start listens again on the same address.
type proxy struct {
	addr, target string
	mu           sync.Mutex
	lis          net.Listener
	conns        map[net.Conn]struct{}
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	p := &proxy{target: target, conns: make(map[net.Conn]struct{})}
	if err := p.start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	p.addr = p.lis.Addr().String()
	t.Cleanup(p.stop)
	return p
}

func (p *proxy) start(addr string) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.lis = lis
	p.mu.Unlock()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go p.forward(c)
		}
	}()
	return nil
}

func (p *proxy) forward(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()
	go func() { _, _ = io.Copy(up, c); up.Close() }()
	_, _ = io.Copy(c, up)
	c.Close()
}

func (p *proxy) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lis != nil {
		p.lis.Close()
		p.lis = nil
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// TestAPIServerOutage: with the API server unreachable, an endpoint with
// a known identity keeps it and a new endpoint of a known label set gets
// it at once; a new label set waits visibly (the endpoint's error, the
// status, an unhealthy store) and is bound once the API server is back.
func TestAPIServerOutage(t *testing.T) {
	e := env(t)
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, strings.TrimPrefix(e.Config.Host, "https://"))
	rc := rest.CopyConfig(e.Config)
	rc.Host = "https://" + p.addr
	name := uniq("outage")
	n := startAgent(t, rc, name, "10.213.0.0/24")
	ns := uniq("outage")
	createNamespace(t, cs, ns)
	createPod(t, cs, ns, "web-1", name, "web", map[string]string{"app": "web"})
	createPod(t, cs, ns, "web-2", name, "web", map[string]string{"app": "web"})
	ep1 := n.endpoint(t, ns, "web-1")
	testutil.Eventually(t, "web-2 in the agent's pod cache", func() bool { return n.status(t).K8s.Pods >= 2 })

	p.stop()
	ep2 := n.endpoint(t, ns, "web-2") // known label set: no API call needed
	if ep2.Identity == nil || ep2.Identity.ID != ep1.Identity.ID || ep2.State != "ready" {
		t.Fatalf("during the outage, a known label set: %+v state %s, want identity %d", ep2.Identity, ep2.State, ep1.Identity.ID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := n.c.EndpointPatchLabels(ctx, fmt.Sprint(ep1.ID), []string{"container:outage=" + ns}, nil); err == nil {
		t.Fatal("relabel to a new label set succeeded with the API server unreachable")
	}
	testutil.Eventually(t, "the waiting state in the endpoint and the status", func() bool {
		cur := n.get(t, ep1.ID)
		ci := n.status(t).ClusterIdentity
		return strings.Contains(cur.LastError, "cluster identity store unavailable") && ci != nil && ci.Waiting >= 1 && !ci.Healthy
	})
	if cur := n.get(t, ep1.ID); cur.Identity == nil || cur.Identity.ID != ep1.Identity.ID {
		t.Fatalf("the endpoint lost its identity while waiting: %+v", cur.Identity)
	}

	if err := p.start(p.addr); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the new label set bound after the API server came back", func() bool {
		cur := n.get(t, ep1.ID)
		return cur.Identity != nil && cur.Identity.ID != ep1.Identity.ID && slices.Contains(cur.Identity.Labels, "container:outage="+ns) && cur.State == "ready"
	})
	cur := n.get(t, ep1.ID)
	if mi := getIdentity(t, e.Config, identity.NumericIdentity(cur.Identity.ID)); mi == nil || mi.Usage[name] == "" {
		t.Fatalf("MembraneIdentity %d after the outage: %+v", cur.Identity.ID, mi)
	}
	testutil.Eventually(t, "nothing waiting, store healthy", func() bool {
		ci := n.status(t).ClusterIdentity
		return ci != nil && ci.Waiting == 0 && ci.Healthy
	})
}
