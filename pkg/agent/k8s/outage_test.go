package k8s_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// startOwnAgent starts a fake-datapath agent against env (the test's own
// API server), probing the connection every 100 ms.
func startOwnAgent(t *testing.T, env *kubetest.Env) *cluster {
	t.Helper()
	dir := t.TempDir()
	cfg := agent.Config{
		Socket: filepath.Join(dir, "a.sock"), StateDir: filepath.Join(dir, "state"),
		IPv4Range: netip.MustParsePrefix("10.206.0.0/24"), Datapath: "fake", Fake: datapath.NewFake(1),
		K8s: &k8s.Config{REST: env.Config, NodeName: nodeName, PodWait: 5 * time.Second, SyncTimeout: time.Minute,
			ProbeInterval: 100 * time.Millisecond,
			// Node-local identities: this test creates a pod with a new
			// label set during the outage, which crd identities make wait
			// for the API server (identitycrd's outage tests cover that).
			Identity: k8s.IdentityConfig{Mode: k8s.IdentityLocal}},
	}
	a, err := agent.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("agent.Start: %v", err)
	}
	c := client.New(cfg.Socket)
	t.Cleanup(func() {
		c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := a.Stop(ctx); err != nil {
			t.Errorf("agent stop: %v", err)
		}
	})
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	return &cluster{cs: cs, c: c, ctx: ctx, rc: env.Config}
}

func (k *cluster) k8sStatus(t *testing.T) *models.K8sStatus {
	t.Helper()
	st, err := k.c.Status(k.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.K8s == nil {
		t.Fatal("status without k8s")
	}
	return st.K8s
}

func (k *cluster) relabelPod(t *testing.T, ns, name string, lbls map[string]string) {
	t.Helper()
	pod, err := k.cs.CoreV1().Pods(ns).Get(k.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Labels = lbls
	if _, err := k.cs.CoreV1().Pods(ns).Update(k.ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func ingressNP(ns, name string, subject, from map[string]string, port int32) *networkingv1.NetworkPolicy {
	p := intstr.FromInt32(port)
	tcp := corev1.ProtocolTCP
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: subject},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: from}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p}},
			}},
		},
	}
}

