// Package deploy_test applies deploy/ to a real kube-apiserver with
// server-side apply and checks the agent's RBAC as its ServiceAccount.
package deploy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

const (
	saNamespace = "membrane-system"
	saName      = "membrane-agent"
)

// manifests are the plain manifests, deploy/kubernetes/*.yaml (generated
// from the Helm chart's defaults by make manifests; tools/chart's
// TestManifestsCurrent keeps them current) in name order, as `kubectl
// apply -f deploy/kubernetes/` takes them, and the uninstall DaemonSet
// (deploy/kubernetes/uninstall/).
func manifests(t *testing.T) []string {
	t.Helper()
	root := filepath.Join(kubetest.RepoRoot(), "deploy", "kubernetes")
	files, err := filepath.Glob(filepath.Join(root, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(files)
	if !slices.Contains(files, filepath.Join(root, "crds.yaml")) || !slices.Contains(files, filepath.Join(root, "membrane.yaml")) {
		t.Fatalf("deploy/kubernetes: %v: want crds.yaml and membrane.yaml (make manifests)", files)
	}
	un, err := filepath.Glob(filepath.Join(root, "uninstall", "*.yaml"))
	if err != nil || len(un) == 0 {
		t.Fatalf("deploy/kubernetes/uninstall: %v %v", un, err)
	}
	return append(files, un...)
}

// applyAll server-side applies the manifests (twice: a second apply of the same
// manifests must be a clean no-op, not a conflict) and returns the
// objects.
func applyAll(t *testing.T, env *kubetest.Env) []*unstructured.Unstructured {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	files := manifests(t)
	var got []*unstructured.Unstructured
	for range 2 {
		var err error
		if got, err = kubetest.ApplyFiles(ctx, env.Config, "membrane-deploy-test", files...); err != nil {
			t.Fatalf("server-side apply of %v: %v", files, err)
		}
	}
	return got
}

func TestManifestsApply(t *testing.T) {
	env := kubetest.Require(t)
	applyInFileOrder(t, env)
	objs := applyAll(t, env)
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
	}
	crds, _ := kubetest.CRDFiles()
	for kind, min := range map[string]int{"DaemonSet": 1, "ServiceAccount": 1, "ClusterRole": 1, "ClusterRoleBinding": 1,
		"ConfigMap": 1, "CustomResourceDefinition": len(crds)} {
		if kinds[kind] < min {
			t.Fatalf("applied %v: want at least %d %s", kinds, min, kind)
		}
	}
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, o := range objs {
		if o.GetKind() == "CustomResourceDefinition" {
			if err := kubetest.WaitEstablished(ctx, dyn, o.GetName()); err != nil {
				t.Fatal(err)
			}
		}
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := cs.AppsV1().DaemonSets(saNamespace).Get(ctx, "membrane-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkDaemonSet(t, ds.Spec.Template.Spec)
}

// applyInFileOrder applies deploy/kubernetes/*.yaml one file after the
// other in name order, each file's objects in order, as `kubectl apply -f
// deploy/kubernetes/` does: on an API server that has none of them yet,
// each object must be accepted where it stands (the Namespace before the
// objects in it, the CRDs before anything that names them).
func applyInFileOrder(t *testing.T, env *kubetest.Env) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Get(ctx, saNamespace, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Logf("namespace %s exists already (err %v): the order is not checked on a fresh server", saNamespace, err)
	}
	for _, f := range manifests(t) {
		if filepath.Base(filepath.Dir(f)) == "uninstall" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := kubetest.ReadObjects(b)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, o := range objs {
			if _, err := kubetest.Apply(ctx, env.Config, "membrane-deploy-test", []*unstructured.Unstructured{o}); err != nil {
				t.Fatalf("%s: %s %s, applied in file order: %v", filepath.Base(f), o.GetKind(), o.GetName(), err)
			}
		}
	}
}

// checkDaemonSet checks what the agent needs from its pod: host network,
// its ServiceAccount, the node name, the host paths.
func checkDaemonSet(t *testing.T, spec corev1.PodSpec) {
	t.Helper()
	if !spec.HostNetwork || spec.ServiceAccountName != saName || len(spec.InitContainers) != 2 {
		t.Fatalf("pod spec: hostNetwork %v serviceAccount %q init containers %d", spec.HostNetwork, spec.ServiceAccountName, len(spec.InitContainers))
	}
	paths := map[string]bool{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			paths[v.HostPath.Path] = true
		}
	}
	for _, p := range []string{"/sys/fs/bpf", "/var/run/membrane", "/var/lib/membrane", "/opt/cni/bin", "/etc/cni/net.d", "/proc/sys/net"} {
		if !paths[p] {
			t.Errorf("no hostPath volume %s (have %v)", p, paths)
		}
	}
	agentC := spec.Containers[0]
	args := strings.Join(agentC.Command, " ")
	for _, want := range []string{"--k8s", "--node-name=$(NODE_NAME)", "--ipam=$(MEMBRANE_IPAM)", "--state-dir=/var/lib/membrane/state"} {
		if !strings.Contains(args, want) {
			t.Errorf("agent command %q lacks %s", args, want)
		}
	}
	checkPrivileges(t, spec)
	nodeFromDownward := false
	for _, e := range agentC.Env {
		nodeFromDownward = nodeFromDownward || e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}
	if !nodeFromDownward {
		t.Error("NODE_NAME does not come from spec.nodeName")
	}
}

// checkPrivileges checks that only the bpffs mount runs privileged: the
// agent has a list of capabilities (all others dropped), the CNI install
// none, and every container runs a binary of the image, no shell.
func checkPrivileges(t *testing.T, spec corev1.PodSpec) {
	t.Helper()
	for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
		sc := c.SecurityContext
		privileged := sc != nil && sc.Privileged != nil && *sc.Privileged
		if privileged != (c.Name == "mount-bpffs") {
			t.Errorf("container %s: privileged %v; only mount-bpffs may be", c.Name, privileged)
		}
		if len(c.Command) == 0 || !strings.HasPrefix(c.Command[0], "/usr/local/bin/membrane-") {
			t.Errorf("container %s runs %v, want a membrane binary (the image has no shell)", c.Name, c.Command)
		}
		if privileged {
			continue
		}
		if sc == nil || sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
			t.Errorf("container %s does not drop ALL capabilities", c.Name)
		}
		for _, m := range c.VolumeMounts {
			if m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional {
				t.Errorf("container %s mounts %s Bidirectional (needs privileged)", c.Name, m.MountPath)
			}
		}
	}
}

