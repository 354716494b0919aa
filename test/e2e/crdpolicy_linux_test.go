//go:build linux

package e2e

import (
	"context"
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// cnpDoc is a CiliumNetworkPolicy from Cilium's documentation shape with
// apiVersion and kind changed to Membrane's: app=a may reach app=b on TCP
// 80; nothing else may reach b.
const cnpDoc = `apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata:
  name: a-to-b
spec:
  endpointSelector:
    matchLabels: {app: b}
  ingress:
  - fromEndpoints:
    - matchLabels: {app: a}
    toPorts:
    - ports:
      - {port: "80", protocol: TCP}
`

// TestMembraneNetworkPolicy: a CiliumNetworkPolicy-compatible object
// created through the API server is enforced like its CNP (a admitted on
// TCP 80, not on 81; c denied), reports its status, and deleting it
// opens b again.
func TestMembraneNetworkPolicy(t *testing.T) {
	c := requireCluster(t)
	ctx := context.Background()
	ns := c.namespace(t, "mnp", nil)
	pods := c.createPods(t,
		podSpec(ns, "a", "", map[string]string{"app": "a"}),
		podSpec(ns, "b", "", map[string]string{"app": "b"}),
		podSpec(ns, "c", "", map[string]string{"app": "c"}))
	a, b, cc := pods[ns+"/a"], pods[ns+"/b"], pods[ns+"/c"]
	fromA, fromC := mustNetns(t, a), mustNetns(t, cc)
	testutil.EventuallyErr(t, "no policy: c reaches b", func() error { return reachable(fromC, b, 80, "tcp", true) })

	var obj map[string]any
	if err := yaml.Unmarshal([]byte(cnpDoc), &obj); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(c.cfg)
	if err != nil {
		t.Fatal(err)
	}
	res := dyn.Resource(v2.Resource("membranenetworkpolicies")).Namespace(ns)
	if _, err := res.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create MembraneNetworkPolicy: %v", err)
	}
	testutil.EventuallyErr(t, "policy: c denied on 80", func() error { return reachable(fromC, b, 80, "tcp", false) })
	testutil.EventuallyErr(t, "policy: a admitted on 80", func() error { return reachable(fromA, b, 80, "tcp", true) })
	expect(t, fromA, b, 81, "tcp", false)
	n := c.nodeOf(t, b)
	testutil.EventuallyErr(t, "b's node reports the policy enforced in its status", func() error {
		u, err := res.Get(ctx, "a-to-b", metav1.GetOptions{})
		if err != nil {
			return err
		}
		ok, _, _ := unstructured.NestedBool(u.Object, "status", "nodes", n.name, "ok")
		if !ok {
			return fmt.Errorf("status.nodes[%s] not ok: %v", n.name, u.Object["status"])
		}
		return nil
	})
	if err := res.Delete(ctx, "a-to-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyErr(t, "policy deleted: c reaches b again", func() error { return reachable(fromC, b, 80, "tcp", true) })
}
