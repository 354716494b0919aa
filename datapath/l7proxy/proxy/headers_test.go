package proxy

import (
	"slices"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestProxyHeaderMatches: Cilium's headerMatches through the proxy
// process. A header without a mismatch action must hold its value or
// the request is refused (403, B never sees it); the others let the
// rule match and change the request B receives: ADD adds the value next
// to the client's, DELETE removes the header, REPLACE sets the value,
// LOG changes nothing. A request that satisfies every match reaches B
// unchanged.
func TestProxyHeaderMatches(t *testing.T) {
	r := newRig(t)
	r.setB(1, r.l7(idA, policy.HTTPRule{Path: "/h/.*", HeaderMatches: []policy.HeaderMatch{
		{Name: "X-Env", Value: "prod"},
		{Name: "X-Trace", Value: "on", Mismatch: policy.MismatchLog},
		{Name: "X-Team", Value: "payments", Mismatch: policy.MismatchAdd},
		{Name: "X-Debug", Value: "allowed", Mismatch: policy.MismatchDelete},
		{Name: "X-Tenant", Value: "t1", Mismatch: policy.MismatchReplace},
	}}))
	testutil.Eventually(t, "revision 1 acknowledged", func() bool { return r.w.isAcked(1) })

	for _, c := range []struct {
		name    string
		headers []string
	}{
		{"no X-Env", nil},
		{"X-Env staging", []string{"X-Env: staging"}},
	} {
		if got := r.rawRequest("/h/"+strings.ReplaceAll(c.name, " ", "-"), c.headers...); !strings.Contains(got, " 403 ") {
			t.Errorf("%s: %q, want 403", c.name, got)
		}
	}
	if got := r.received(); len(got) != 0 {
		t.Fatalf("B received %q from requests the rule refuses", got)
	}

	if got := r.rawRequest("/h/mismatching", "X-Env: prod", "X-Trace: off", "X-Team: other", "X-Debug: yes", "X-Tenant: t2"); !strings.Contains(got, " 200 ") {
		t.Fatalf("mismatching request: %q, want 200", got)
	}
	h := r.lastHeaders()
	for name, want := range map[string][]string{
		"X-Env": {"prod"}, "X-Trace": {"off"}, "X-Team": {"other", "payments"}, "X-Debug": nil, "X-Tenant": {"t1"},
	} {
		if got := h.Values(name); !slices.Equal(got, want) {
			t.Errorf("mismatching request: B received %s %q, want %q", name, got, want)
		}
	}

	if got := r.rawRequest("/h/matching", "X-Env: prod", "X-Trace: on", "X-Team: payments", "X-Debug: allowed", "X-Tenant: t1"); !strings.Contains(got, " 200 ") {
		t.Fatalf("matching request: %q, want 200", got)
	}
	h = r.lastHeaders()
	for name, want := range map[string][]string{
		"X-Env": {"prod"}, "X-Trace": {"on"}, "X-Team": {"payments"}, "X-Debug": {"allowed"}, "X-Tenant": {"t1"},
	} {
		if got := h.Values(name); !slices.Equal(got, want) {
			t.Errorf("matching request: B received %s %q, want %q", name, got, want)
		}
	}
}