// The conflist the ConfigMap installs is deploy/05-membrane.conflist (the
// one the plugin's tests and `make install` use).
func TestConfigMapConflist(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(kubetest.RepoRoot(), "deploy", "kubernetes", "membrane.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.ReadObjects(b)
	if err != nil {
		t.Fatal(err)
	}
	var inMap string
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" {
			inMap, _, _ = unstructured.NestedString(o.Object, "data", "05-membrane.conflist")
		}
	}
	file, err := os.ReadFile(filepath.Join(kubetest.RepoRoot(), "deploy", "05-membrane.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	var a, b2 any
	if err := json.Unmarshal([]byte(inMap), &a); err != nil {
		t.Fatalf("ConfigMap conflist: %v", err)
	}
	if err := json.Unmarshal(file, &b2); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b2) {
		t.Fatalf("ConfigMap conflist %v differs from deploy/05-membrane.conflist %v", a, b2)
	}
}

// asServiceAccount is env's configuration impersonating the agent's
// ServiceAccount on node rbac-node (as its pod-bound token would
// authenticate).
func asServiceAccount(env *kubetest.Env) *rest.Config {
	return asAgentOn(env, "rbac-node")
}

// asAgentOn impersonates the agent's ServiceAccount with the node name a
// pod-bound token on that node carries ("" for a token bound to no node).
func asAgentOn(env *kubetest.Env, node string) *rest.Config {
	c := rest.CopyConfig(env.Config)
	c.Impersonate = rest.ImpersonationConfig{
		UserName: fmt.Sprintf("system:serviceaccount:%s:%s", saNamespace, saName),
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + saNamespace, "system:authenticated"},
	}
	if node != "" {
		c.Impersonate.Extra = map[string][]string{nodeNameExtra: {node}}
	}
	return c
}

