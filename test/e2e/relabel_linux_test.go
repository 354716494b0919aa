//go:build linux

package e2e

import (
	"context"
	"fmt"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestRelabel: a policy admits pods labelled role=client from namespaces
// labelled team=blue; relabelling the client pod and its namespace
// through the API server turns enforcement on and off without
// recreating anything.
func TestRelabel(t *testing.T) {
	c := requireCluster(t)
	ctx := context.Background()
	srvNS := c.namespace(t, "relabel-srv", nil)
	cliNS := c.namespace(t, "relabel-cli", map[string]string{"team": "red"})
	pods := c.createPods(t,
		podSpec(srvNS, "server", "", map[string]string{"app": "server"}),
		podSpec(cliNS, "client", "", map[string]string{"role": "none"}))
	server, client := pods[srvNS+"/server"], pods[cliNS+"/client"]
	from := mustNetns(t, client)
	testutil.EventuallyErr(t, "no policy: open", func() error { return reachable(from, server, 80, "tcp", true) })

	pol := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "blue-clients"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "blue"}},
				PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}},
			}}}},
		},
	}
	if _, err := c.client.NetworkingV1().NetworkPolicies(srvNS).Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	relabel := func(kind, ns, name, key, value string) {
		t.Helper()
		patch := []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, key, value))
		var err error
		if kind == "namespace" {
			_, err = c.client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, patch, metav1.PatchOptions{})
		} else {
			_, err = c.client.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
		}
		if err != nil {
			t.Fatalf("relabel %s %s/%s: %v", kind, ns, name, err)
		}
	}
	for _, step := range []struct {
		what             string
		kind, key, value string
		want             bool
	}{
		{"policy, wrong pod and namespace labels: denied", "", "", "", false},
		{"pod relabelled role=client, namespace still red: denied", "pod", "role", "client", false},
		{"namespace relabelled team=blue: allowed", "namespace", "team", "blue", true},
		{"pod relabelled role=none: denied", "pod", "role", "none", false},
		{"pod relabelled role=client again: allowed", "pod", "role", "client", true},
		{"namespace relabelled team=red: denied", "namespace", "team", "red", false},
	} {
		if step.kind != "" {
			relabel(step.kind, cliNS, "client", step.key, step.value)
		}
		testutil.EventuallyErr(t, step.what, func() error { return reachable(from, server, 80, "tcp", step.want) })
		if step.want {
			expect(t, from, server, 81, "udp", true)
		}
	}
	cur, err := c.client.CoreV1().Pods(cliNS).Get(ctx, "client", metav1.GetOptions{})
	if err != nil || cur.UID != client.UID {
		t.Errorf("client pod recreated or gone: %v", err)
	}
}
