package datapath_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
	"github.com/membrane-cni/membrane/test/policyscenario"
)

// smallPolicyMap is --policy-map-max in the map-full tests: 14 policy
// entries fit (two are the enforcement flags).
const smallPolicyMap = 16

// ingressPolicy is a CiliumNetworkPolicy "b-in" selecting app=b that
// lets app=from in on TCP ports.
func ingressPolicy(from string, ports ...int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: b-in
  namespace: default
spec:
  endpointSelector:
    matchLabels:
      app: b
  ingress:
  - fromEndpoints:
    - matchLabels:
        k8s:app: %s
    toPorts:
    - ports:
`, from)
	for _, p := range ports {
		fmt.Fprintf(&b, "      - port: \"%d\"\n        protocol: TCP\n", p)
	}
	return []byte(b.String())
}

// portRange is n ports from first.
func portRange(first, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = first + i
	}
	return out
}

// metricValue is the agent's counter or gauge series name{label="value"}
// (0 if absent), read from its registry.
func metricValue(t *testing.T, e *nodeharness.Node, name, label, value string) float64 {
	t.Helper()
	mfs, err := e.Agent.Metrics().Registry().Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					if c := m.GetCounter(); c != nil {
						return c.GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// TestPolicyMapFull is issue #38's "kernel map full" for an endpoint's
// policy map, on a real agent with --policy-map-max 16: a policy whose
// entries do not fit fails closed (the endpoint denies every new
// connection, never keeps its more permissive old policy), says so in
// the endpoint's status and membrane_bpf_map_full_total{map="policy"},
// and recovers by itself when the policy shrinks; a change whose old and
// new entries do not fit together (but the new ones alone do) is
// realised exactly, never left halfway.
func TestPolicyMapFull(t *testing.T) {
	e := newEnv(t, "10.238.0.0/24")
	startAgent(e, func(c *agent.Config) { c.Linux.Maps.PolicyMax = smallPolicyMap })
	c := e.Client()
	a := addPolicyPod(t, e, c, "pod-a", "k8s:app=a")
	b := addPolicyPod(t, e, c, "pod-b", "k8s:app=b")
	cc := addPolicyPod(t, e, c, "pod-c", "k8s:app=c")
	b.listen(t, 8080)
	importPolicy := func(t *testing.T, doc []byte) {
		t.Helper()
		if _, err := c.PolicyImport(context.Background(), doc, client.ContentTypeYAML); err != nil {
			t.Fatal(err)
		}
	}
	idA, idC := identity.NumericIdentity(a.ep.Identity.ID), identity.NumericIdentity(cc.ep.Identity.ID)
	allows := func(m *policy.MapState, id identity.NumericIdentity) bool {
		return m.Allows(id, 8080, policy.ProtoTCP, policy.Ingress)
	}

	t.Run("A and C may reach B", func(t *testing.T) {
		importPolicy(t, ingressPolicy("a", 8080))
		// Two selectors: one policy each, as the rules are one per peer.
		importPolicy(t, []byte(strings.Replace(string(ingressPolicy("c", 8080)), "name: b-in", "name: b-in-c", 1)))
		policyscenario.WaitRealized(t, c, b.ep.ID, "A and C allowed into B", func(m *policy.MapState) bool {
			return allows(m, idA) && allows(m, idC)
		})
		mustTalk(t, a, b, 8080)
		mustTalk(t, cc, b, 8080)
	})
	before := metricValue(t, e, "membrane_bpf_map_full_total", "map", "policy")
	t.Run("a policy that does not fit fails closed", func(t *testing.T) {
		// C's rule goes, A's grows to 20 ports: 20 entries, 14 fit.
		if _, err := c.PolicyDelete(context.Background(), "default/b-in-c"); err != nil {
			t.Fatal(err)
		}
		importPolicy(t, ingressPolicy("a", append([]int{8080}, portRange(9001, 19)...)...))
		testutil.EventuallyErr(t, "B's status naming the full policy map", func() error {
			ep, err := c.EndpointGet(context.Background(), fmt.Sprint(b.ep.ID))
			if err != nil {
				return err
			}
			if !strings.Contains(ep.LastError, "policy map full") || ep.State == "ready" {
				return fmt.Errorf("state %s, last error %q", ep.State, ep.LastError)
			}
			return nil
		})
		m := policyscenario.WaitRealized(t, c, b.ep.ID, "deny-all", func(m *policy.MapState) bool {
			return m.Enforced(policy.Ingress) && m.Enforced(policy.Egress) && len(m.Allow) == 0
		})
		t.Logf("realised while full: %+v", m)
		// C's old allowance is gone, and A's new one is not there.
		mustNotTalk(t, cc, b, 8080)
		mustNotTalk(t, a, b, 8080)
		if after := metricValue(t, e, "membrane_bpf_map_full_total", "map", "policy"); after <= before {
			t.Errorf(`membrane_bpf_map_full_total{map="policy"} %v -> %v, want it to grow`, before, after)
		}
	})
	t.Run("the policy shrinks: B recovers by itself", func(t *testing.T) {
		importPolicy(t, ingressPolicy("a", append([]int{8080}, portRange(9101, 9)...)...))
		policyscenario.WaitRealized(t, c, b.ep.ID, "A's 10 ports", func(m *policy.MapState) bool {
			return allows(m, idA) && len(m.Allow) == 10 && !m.Enforced(policy.Egress)
		})
		testutil.EventuallyErr(t, "B ready without an error", func() error {
			ep, err := c.EndpointGet(context.Background(), fmt.Sprint(b.ep.ID))
			if err != nil {
				return err
			}
			if ep.State != "ready" || ep.LastError != "" {
				return fmt.Errorf("state %s, last error %q", ep.State, ep.LastError)
			}
			return nil
		})
		mustTalk(t, a, b, 8080)
		mustNotTalk(t, cc, b, 8080)
	})
	t.Run("old and new entries do not fit together", func(t *testing.T) {
		// 10 entries held, 10 others wanted: 22 with the flags while
		// both are there, 16 fit.
		importPolicy(t, ingressPolicy("c", append([]int{8080}, portRange(9201, 9)...)...))
		policyscenario.WaitRealized(t, c, b.ep.ID, "C's 10 ports only", func(m *policy.MapState) bool {
			return allows(m, idC) && !allows(m, idA) && len(m.Allow) == 10
		})
		mustTalk(t, cc, b, 8080)
		mustNotTalk(t, a, b, 8080)
		ep, err := c.EndpointGet(context.Background(), fmt.Sprint(b.ep.ID))
		if err != nil {
			t.Fatal(err)
		}
		if ep.LastError != "" {
			t.Errorf("B's last error %q after a change whose new policy fits", ep.LastError)
		}
	})
}