// TestAPIServerOutage kills the agent's kube-apiserver mid-run and
// restarts it on the same etcd and port: running endpoints keep their
// datapath, CNI ADD and DEL keep working with the cached pods, the status
// reports the disconnection, changes made just before the kill and right
// after the restart are applied, and the informers resume without
// regenerating an endpoint whose labels and policy did not change.
func TestAPIServerOutage(t *testing.T) {
	env := kubetest.StartOwn(t)
	env.InstallCRDs(t)
	k := startOwnAgent(t, env)
	k.namespace(t, "out-a", map[string]string{"team": "a"})
	k.namespace(t, "out-steady", nil)
	k.pod(t, "out-a", "web", map[string]string{"app": "web"})
	k.pod(t, "out-a", "client", map[string]string{"app": "client"})
	k.pod(t, "out-a", "late", map[string]string{"app": "late"})
	k.pod(t, "out-steady", "s1", map[string]string{"app": "steady"})
	web, cl, s1 := k.endpoint(t, "out-a", "web"), k.endpoint(t, "out-a", "client"), k.endpoint(t, "out-steady", "s1")
	for _, np := range []*networkingv1.NetworkPolicy{
		ingressNP("out-a", "web-from-client", map[string]string{"app": "web"}, map[string]string{"app": "client"}, 80),
		ingressNP("out-steady", "steady-isolated", map[string]string{"app": "steady"}, map[string]string{"app": "nobody"}, 80),
	} {
		if _, err := k.cs.NetworkingV1().NetworkPolicies(np.Namespace).Create(k.ctx, np, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	idClient := uint32(cl.Identity.ID)
	k.eventually(t, "policies realised before the outage", func() (bool, string) {
		c, r, enf := k.ingressFrom(t, web.ID, 80)
		_, _, enfS := k.ingressFrom(t, s1.ID, 80)
		return enf && enfS && slices.Equal(c, []uint32{idClient}) && slices.Equal(r, []uint32{idClient}), fmt.Sprint(c, r, enf, enfS)
	})
	steady := k.get(t, s1.ID)
	before, err := k.c.EndpointList(k.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}

	// Changes made just before the kill: the agent may or may not have
	// seen them when the API server dies; either way they must apply.
	k.relabelPod(t, "out-a", "web", map[string]string{"app": "web", "ver": "2"})
	k.apply(t, `apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata: {name: client-from-web, namespace: out-a}
spec:
  endpointSelector: {matchLabels: {app: client}}
  ingress: [{fromEndpoints: [{matchLabels: {app: web}}], toPorts: [{ports: [{port: "8080", protocol: TCP}]}]}]
`)
	env.StopAPIServer()

	k.eventually(t, "status reports the disconnection", func() (bool, string) {
		st := k.k8sStatus(t)
		return st.Connection == "disconnected" && st.LastError != "" && st.LastErrorAt != nil && st.Disconnects >= 1, fmt.Sprintf("%+v", st)
	})
	// Running endpoints keep their realised policy.
	if _, r, enf := k.ingressFrom(t, s1.ID, 80); !enf || r != nil {
		t.Fatalf("steady endpoint during the outage: realised %v enforced %v", r, enf)
	}
	// CNI ADD with the cached pod's labels, then DEL.
	late := k.endpoint(t, "out-a", "late")
	if !hasAll(late.Labels, "k8s:app=late", "k8s:io.cilium.k8s.namespace.labels.team=a") || late.Identity == nil || late.Identity.ID < 256 {
		t.Fatalf("endpoint created during the outage: labels %v identity %+v, want the cached pod's", late.Labels, late.Identity)
	}
	if err := k.c.EndpointDelete(k.ctx, fmt.Sprint(late.ID)); err != nil {
		t.Fatalf("CNI DEL during the outage: %v", err)
	}

	if err := env.StartAPIServer(context.Background()); err != nil {
		t.Fatal(err)
	}
	k.eventually(t, "status reports the reconnection", func() (bool, string) {
		st := k.k8sStatus(t)
		return st.Connection == "connected" && st.State == "synced", fmt.Sprintf("%+v", st)
	})
	// Changes made right after the restart.
	k.relabelPod(t, "out-a", "client", map[string]string{"app": "client", "ver": "3"})
	ns, err := k.cs.CoreV1().Namespaces().Get(k.ctx, "out-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels["team"] = "b"
	if _, err := k.cs.CoreV1().Namespaces().Update(k.ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	after := ingressNP("out-a", "web-from-client-9090", map[string]string{"app": "web"}, map[string]string{"app": "client"}, 9090)
	if _, err := k.cs.NetworkingV1().NetworkPolicies("out-a").Create(k.ctx, after, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.eventually(t, "changes from before the kill and after the restart applied", func() (bool, string) {
		w, c := k.get(t, web.ID), k.get(t, cl.ID)
		okLabels := hasAll(w.Labels, "k8s:ver=2", "k8s:io.cilium.k8s.namespace.labels.team=b") && identityResolved(w) &&
			hasAll(c.Labels, "k8s:ver=3", "k8s:io.cilium.k8s.namespace.labels.team=b") && identityResolved(c)
		if !okLabels {
			return false, fmt.Sprint(w.Labels, c.Labels)
		}
		idC, idW := uint32(c.Identity.ID), uint32(w.Identity.ID)
		c80, r80, _ := k.ingressFrom(t, web.ID, 80)
		c9090, r9090, _ := k.ingressFrom(t, web.ID, 9090)
		c8080, r8080, _ := k.ingressFrom(t, cl.ID, 8080)
		ok := slices.Equal(r80, []uint32{idC}) && slices.Equal(r9090, []uint32{idC}) && slices.Equal(r8080, []uint32{idW}) &&
			slices.Equal(c80, r80) && slices.Equal(c9090, r9090) && slices.Equal(c8080, r8080)
		return ok, fmt.Sprintf("web<-%d: 80 %v 9090 %v; client<-%d: 8080 %v", idC, r80, r9090, idW, r8080)
	})
	// Nothing lost, and the untouched endpoint was not regenerated by the
	// resync.
	now, err := k.c.EndpointList(k.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(now) != len(before) {
		t.Fatalf("endpoints after the outage: %d, before: %d", len(now), len(before))
	}
	got := k.get(t, s1.ID)
	if got.Regenerations != steady.Regenerations || got.Identity.ID != steady.Identity.ID {
		t.Fatalf("steady endpoint regenerated by the resync: regenerations %d -> %d, identity %d -> %d",
			steady.Regenerations, got.Regenerations, steady.Identity.ID, got.Identity.ID)
	}
}
