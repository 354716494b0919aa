package deploy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// nodeNameExtra is the user extra a pod-bound ServiceAccount token puts
// the pod's node name in (Kubernetes 1.32+).
const nodeNameExtra = "authentication.kubernetes.io/node-name"

var (
	endpointsGVR  = schema.GroupVersionResource{Group: "membrane.io", Version: "v2", Resource: "membraneendpoints"}
	identitiesGVR = schema.GroupVersionResource{Group: "membrane.io", Version: "v2", Resource: "membraneidentities"}
	leasesGVR     = schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
)

// TestAgentNodeRestriction performs, as one node's agent, every forgery
// of another node's objects that RBAC alone allows (all agents share one
// ServiceAccount), and shows each refused by admission.yaml, while the
// same writes on the agent's own objects pass.
func TestAgentNodeRestriction(t *testing.T) {
	env := kubetest.Require(t)
	applyAll(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := dynClient(t, env.Config)
	nodeA, nodeB, noNode := dynClient(t, asAgentOn(env, "node-a")), dynClient(t, asAgentOn(env, "node-b")), dynClient(t, asAgentOn(env, ""))
	ensureNamespace(ctx, t, env, "restrict")
	eps := func(c dynamic.Interface) dynamic.ResourceInterface {
		return c.Resource(endpointsGVR).Namespace("restrict")
	}

	// The policy takes effect once the API server has compiled it: the
	// first forgery is retried until refused (and fails the test if it
	// never is).
	testutil.EventuallyErr(t, "a MembraneEndpoint of node-b created by node-a refused", holds(func() (bool, string) {
		_, err := eps(nodeA).Create(ctx, endpointObject("forged", "node-b", "node-b", "10.9.0.7"), metav1.CreateOptions{})
		if err == nil {
			_ = eps(admin).Delete(ctx, "forged", metav1.DeleteOptions{})
			return false, "created"
		}
		return refusedByPolicy(err), err.Error()
	}))
	mustRefuse(t, "node-a creates an endpoint labelled node-a addressed to node-b", func() error {
		_, err := eps(nodeA).Create(ctx, endpointObject("half", "node-a", "node-b", "10.9.0.8"), metav1.CreateOptions{})
		return err
	})
	mustRefuse(t, "a credential bound to no node creates an endpoint", func() error {
		_, err := eps(noNode).Create(ctx, endpointObject("nonode", "node-a", "node-a", "10.9.0.9"), metav1.CreateOptions{})
		return err
	})
	mustAllow(t, "node-a creates its own endpoint", func() error {
		_, err := eps(nodeA).Create(ctx, endpointObject("own", "node-a", "node-a", "10.9.0.10"), metav1.CreateOptions{})
		return err
	})
	// update changes the current object with edit and writes it as c (the
	// agent writes whole objects: RBAC gives it update, not patch).
	update := func(c dynamic.ResourceInterface, name string, edit func(*unstructured.Unstructured)) func() error {
		return func() error {
			cur, err := eps(admin).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			edit(cur)
			_, err = c.Update(ctx, cur, metav1.UpdateOptions{})
			return err
		}
	}
	mustRefuse(t, "node-b takes over node-a's endpoint", update(eps(nodeB), "own", func(u *unstructured.Unstructured) {
		u.SetLabels(map[string]string{v2.EndpointNodeLabel: "node-b"})
		_ = unstructured.SetNestedField(u.Object, "node-b", "status", "networking", "nodeName")
	}))
	mustRefuse(t, "node-b rewrites node-a's endpoint's identity", update(eps(nodeB), "own", func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, int64(1), "status", "identity", "id")
	}))
	mustRefuse(t, "node-b deletes node-a's endpoint", func() error { return eps(nodeB).Delete(ctx, "own", metav1.DeleteOptions{}) })
	mustAllow(t, "node-a updates its own endpoint", update(eps(nodeA), "own", func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, "regenerating", "status", "state")
	}))
	mustAllow(t, "node-a deletes its own endpoint", func() error { return eps(nodeA).Delete(ctx, "own", metav1.DeleteOptions{}) })

	// Identities: node-b's usage entry is node-b's alone.
	ids := func(c dynamic.Interface) dynamic.ResourceInterface { return c.Resource(identitiesGVR) }
	id := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "membrane.io/v2", "kind": "MembraneIdentity", "metadata": map[string]any{"name": "70001"},
		"security-labels": map[string]any{"k8s:app": "restrict"}, "usage": map[string]any{"node-b": time.Now().UTC().Format(time.RFC3339)},
	}}
	if _, err := ids(admin).Create(ctx, id, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ids(admin).Delete(context.Background(), "70001", metav1.DeleteOptions{}) })
	mustRefuse(t, "node-a removes node-b's identity usage", func() error {
		_, err := ids(nodeA).Patch(ctx, "70001", types.MergePatchType, []byte(`{"usage":{"node-b":null}}`), metav1.PatchOptions{})
		return err
	})
	mustRefuse(t, "node-a writes a usage entry for node-c", func() error {
		_, err := ids(nodeA).Patch(ctx, "70001", types.MergePatchType, []byte(`{"usage":{"node-c":"2026-01-01T00:00:00Z"}}`), metav1.PatchOptions{})
		return err
	})
	mustRefuse(t, "node-a creates an identity in node-b's name", func() error {
		o := id.DeepCopy()
		o.SetName("70002")
		_, err := ids(nodeA).Create(ctx, o, metav1.CreateOptions{})
		return err
	})
	mustAllow(t, "node-a adds its own usage entry", func() error {
		_, err := ids(nodeA).Patch(ctx, "70001", types.MergePatchType,
			[]byte(fmt.Sprintf(`{"usage":{"node-a":%q}}`, time.Now().UTC().Format(time.RFC3339))), metav1.PatchOptions{})
		return err
	})

	// Leases: only the agent's own heartbeat, never a controller's.
	leases := func(c dynamic.Interface) dynamic.ResourceInterface {
		return c.Resource(leasesGVR).Namespace("kube-system")
	}
	mustRefuse(t, "node-a creates the kube-scheduler's leader lease", func() error {
		_, err := leases(nodeA).Create(ctx, leaseObject("kube-scheduler"), metav1.CreateOptions{})
		return err
	})
	if _, err := leases(admin).Create(ctx, leaseObject("membrane-identity-node-b"), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	mustRefuse(t, "node-a renews node-b's heartbeat", func() error {
		cur, err := leases(admin).Get(ctx, "membrane-identity-node-b", metav1.GetOptions{})
		if err != nil {
			return err
		}
		_ = unstructured.SetNestedField(cur.Object, "node-a", "spec", "holderIdentity")
		_, err = leases(nodeA).Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	mustAllow(t, "node-a creates its own heartbeat", func() error {
		_, err := leases(nodeA).Create(ctx, leaseObject("membrane-identity-node-a"), metav1.CreateOptions{})
		return err
	})

	// Node: only the own one's health endpoint annotations.
	nodes := func(c dynamic.Interface) dynamic.ResourceInterface {
		return c.Resource(schema.GroupVersionResource{Version: "v1", Resource: "nodes"})
	}
	for _, n := range []string{"node-a", "node-b"} {
		o := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": n}}}
		if _, err := nodes(admin).Create(ctx, o, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = nodes(admin).Delete(context.Background(), n, metav1.DeleteOptions{}) })
	}
	patchNode := func(c dynamic.Interface, name, body string) func() error {
		return func() error {
			_, err := nodes(c).Patch(ctx, name, types.MergePatchType, []byte(body), metav1.PatchOptions{})
			return err
		}
	}
	mustAllow(t, "node-a publishes its health endpoint's addresses", patchNode(nodeA, "node-a",
		`{"metadata":{"annotations":{"network.membrane.io/ipv4-health-ip":"10.9.0.2","network.membrane.io/ipv6-health-ip":"fd00:9::2"}}}`))
	mustAllow(t, "node-a removes its health endpoint's IPv6 address", patchNode(nodeA, "node-a",
		`{"metadata":{"annotations":{"network.membrane.io/ipv6-health-ip":null}}}`))
	mustRefuse(t, "node-a writes node-b's health endpoint annotation", patchNode(nodeA, "node-b",
		`{"metadata":{"annotations":{"network.membrane.io/ipv4-health-ip":"10.9.1.2"}}}`))
	mustRefuse(t, "node-a labels its own Node", patchNode(nodeA, "node-a", `{"metadata":{"labels":{"role":"forged"}}}`))
	mustRefuse(t, "node-a writes another annotation of its own Node", patchNode(nodeA, "node-a",
		`{"metadata":{"annotations":{"policy.membrane.io/audit-mode":"true"}}}`))
	mustRefuse(t, "node-a taints its own Node", patchNode(nodeA, "node-a",
		`{"spec":{"taints":[{"key":"forged","effect":"NoSchedule"}]}}`))
	mustRefuse(t, "a credential bound to no node annotates a Node", patchNode(noNode, "node-a",
		`{"metadata":{"annotations":{"network.membrane.io/ipv4-health-ip":"10.9.0.3"}}}`))

	// Policy status: each node writes its own entry.
	pols := func(c dynamic.Interface) dynamic.ResourceInterface {
		return c.Resource(v2.Resource(v2.ResourceNetworkPolicies)).Namespace("restrict")
	}
	objs, err := kubetest.ReadObjects([]byte("apiVersion: membrane.io/v2\nkind: MembraneNetworkPolicy\nmetadata: {name: p, namespace: restrict}\nspec:\n  endpointSelector: {}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubetest.Apply(ctx, env.Config, kubetest.FieldManager, objs); err != nil {
		t.Fatal(err)
	}
	mustAllow(t, "node-b writes its own policy status", func() error {
		_, err := pols(nodeB).Patch(ctx, "p", types.MergePatchType, []byte(`{"status":{"nodes":{"node-b":{"ok":true,"enforcing":true}}}}`), metav1.PatchOptions{}, "status")
		return err
	})
	mustRefuse(t, "node-a overwrites node-b's policy status", func() error {
		_, err := pols(nodeA).Patch(ctx, "p", types.MergePatchType, []byte(`{"status":{"nodes":{"node-b":{"ok":false,"enforcing":false,"error":"forged"}}}}`), metav1.PatchOptions{}, "status")
		return err
	})
	mustAllow(t, "node-a writes its own policy status", func() error {
		_, err := pols(nodeA).Patch(ctx, "p", types.MergePatchType, []byte(`{"status":{"nodes":{"node-a":{"ok":true,"enforcing":true}}}}`), metav1.PatchOptions{}, "status")
		return err
	})
}

func dynClient(t *testing.T, c *rest.Config) dynamic.Interface {
	t.Helper()
	d, err := dynamic.NewForConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func ensureNamespace(ctx context.Context, t *testing.T, env *kubetest.Env, name string) {
	t.Helper()
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": name}}}
	_, err := dynClient(t, env.Config).Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).Create(ctx, ns, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

func endpointObject(name, nodeLabel, nodeName, ip string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "membrane.io/v2", "kind": "MembraneEndpoint",
		"metadata": map[string]any{"name": name, "namespace": "restrict", "labels": map[string]any{v2.EndpointNodeLabel: nodeLabel}},
		"status": map[string]any{"id": int64(7), "state": "ready", "policyRevision": int64(1),
			"identity":   map[string]any{"id": int64(70001)},
			"networking": map[string]any{"ipv4": ip, "nodeName": nodeName}},
	}}
}

func leaseObject(name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
		"metadata": map[string]any{"name": name, "namespace": "kube-system"},
		"spec":     map[string]any{"holderIdentity": name},
	}}
}

// refusedByPolicy reports whether err is admission.yaml's refusal (not
// RBAC's, which would mean the test does not reach the policy at all).
func refusedByPolicy(err error) bool {
	return err != nil && (apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) &&
		strings.Contains(err.Error(), "membrane-agent-node-restriction")
}

func mustRefuse(t *testing.T, what string, call func() error) {
	t.Helper()
	if err := call(); !refusedByPolicy(err) {
		t.Errorf("%s: err = %v, want refused by membrane-agent-node-restriction", what, err)
	}
}

func mustAllow(t *testing.T, what string, call func() error) {
	t.Helper()
	if err := call(); err != nil {
		t.Errorf("%s: %v", what, err)
	}
}
