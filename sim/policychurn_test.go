package sim

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// TestRunPolicyChurn: policies imported, replaced and deleted during the
// churn; every endpoint's realised policy matches its computed one at the
// end, the ipcache too, and the report carries the policy operations.
func TestRunPolicyChurn(t *testing.T) {
	sc := testScenario("policy-churn")
	sc.PolicyChurn, sc.Identities = 1, 4 // enough changes for deletes even on a slow, loaded machine
	r := runScenario(t, sc)
	requireClean(t, r)
	t.Logf("policy churn: %s", r.PolicyChurn)
	for _, op := range []string{"policy_import", "policy_delete"} {
		if s := r.LatencyMS[op]; s == nil || s.Count == 0 || s.P50 <= 0 {
			t.Errorf("latency of %s: %+v (%s)", op, s, r.PolicyChurn)
		}
	}
	if !strings.Contains(r.PolicyChurn, "imports") {
		t.Errorf("policy_churn %q", r.PolicyChurn)
	}
}

func TestPolicyDiff(t *testing.T) {
	in := models.PolicyEntry{Identity: 300, Port: 1000, Protocol: "TCP", Direction: "ingress"}
	other := models.PolicyEntry{Identity: 301, Port: 1000, Protocol: "TCP", Direction: "ingress"}
	for _, tc := range []struct {
		name string
		p    models.EndpointPolicy
		want string // "" or part of the message
	}{
		{"nothing", models.EndpointPolicy{}, ""},
		{"same", models.EndpointPolicy{IngressEnforced: true, RealizedIngressEnforced: true, Computed: []models.PolicyEntry{in, other},
			Realized: []models.RealizedPolicyEntry{{PolicyEntry: other, Packets: 3}, {PolicyEntry: in}}}, ""},
		{"entry missing", models.EndpointPolicy{IngressEnforced: true, RealizedIngressEnforced: true, Computed: []models.PolicyEntry{in, other},
			Realized: []models.RealizedPolicyEntry{{PolicyEntry: in}}}, "computed 2 entries"},
		{"cidr entry missing", models.EndpointPolicy{EgressEnforced: true, RealizedEgressEnforced: true,
			ComputedCIDR: []models.CIDRPolicyEntry{{CIDR: "10.0.0.0/8", Protocol: "ANY", Direction: "egress", Allow: true}}}, "computed 1 entries"},
		{"cidr verdict differs", models.EndpointPolicy{EgressEnforced: true, RealizedEgressEnforced: true,
			ComputedCIDR: []models.CIDRPolicyEntry{{CIDR: "10.0.0.0/8", Protocol: "ANY", Direction: "egress", Allow: true}},
			RealizedCIDR: []models.RealizedCIDRPolicyEntry{{CIDRPolicyEntry: models.CIDRPolicyEntry{CIDR: "10.0.0.0/8", Protocol: "ANY", Direction: "egress"}}}}, "computed 1 entries"},
		{"enforcement differs", models.EndpointPolicy{EgressEnforced: true}, "enforcement"},
		{"unreadable", models.EndpointPolicy{RealizedError: "boom"}, "unreadable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := policyDiff(&tc.p)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("policyDiff = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestIPCacheFindings(t *testing.T) {
	ep := &endpoint.Endpoint{ID: 1, ContainerID: "sim-0-1", IPv4: netip.MustParseAddr("10.0.0.2"), Identity: identity.NumericIdentity(300)}
	for _, tc := range []struct {
		name    string
		entries []models.IPCacheEntry
		want    int
	}{
		{"agrees", []models.IPCacheEntry{{CIDR: "10.0.0.2/32", Identity: 300, Source: "endpoint"}, {CIDR: "0.0.0.0/0", Identity: 2, Source: "reserved"}}, 0},
		{"missing", nil, 1},
		{"wrong identity", []models.IPCacheEntry{{CIDR: "10.0.0.2/32", Identity: 301, Source: "endpoint"}}, 1},
		{"stale entry", []models.IPCacheEntry{{CIDR: "10.0.0.2/32", Identity: 300, Source: "endpoint"}, {CIDR: "10.0.0.3/32", Identity: 300, Source: "endpoint"}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ipcacheFindings([]*endpoint.Endpoint{ep}, tc.entries); len(got) != tc.want {
				t.Errorf("%d findings %v, want %d", len(got), got, tc.want)
			}
		})
	}
}
