package k8s_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	"github.com/membrane-cni/membrane/test/kubetest"
)

var (
	cnpResource  = schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnetworkpolicies"}
	ccnpResource = schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumclusterwidenetworkpolicies"}
)

// Issue #36: with --policy-api-groups=membrane.io,cilium.io the agent
// reads cilium.io/v2 CiliumNetworkPolicy and
// CiliumClusterwideNetworkPolicy objects as they are (an operator
// migrating from Cilium rewrites nothing), writes their
// status.nodes[node] as Cilium does, keeps a CiliumNetworkPolicy and a
// NetworkPolicy of one name apart, lets a CCNP's ingressDeny beat them,
// and drops them when they are deleted.
func TestCiliumNetworkPolicies(t *testing.T) {
	kubetest.Require(t).InstallCiliumCRDs(t)
	k := startK8sAgent(t, 10*time.Second, func(c *agent.Config) {
		c.K8s.PolicyAPIGroups = []string{k8s.GroupMembrane, k8s.GroupCilium}
	})
	k.namespace(t, "cnp-a", nil)
	k.pod(t, "cnp-a", "backend", map[string]string{"role": "backend"})
	k.pod(t, "cnp-a", "frontend", map[string]string{"role": "frontend"})
	k.pod(t, "cnp-a", "admin", map[string]string{"role": "admin"})
	be, fe, adm := k.endpoint(t, "cnp-a", "backend"), k.endpoint(t, "cnp-a", "frontend"), k.endpoint(t, "cnp-a", "admin")
	idFE, idAdm := uint32(fe.Identity.ID), uint32(adm.Identity.ID)

	k.apply(t, strings.Replace(strings.Replace(mnpDoc("cnp-a", "frontend"), "membrane.io/v2", "cilium.io/v2", 1),
		"kind: MembraneNetworkPolicy", "kind: CiliumNetworkPolicy", 1))
	np := ingressNP("cnp-a", "l3-l4-rule", map[string]string{"role": "backend"}, map[string]string{"role": "admin"}, 81)
	if _, err := k.cs.NetworkingV1().NetworkPolicies("cnp-a").Create(k.ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.eventually(t, "the CNP and the NetworkPolicy of one name both in force", func() (bool, string) {
		_, r80, enf := k.ingressFrom(t, be.ID, 80)
		_, r81, _ := k.ingressFrom(t, be.ID, 81)
		return enf && slices.Equal(r80, []uint32{idFE}) && slices.Equal(r81, []uint32{idAdm}), fmt.Sprint(r80, r81, k.policyNames(t))
	})
	k.eventually(t, "the CNP's status.nodes[node] written", func() (bool, string) {
		u, err := k.dyn(t).Resource(cnpResource).Namespace("cnp-a").Get(k.ctx, "l3-l4-rule", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		st, _, _ := unstructured.NestedMap(u.Object, "status", "nodes", nodeName)
		return st["ok"] == true && st["enforcing"] == true && st["localPolicyRevision"] != nil, fmt.Sprint(st)
	})

	k.apply(t, `apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: no-frontend}
spec:
  endpointSelector: {matchLabels: {role: backend}}
  ingressDeny:
  - fromEndpoints: [{matchLabels: {role: frontend}}]
`)
	k.eventually(t, "the CCNP's deny beats the CNP's allow", func() (bool, string) {
		c80, r80, _ := k.ingressFrom(t, be.ID, 80)
		_, r81, _ := k.ingressFrom(t, be.ID, 81)
		return len(c80) == 0 && len(r80) == 0 && slices.Equal(r81, []uint32{idAdm}), fmt.Sprint(c80, r80, r81)
	})

	for _, d := range []struct {
		r      schema.GroupVersionResource
		ns, nm string
	}{{cnpResource, "cnp-a", "l3-l4-rule"}, {ccnpResource, "", "no-frontend"}} {
		var err error
		if d.ns != "" {
			err = k.dyn(t).Resource(d.r).Namespace(d.ns).Delete(k.ctx, d.nm, metav1.DeleteOptions{})
		} else {
			err = k.dyn(t).Resource(d.r).Delete(k.ctx, d.nm, metav1.DeleteOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	k.eventually(t, "deleted: only the NetworkPolicy stays", func() (bool, string) {
		_, r80, _ := k.ingressFrom(t, be.ID, 80)
		_, r81, _ := k.ingressFrom(t, be.ID, 81)
		names := k.policyNames(t)
		return len(r80) == 0 && slices.Equal(r81, []uint32{idAdm}) && slices.Equal(names, []string{"cnp-a/l3-l4-rule"}), fmt.Sprint(r80, r81, names)
	})
}
