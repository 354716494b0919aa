package k8s_test

import (
	"context"
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
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// One real etcd + kube-apiserver for the package; every test uses its own
// namespaces, so they share it.
func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

const nodeName = "node-a"

type cluster struct {
	cs  kubernetes.Interface
	c   *client.Client
	ctx context.Context
	// rc is the API server's admin configuration.
	rc *rest.Config
}

// startK8sAgent starts a fake-datapath agent in Kubernetes mode against
// the package's API server.
func startK8sAgent(t *testing.T, podWait time.Duration, mutate ...func(*agent.Config)) *cluster {
	t.Helper()
	k, _ := startK8sAgentIn(t, t.TempDir(), podWait, mutate...)
	return k
}

// startK8sAgentIn starts the agent on state in dir; stop (idempotent, also
// run at cleanup) stops it.
func startK8sAgentIn(t *testing.T, dir string, podWait time.Duration, mutate ...func(*agent.Config)) (k *cluster, stop func()) {
	t.Helper()
	env := kubetest.Require(t)
	env.InstallCRDs(t)
	cfg := agent.Config{
		Socket:    filepath.Join(dir, "run", "a.sock"),
		StateDir:  filepath.Join(dir, "state"),
		IPv4Range: netip.MustParsePrefix("10.204.0.0/24"),
		Datapath:  "fake",
		Fake:      datapath.NewFake(1),
		// Identities per node: cluster identities (MembraneIdentity) are
		// tested in pkg/agent/k8s/identitycrd.
		K8s: &k8s.Config{Kubeconfig: env.Kubeconfig, NodeName: nodeName, PodWait: podWait, SyncTimeout: time.Minute,
			Identity: k8s.IdentityConfig{Mode: k8s.IdentityLocal}},
	}
	for _, m := range mutate {
		m(&cfg)
	}
	a, err := agent.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("agent.Start: %v", err)
	}
	c := client.New(cfg.Socket)
	var once sync.Once
	stop = func() {
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
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return &cluster{cs: cs, c: c, ctx: ctx, rc: env.Config}, stop
}

func (k *cluster) namespace(t *testing.T, name string, lbls map[string]string) {
	t.Helper()
	_, err := k.cs.CoreV1().Namespaces().Create(k.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.cs.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

func (k *cluster) pod(t *testing.T, ns, name string, lbls map[string]string) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls},
		Spec: corev1.PodSpec{NodeName: nodeName, ServiceAccountName: "sa-" + name,
			Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause"}}},
	}
	if _, err := k.cs.CoreV1().Pods(ns).Create(k.ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// endpoint creates a pod's endpoint as membrane-cni does on ADD.
func (k *cluster) endpoint(t *testing.T, ns, pod string) *models.Endpoint {
	t.Helper()
	ep, err := k.c.EndpointCreate(k.ctx, "container-id:"+ns+"-"+pod, &models.EndpointChangeRequest{
		K8sNamespace: ns, K8sPodName: pod, SyncBuild: true,
		Labels: []string{"cni:network=test", "k8s:io.kubernetes.pod.namespace=" + ns},
	})
	if err != nil {
		t.Fatalf("create endpoint of %s/%s: %v", ns, pod, err)
	}
	return ep
}

// eventually polls cond until it holds; it fails the test with cond's
// last explanation when the test's context ends first.
func (k *cluster) eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	for {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		select {
		case <-k.ctx.Done():
			t.Fatalf("%s: never happened; last: %s", what, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (k *cluster) get(t *testing.T, id int64) *models.Endpoint {
	t.Helper()
	ep, err := k.c.EndpointGet(k.ctx, fmt.Sprint(id))
	if err != nil {
		t.Fatal(err)
	}
	return ep
}

// identityLabels returns the labels the agent binds to ep's identity.
func (k *cluster) identityLabels(t *testing.T, ep *models.Endpoint) []string {
	t.Helper()
	if ep.Identity == nil {
		t.Fatalf("endpoint %d has no identity", ep.ID)
	}
	id, err := k.c.Identity(k.ctx, ep.Identity.ID)
	if err != nil {
		t.Fatal(err)
	}
	return id.Labels
}

// identityResolved reports whether ep's identity is the one of its
// current labels (a relabel publishes the labels before the identity).
func identityResolved(ep *models.Endpoint) bool {
	return ep.Identity != nil && slices.Equal(ep.Identity.Labels, ep.Labels)
}

func hasAll(got []string, want ...string) bool {
	for _, w := range want {
		if !slices.Contains(got, w) {
			return false
		}
	}
	return true
}

func TestPodAndNamespaceLabels(t *testing.T) {
	k := startK8sAgent(t, 10*time.Second)
	st, err := k.c.Status(k.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.K8s == nil || st.K8s.State != "synced" || !st.K8s.Synced["pods"] || st.K8s.Node != nodeName {
		t.Fatalf("status k8s = %+v, want synced on %s", st.K8s, nodeName)
	}
	k.namespace(t, "labels-a", map[string]string{"team": "a"})
	k.pod(t, "labels-a", "web", map[string]string{"app": "web", "tier": "front"})
	ep := k.endpoint(t, "labels-a", "web")
	want := []string{"cni:network=test", "k8s:app=web", "k8s:tier=front", "k8s:io.kubernetes.pod.namespace=labels-a",
		"k8s:io.cilium.k8s.policy.serviceaccount=sa-web", "k8s:io.cilium.k8s.namespace.labels.team=a",
		"k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=labels-a"}
	if !hasAll(ep.Labels, want...) || len(ep.Labels) != len(want) {
		t.Fatalf("endpoint labels = %v, want %v", ep.Labels, want)
	}
	if got := k.identityLabels(t, ep); !slices.Equal(got, ep.Labels) {
		t.Fatalf("identity %d labels = %v, want the endpoint's %v", ep.Identity.ID, got, ep.Labels)
	}
	first := ep.Identity.ID

	// Pod relabelled: app changes, tier goes.
	pod, err := k.cs.CoreV1().Pods("labels-a").Get(k.ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Labels = map[string]string{"app": "web2"}
	if _, err := k.cs.CoreV1().Pods("labels-a").Update(k.ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.eventually(t, "pod relabel reaches the endpoint", func() (bool, string) {
		ep = k.get(t, ep.ID)
		return hasAll(ep.Labels, "k8s:app=web2") && !hasAll(ep.Labels, "k8s:tier=front") && !hasAll(ep.Labels, "k8s:app=web") &&
			identityResolved(ep), fmt.Sprint(ep.Labels, ep.Identity)
	})
	if ep.Identity == nil || ep.Identity.ID == first {
		t.Fatalf("identity after relabel = %+v, want a new one (was %d)", ep.Identity, first)
	}
	if got := k.identityLabels(t, ep); !slices.Equal(got, ep.Labels) || !hasAll(got, "cni:network=test") {
		t.Fatalf("identity labels after relabel = %v, want %v", got, ep.Labels)
	}
	second := ep.Identity.ID

	// Namespace relabelled.
	ns, err := k.cs.CoreV1().Namespaces().Get(k.ctx, "labels-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels["team"] = "b"
	if _, err := k.cs.CoreV1().Namespaces().Update(k.ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.eventually(t, "namespace relabel reaches the endpoint", func() (bool, string) {
		ep = k.get(t, ep.ID)
		return hasAll(ep.Labels, "k8s:io.cilium.k8s.namespace.labels.team=b", "k8s:app=web2") && identityResolved(ep), fmt.Sprint(ep.Labels, ep.Identity)
	})
	if ep.Identity == nil || ep.Identity.ID == second || ep.Identity.ID == first {
		t.Fatalf("identity after namespace relabel = %+v, want a new one", ep.Identity)
	}
}

func TestInitIdentityUntilPodCached(t *testing.T) {
	k := startK8sAgent(t, 200*time.Millisecond)
	k.namespace(t, "late", nil)
	ep := k.endpoint(t, "late", "slow") // the pod does not exist yet
	if ep.Identity == nil || ep.Identity.ID != 5 || !slices.Equal(ep.Labels, []string{"reserved:init"}) {
		t.Fatalf("endpoint before its pod = labels %v identity %+v, want reserved:init (5)", ep.Labels, ep.Identity)
	}
	k.pod(t, "late", "slow", map[string]string{"app": "slow"})
	k.eventually(t, "init endpoint relabelled once its pod is cached", func() (bool, string) {
		ep = k.get(t, ep.ID)
		return hasAll(ep.Labels, "k8s:app=slow", "cni:network=test", "k8s:io.kubernetes.pod.namespace=late") &&
			!hasAll(ep.Labels, "reserved:init") && identityResolved(ep), fmt.Sprint(ep.Labels, ep.Identity)
	})
	if ep.Identity == nil || ep.Identity.ID < 256 {
		t.Fatalf("identity after relabel = %+v, want an allocated one", ep.Identity)
	}
}

// ingressFrom returns the identities endpoint id's computed and realised
// policy admit on TCP port.
// ingressFrom returns the identities the endpoint's computed and
// realised policy allow on TCP port (deny entries left out).
func (k *cluster) ingressFrom(t *testing.T, id int64, port uint16) (computed, realized []uint32, enforced bool) {
	t.Helper()
	p, err := k.c.EndpointPolicy(k.ctx, fmt.Sprint(id))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range p.Computed {
		if e.Direction == "ingress" && e.Port == port && e.Protocol == "TCP" && !e.Deny {
			computed = append(computed, e.Identity)
		}
	}
	for _, e := range p.Realized {
		if e.Direction == "ingress" && e.Port == port && e.Protocol == "TCP" && !e.Deny {
			realized = append(realized, e.Identity)
		}
	}
	slices.Sort(computed)
	slices.Sort(realized)
	return computed, realized, p.IngressEnforced && p.RealizedIngressEnforced
}

func (k *cluster) policyNames(t *testing.T) []string {
	t.Helper()
	l, err := k.c.PolicyList(k.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range l.Policies {
		names = append(names, p.Namespace+"/"+p.Name)
	}
	return names
}

func TestNetworkPolicy(t *testing.T) {
	k := startK8sAgent(t, 10*time.Second)
	k.namespace(t, "np-a", map[string]string{"team": "a"})
	k.namespace(t, "np-b", map[string]string{"team": "b"})
	k.pod(t, "np-a", "web", map[string]string{"app": "web"})
	k.pod(t, "np-a", "client", map[string]string{"app": "client"})
	k.pod(t, "np-b", "client", map[string]string{"app": "client"})
	web, ca, cb := k.endpoint(t, "np-a", "web"), k.endpoint(t, "np-a", "client"), k.endpoint(t, "np-b", "client")
	idA, idB := uint32(ca.Identity.ID), uint32(cb.Identity.ID)

	port := intstr.FromInt32(80)
	tcp := corev1.ProtocolTCP
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "np-a", Name: "web-from-team"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}},
					PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}},
				}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
			}},
		},
	}
	nps := k.cs.NetworkingV1().NetworkPolicies("np-a")
	if _, err := nps.Create(k.ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.eventually(t, "policy imported and web admits team a's client only", func() (bool, string) {
		c, r, enf := k.ingressFrom(t, web.ID, 80)
		ok := slices.Contains(k.policyNames(t), "np-a/web-from-team") && enf &&
			slices.Equal(c, []uint32{idA}) && slices.Equal(r, []uint32{idA})
		return ok, fmt.Sprintf("computed %v realized %v enforced %v (want [%d])", c, r, enf, idA)
	})

	// Updated: team b's namespace instead.
	cur, err := nps.Get(k.ctx, "web-from-team", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Ingress[0].From[0].NamespaceSelector.MatchLabels["team"] = "b"
	if _, err := nps.Update(k.ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.eventually(t, "updated policy admits team b's client only", func() (bool, string) {
		c, r, _ := k.ingressFrom(t, web.ID, 80)
		return slices.Equal(c, []uint32{idB}) && slices.Equal(r, []uint32{idB}), fmt.Sprintf("computed %v realized %v (want [%d])", c, r, idB)
	})

	// Namespace np-b leaves team b: its client's new identity is not admitted.
	ns, err := k.cs.CoreV1().Namespaces().Get(k.ctx, "np-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels["team"] = "c"
	if _, err := k.cs.CoreV1().Namespaces().Update(k.ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.eventually(t, "namespace relabel withdraws the admission", func() (bool, string) {
		cb = k.get(t, cb.ID)
		c, r, enf := k.ingressFrom(t, web.ID, 80)
		relabelled := hasAll(cb.Labels, "k8s:io.cilium.k8s.namespace.labels.team=c") && identityResolved(cb) && uint32(cb.Identity.ID) != idB
		return relabelled && enf && len(c) == 0 && len(r) == 0, fmt.Sprintf("client-b labels %v computed %v realized %v", cb.Labels, c, r)
	})

	// Deleted: web is no longer isolated.
	if err := nps.Delete(k.ctx, "web-from-team", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	k.eventually(t, "deleted policy leaves the repository and web", func() (bool, string) {
		p, err := k.c.EndpointPolicy(k.ctx, fmt.Sprint(web.ID))
		if err != nil {
			return false, err.Error()
		}
		names := k.policyNames(t)
		return !slices.Contains(names, "np-a/web-from-team") && !p.IngressEnforced && !p.RealizedIngressEnforced,
			fmt.Sprintf("policies %v ingress enforced %v/%v", names, p.IngressEnforced, p.RealizedIngressEnforced)
	})
}

// A NetworkPolicy and a MembraneNetworkPolicy deleted while the agent was down are deleted at the next
// start's sync; one PUT through the agent's API stays. The persisted
// Kubernetes policy selects namespaces by label, so the restart also
// proves policy.json reloads with the Kubernetes parser options.
func TestNetworkPolicyPrunedAtSync(t *testing.T) {
	dir := t.TempDir()
	k, stop := startK8sAgentIn(t, dir, 10*time.Second)
	k.namespace(t, "np-prune", nil)
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "np-prune", Name: "gone-while-down"},
		Spec: networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}},
		}}}}},
	}
	nps := k.cs.NetworkingV1().NetworkPolicies("np-prune")
	if _, err := nps.Create(k.ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.c.PolicyImport(k.ctx, []byte(`{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"put-by-api","namespace":"np-prune"},"spec":{"podSelector":{}}}`), "application/json"); err != nil {
		t.Fatal(err)
	}
	k.apply(t, mnpDoc("np-prune", "frontend"))
	k.eventually(t, "the three policies in the repository", func() (bool, string) {
		names := k.policyNames(t)
		return hasAll(names, "np-prune/gone-while-down", "np-prune/put-by-api", "np-prune/l3-l4-rule"), fmt.Sprint(names)
	})
	stop()
	if err := nps.Delete(k.ctx, "gone-while-down", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := k.dyn(t).Resource(v2.Resource(v2.ResourceNetworkPolicies)).Namespace("np-prune").Delete(k.ctx, "l3-l4-rule", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	k2, _ := startK8sAgentIn(t, dir, 10*time.Second)
	k2.eventually(t, "the deleted policy pruned, the API's kept", func() (bool, string) {
		names := k2.policyNames(t)
		return !slices.Contains(names, "np-prune/gone-while-down") && !slices.Contains(names, "np-prune/l3-l4-rule") &&
			slices.Contains(names, "np-prune/put-by-api"), fmt.Sprint(names)
	})
}
