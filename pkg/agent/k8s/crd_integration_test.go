package k8s_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// apply server-side applies a YAML document to the package's API server.
func (k *cluster) apply(t *testing.T, doc string) *unstructured.Unstructured {
	t.Helper()
	objs, err := kubetest.ReadObjects([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	got, err := kubetest.Apply(k.ctx, k.rc, kubetest.FieldManager, objs)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	return got[0]
}

func (k *cluster) dyn(t *testing.T) dynamic.Interface {
	t.Helper()
	d, err := dynamic.NewForConfig(k.rc)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// nodeStatus returns status.nodes[nodeName] of a policy custom resource.
func (k *cluster) nodeStatus(t *testing.T, resource, ns, name string) (map[string]any, bool) {
	t.Helper()
	r := k.dyn(t).Resource(v2.Resource(resource))
	var (
		u   *unstructured.Unstructured
		err error
	)
	if ns != "" {
		u, err = r.Namespace(ns).Get(k.ctx, name, metav1.GetOptions{})
	} else {
		u, err = r.Get(k.ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	st, ok, _ := unstructured.NestedMap(u.Object, "status", "nodes", nodeName)
	return st, ok
}

// mnpDoc is Cilium's "Layer 3 and 4 together" documentation example with
// apiVersion and kind changed, in namespace ns, admitting role=from.
func mnpDoc(ns, from string) string {
	return fmt.Sprintf(`apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata:
  name: "l3-l4-rule"
  namespace: %s
spec:
  description: "L3-L4 policy to restrict access to port 80 from frontend"
  endpointSelector:
    matchLabels:
      role: backend
  ingress:
  - fromEndpoints:
    - matchLabels:
        role: %s
    toPorts:
    - ports:
      - port: "80"
        protocol: TCP
`, ns, from)
}

func TestMembraneNetworkPolicy(t *testing.T) {
	k := startK8sAgent(t, 10*time.Second)
	k.namespace(t, "mnp-a", nil)
	k.namespace(t, "mnp-b", nil)
	k.pod(t, "mnp-a", "backend", map[string]string{"role": "backend"})
	k.pod(t, "mnp-a", "frontend", map[string]string{"role": "frontend"})
	k.pod(t, "mnp-a", "admin", map[string]string{"role": "admin"})
	k.pod(t, "mnp-b", "frontend", map[string]string{"role": "frontend"})
	be, fe, adm, feB := k.endpoint(t, "mnp-a", "backend"), k.endpoint(t, "mnp-a", "frontend"), k.endpoint(t, "mnp-a", "admin"), k.endpoint(t, "mnp-b", "frontend")
	idFE, idAdm := uint32(fe.Identity.ID), uint32(adm.Identity.ID)

	k.apply(t, mnpDoc("mnp-a", "frontend"))
	k.eventually(t, "MNP imported; backend admits its namespace's frontend only (not mnp-b's)", func() (bool, string) {
		c, r, enf := k.ingressFrom(t, be.ID, 80)
		return slices.Contains(k.policyNames(t), "mnp-a/l3-l4-rule") && enf && slices.Equal(c, []uint32{idFE}) && slices.Equal(r, []uint32{idFE}),
			fmt.Sprintf("computed %v realized %v enforced %v (want [%d], not %d)", c, r, enf, idFE, feB.Identity.ID)
	})
	k.eventually(t, "status.nodes[node] ok", func() (bool, string) {
		st, _ := k.nodeStatus(t, v2.ResourceNetworkPolicies, "mnp-a", "l3-l4-rule")
		return st["ok"] == true && st["enforcing"] == true && st["localPolicyRevision"] != nil, fmt.Sprint(st)
	})

	// Updated (server-side apply again): admin instead of frontend.
	k.apply(t, mnpDoc("mnp-a", "admin"))
	k.eventually(t, "updated MNP admits admin only", func() (bool, string) {
		c, r, _ := k.ingressFrom(t, be.ID, 80)
		return slices.Equal(c, []uint32{idAdm}) && slices.Equal(r, []uint32{idAdm}), fmt.Sprintf("computed %v realized %v (want [%d])", c, r, idAdm)
	})

	// Deleted: backend no longer isolated.
	if err := k.dyn(t).Resource(v2.Resource(v2.ResourceNetworkPolicies)).Namespace("mnp-a").Delete(k.ctx, "l3-l4-rule", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	k.eventually(t, "deleted MNP leaves the repository and the datapath", func() (bool, string) {
		p, err := k.c.EndpointPolicy(k.ctx, fmt.Sprint(be.ID))
		if err != nil {
			return false, err.Error()
		}
		names := k.policyNames(t)
		return !slices.Contains(names, "mnp-a/l3-l4-rule") && !p.IngressEnforced && !p.RealizedIngressEnforced, fmt.Sprint(names)
	})
}

func TestMembraneClusterwideNetworkPolicy(t *testing.T) {
	k := startK8sAgent(t, 10*time.Second)
	k.namespace(t, "mcnp-a", nil)
	k.namespace(t, "mcnp-b", nil)
	k.pod(t, "mcnp-a", "db", map[string]string{"app": "mcnp-db"})
	k.pod(t, "mcnp-b", "web", map[string]string{"app": "mcnp-web"})
	db, web := k.endpoint(t, "mcnp-a", "db"), k.endpoint(t, "mcnp-b", "web")
	idWeb := uint32(web.Identity.ID)
	k.apply(t, `apiVersion: membrane.io/v2
kind: MembraneClusterwideNetworkPolicy
metadata:
  name: mcnp-db-from-web
specs:
- endpointSelector: {matchLabels: {app: mcnp-db}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: mcnp-web}}]
    toPorts: [{ports: [{port: "5432", protocol: TCP}]}]
`)
	t.Cleanup(func() {
		_ = k.dyn(t).Resource(v2.Resource(v2.ResourceClusterwideNetworkPolicies)).Delete(k.ctx, "mcnp-db-from-web", metav1.DeleteOptions{})
	})
	k.eventually(t, "MCNP admits web from another namespace", func() (bool, string) {
		c, r, enf := k.ingressFrom(t, db.ID, 5432)
		return slices.Contains(k.policyNames(t), "/mcnp-db-from-web") && enf && slices.Equal(c, []uint32{idWeb}) && slices.Equal(r, []uint32{idWeb}),
			fmt.Sprintf("computed %v realized %v enforced %v (want [%d])", c, r, enf, idWeb)
	})
	k.eventually(t, "status.nodes[node] ok", func() (bool, string) {
		st, _ := k.nodeStatus(t, v2.ResourceClusterwideNetworkPolicies, "", "mcnp-db-from-web")
		return st["ok"] == true, fmt.Sprint(st)
	})
}

// A custom resource whose subject the agent cannot accept (a namespaced
// policy's nodeSelector: only cluster-wide kinds select nodes) is
// refused whole: the error names the field on
// status.nodes[node] (Accepted False, PolicyRefused) and in a Warning
// event, and nothing enters the repository. (A refused field inside an
// ingress or egress entry refuses only that entry:
// TestMembraneNetworkPolicyPartiallyRefused.)
func TestMembraneNetworkPolicyRefused(t *testing.T) {
	k := startK8sAgent(t, 10*time.Second)
	k.namespace(t, "mnp-deny", nil)
	k.apply(t, `apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata: {name: deny-world, namespace: mnp-deny}
spec:
  nodeSelector: {}
  ingress:
  - fromEntities: [world]
`)
	k.eventually(t, "refusal on status.nodes[node]", func() (bool, string) {
		st, ok := k.nodeStatus(t, v2.ResourceNetworkPolicies, "mnp-deny", "deny-world")
		errMsg, _ := st["error"].(string)
		conds, _ := st["conditions"].([]any)
		reason := ""
		if len(conds) == 1 {
			c, _ := conds[0].(map[string]any)
			reason, _ = c["reason"].(string)
		}
		return ok && st["ok"] == false && st["enforcing"] == false && strings.Contains(errMsg, `spec.nodeSelector: only cluster-wide policies`) &&
			reason == "PolicyRefused", fmt.Sprint(st)
	})
	k.eventually(t, "Warning event naming the field", func() (bool, string) {
		return k.warningEvent(t, "mnp-deny", v2.KindNetworkPolicy, "deny-world", "PolicyRefused", "spec.nodeSelector")
	})
	if names := k.policyNames(t); slices.Contains(names, "mnp-deny/deny-world") {
		t.Fatalf("policies = %v, want the refused one absent", names)
	}
	st, err := k.c.Status(k.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.K8s.PolicyErrors == 0 || st.K8s.MembranePolicies == 0 || !st.K8s.Synced[v2.ResourceNetworkPolicies] {
		t.Fatalf("status k8s = %+v, want a refusal counted and the MNP cache synced", st.K8s)
	}
}

// The same custom resource on an agent whose datapath has a proxy (the
// fake one simulates it, as --l7-proxy on the Linux datapath does) is
// accepted and in force.
func TestMembraneNetworkPolicyL7WithProxy(t *testing.T) {
	k := startK8sAgent(t, 10*time.Second)
	k.namespace(t, "mnp-l7p", nil)
	k.apply(t, `apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata: {name: http-only, namespace: mnp-l7p}
spec:
  endpointSelector: {matchLabels: {app: b}}
  ingress:
  - toPorts:
    - ports: [{port: "80", protocol: TCP}]
      rules: {http: [{method: GET, path: /public}]}
`)
	k.eventually(t, "accepted on status.nodes[node]", func() (bool, string) {
		st, ok := k.nodeStatus(t, v2.ResourceNetworkPolicies, "mnp-l7p", "http-only")
		return ok && st["ok"] == true, fmt.Sprint(st)
	})
	if names := k.policyNames(t); !slices.Contains(names, "mnp-l7p/http-only") {
		t.Fatalf("policies = %v, want mnp-l7p/http-only in force", names)
	}
}

// A NetworkPolicy and a MembraneNetworkPolicy of one namespace/name are
// two policies: deleting one leaves the other in force.
func TestSameNameNetworkPolicyAndMNP(t *testing.T) {
	k := startK8sAgent(t, 10*time.Second)
	k.namespace(t, "mnp-same", nil)
	k.pod(t, "mnp-same", "backend", map[string]string{"role": "backend"})
	k.pod(t, "mnp-same", "frontend", map[string]string{"role": "frontend"})
	be, fe := k.endpoint(t, "mnp-same", "backend"), k.endpoint(t, "mnp-same", "frontend")
	idFE := uint32(fe.Identity.ID)
	k.apply(t, mnpDoc("mnp-same", "frontend")) // port 80
	np := ingressNP("mnp-same", "l3-l4-rule", map[string]string{"role": "backend"}, map[string]string{"role": "frontend"}, 81)
	if _, err := k.cs.NetworkingV1().NetworkPolicies("mnp-same").Create(k.ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.eventually(t, "both policies in force", func() (bool, string) {
		c80, r80, _ := k.ingressFrom(t, be.ID, 80)
		c81, r81, _ := k.ingressFrom(t, be.ID, 81)
		return slices.Equal(r80, []uint32{idFE}) && slices.Equal(r81, []uint32{idFE}) && slices.Equal(c80, r80) && slices.Equal(c81, r81),
			fmt.Sprint(r80, r81)
	})
	if err := k.cs.NetworkingV1().NetworkPolicies("mnp-same").Delete(k.ctx, "l3-l4-rule", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	k.eventually(t, "the MNP stays when the NetworkPolicy goes", func() (bool, string) {
		_, r80, _ := k.ingressFrom(t, be.ID, 80)
		_, r81, _ := k.ingressFrom(t, be.ID, 81)
		return slices.Equal(r80, []uint32{idFE}) && len(r81) == 0, fmt.Sprint(r80, r81)
	})
}