// TestAgentRBAC runs the agent's Kubernetes mode as the ServiceAccount:
// every informer syncs and a refused policy's status and event are
// written; what the agent never needs is refused.
func TestAgentRBAC(t *testing.T) {
	env := kubetest.Require(t)
	applyAll(t, env)
	sa := asServiceAccount(env)
	dir := t.TempDir()
	secrets := &secretSink{}
	cfg := agent.Config{
		Socket: filepath.Join(dir, "a.sock"), StateDir: filepath.Join(dir, "state"),
		IPv4Range: netip.MustParsePrefix("10.205.0.0/24"), Datapath: "fake", Fake: datapath.NewFake(1),
		K8s: &k8s.Config{REST: sa, NodeName: "rbac-node", SyncTimeout: time.Minute, PodWait: time.Second, Secrets: secrets},
	}
	cfg.Actors.PolicySecretsNamespace = policySecretsNS
	a, err := agent.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
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
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.K8s == nil || st.K8s.State != "synced" {
		t.Fatalf("agent as the ServiceAccount: k8s status %+v, want every cache synced", st.K8s)
	}

	admin, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "rbac-test"}}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	objs, err := kubetest.ReadObjects([]byte(`apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata: {name: refused, namespace: rbac-test}
spec:
  endpointSelector: {}
  egressDeny: [{toEntities: [world], toNodes: [{matchLabels: {a: b}}]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubetest.Apply(ctx, env.Config, kubetest.FieldManager, objs); err != nil {
		t.Fatal(err)
	}
	adminDyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyErr(t, "status.nodes[rbac-node] written as the ServiceAccount", holds(func() (bool, string) {
		u, err := adminDyn.Resource(v2.Resource(v2.ResourceNetworkPolicies)).Namespace("rbac-test").Get(ctx, "refused", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		e, _, _ := unstructured.NestedString(u.Object, "status", "nodes", "rbac-node", "error")
		return strings.Contains(e, "spec.egressDeny[0].toNodes"), fmt.Sprint(u.Object["status"])
	}))
	testutil.EventuallyErr(t, "event created as the ServiceAccount", holds(func() (bool, string) {
		evs, err := admin.CoreV1().Events("rbac-test").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range evs.Items {
			// toNodes in a deny entry is a refused part (the egress
			// direction allows nothing; the rest is in force):
			// PolicyPartiallyRefused.
			if e.Reason == "PolicyPartiallyRefused" && e.Source.Host == "rbac-node" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events", len(evs.Items))
	}))
	checkPolicySecrets(ctx, t, admin, secrets)
	checkRefused(ctx, t, sa)
}

// policySecretsNS is the manifests' policy secrets namespace.
const policySecretsNS = "membrane-secrets"

// secretSink records what the agent's Secret watch hands on.
type secretSink struct {
	mu   sync.Mutex
	last map[string]string
	keys map[string]bool // every key ever handed on
}

func (s *secretSink) SetPolicySecrets(v map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = maps.Clone(v)
	if s.keys == nil {
		s.keys = map[string]bool{}
	}
	for k := range v {
		s.keys[k] = true
	}
}

func (s *secretSink) get() (map[string]string, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.last), slices.Sorted(maps.Keys(s.keys))
}

// checkPolicySecrets: the agent, as the ServiceAccount, watches the
// Secrets of the policy secrets namespace (a Secret created there
// reaches the sink, a change too), and nothing of kube-system's Secret
// with the same name ever does.
func checkPolicySecrets(ctx context.Context, t *testing.T, admin kubernetes.Interface, sink *secretSink) {
	t.Helper()
	for _, ns := range []string{policySecretsNS, "kube-system"} {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "rbac-token", Namespace: ns}, Data: map[string][]byte{"token": []byte("in-" + ns)}}
		if _, err := admin.CoreV1().Secrets(ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = admin.CoreV1().Secrets(ns).Delete(context.Background(), "rbac-token", metav1.DeleteOptions{})
		})
	}
	key := policySecretsNS + "/rbac-token"
	testutil.EventuallyErr(t, "the policy secret watched as the ServiceAccount", holds(func() (bool, string) {
		last, _ := sink.get()
		return last[key] == "in-"+policySecretsNS, fmt.Sprint(slices.Sorted(maps.Keys(last)))
	}))
	upd := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "rbac-token", Namespace: policySecretsNS}, Data: map[string][]byte{"token": []byte("rotated")}}
	if _, err := admin.CoreV1().Secrets(policySecretsNS).Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyErr(t, "the rotated policy secret", holds(func() (bool, string) {
		last, _ := sink.get()
		return last[key] == "rotated", fmt.Sprint(slices.Sorted(maps.Keys(last)))
	}))
	if _, keys := sink.get(); slices.ContainsFunc(keys, func(k string) bool { return !strings.HasPrefix(k, policySecretsNS+"/") }) {
		t.Errorf("secrets handed on: %v, want only %s's", keys, policySecretsNS)
	}
}

// checkRefused asserts that the ServiceAccount can do nothing the agent
// does not need.
func checkRefused(ctx context.Context, t *testing.T, sa *rest.Config) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(sa)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(sa)
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "rbac-test"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}}}
	mnps := dyn.Resource(v2.Resource(v2.ResourceNetworkPolicies)).Namespace("rbac-test")
	for name, call := range map[string]func() error{
		"list secrets": func() error { _, err := cs.CoreV1().Secrets("").List(ctx, metav1.ListOptions{}); return err },
		"get secret": func() error {
			_, err := cs.CoreV1().Secrets("kube-system").Get(ctx, "x", metav1.GetOptions{})
			return err
		},
		// Secrets only in the policy secrets namespace (a Role there):
		// kube-system's, a tenant's and every namespace's are refused,
		// and even there the agent cannot write them.
		"get kube-system policy-named secret": func() error {
			_, err := cs.CoreV1().Secrets("kube-system").Get(ctx, "rbac-token", metav1.GetOptions{})
			return err
		},
		"list kube-system secrets": func() error { _, err := cs.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{}); return err },
		"list tenant secrets":      func() error { _, err := cs.CoreV1().Secrets("rbac-test").List(ctx, metav1.ListOptions{}); return err },
		"watch all secrets": func() error {
			w, err := cs.CoreV1().Secrets("").Watch(ctx, metav1.ListOptions{})
			stopWatch(w)
			return err
		},
		"create policy secret": func() error {
			_, err := cs.CoreV1().Secrets(policySecretsNS).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
			return err
		},
		"create pod": func() error {
			_, err := cs.CoreV1().Pods("rbac-test").Create(ctx, pod, metav1.CreateOptions{})
			return err
		},
		"delete pod": func() error { return cs.CoreV1().Pods("rbac-test").Delete(ctx, "p", metav1.DeleteOptions{}) },
		// patch is granted (the health endpoint annotations of its own
		// Node; the admission policy confines it: TestAgentNodeRestriction);
		// update and delete are not.
		"update node": func() error {
			_, err := cs.CoreV1().Nodes().Update(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rbac-node"}}, metav1.UpdateOptions{})
			return err
		},
		"delete node":      func() error { return cs.CoreV1().Nodes().Delete(ctx, "rbac-node", metav1.DeleteOptions{}) },
		"delete namespace": func() error { return cs.CoreV1().Namespaces().Delete(ctx, "rbac-test", metav1.DeleteOptions{}) },
		"delete networkpolicy": func() error {
			return cs.NetworkingV1().NetworkPolicies("rbac-test").Delete(ctx, "x", metav1.DeleteOptions{})
		},
		"patch policy spec": func() error {
			_, err := mnps.Patch(ctx, "refused", types.MergePatchType, []byte(`{"spec":{"description":"x"}}`), metav1.PatchOptions{})
			return err
		},
		"delete policy":       func() error { return mnps.Delete(ctx, "refused", metav1.DeleteOptions{}) },
		"list configmaps":     func() error { _, err := cs.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{}); return err },
		"list serviceaccount": func() error { _, err := cs.CoreV1().ServiceAccounts("").List(ctx, metav1.ListOptions{}); return err },
	} {
		if err := call(); !apierrors.IsForbidden(err) {
			t.Errorf("%s as the agent's ServiceAccount: err = %v, want Forbidden", name, err)
		}
	}
	// And what it needs is allowed (the informers' lists, explicitly).
	for name, call := range map[string]func() error{
		"list pods":       func() error { _, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); return err },
		"watch nodes":     func() error { w, err := cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{}); stopWatch(w); return err },
		"list namespaces": func() error { _, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); return err },
		"list policy secrets": func() error {
			_, err := cs.CoreV1().Secrets(policySecretsNS).List(ctx, metav1.ListOptions{})
			return err
		},
		"watch policy secrets": func() error {
			w, err := cs.CoreV1().Secrets(policySecretsNS).Watch(ctx, metav1.ListOptions{})
			stopWatch(w)
			return err
		},
		"list mcnps": func() error {
			_, err := dyn.Resource(v2.Resource(v2.ResourceClusterwideNetworkPolicies)).List(ctx, metav1.ListOptions{})
			return err
		},
	} {
		if err := call(); err != nil {
			t.Errorf("%s as the agent's ServiceAccount: %v", name, err)
		}
	}
}

func stopWatch(w interface{ Stop() }) {
	if w != nil && !reflect.ValueOf(w).IsNil() {
		w.Stop()
	}
}

// holds turns a condition that says why it does not hold into
// testutil.EventuallyErr's form.
func holds(cond func() (bool, string)) func() error {
	return func() error {
		if ok, why := cond(); !ok {
			return errors.New(why)
		}
		return nil
	}
}
