package proxy

import (
	"slices"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/datapath/l7proxy"
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

// TestProxyHeaderSecret: a headerMatch naming a secret through the proxy
// process: the secrets resource (published apart from the endpoint's
// rules, which hold only the reference) gives the value; a rotated
// secret reaches the proxy without a new endpoint revision (the old
// value is refused, the new one passes); a deleted secret makes the
// match fail, or fall back to the match's value when it has one.
func TestProxyHeaderSecret(t *testing.T) {
	r := newRig(t)
	ref := &policy.HeaderSecretRef{Namespace: "membrane-secrets", Name: "token"}
	setSecrets := func(values map[string]string) {
		t.Helper()
		if _, err := r.srv.SetSecrets(l7proxy.Secrets{Values: values}); err != nil {
			t.Fatal(err)
		}
	}
	status := func(path, token string) string {
		var hs []string
		if token != "" {
			hs = append(hs, "X-Token: "+token)
		}
		got := r.rawRequest(path, hs...)
		if _, rest, ok := strings.Cut(got, " "); ok && len(rest) >= 3 {
			return rest[:3]
		}
		return got
	}
	setSecrets(map[string]string{"membrane-secrets/token": "v1"})
	r.setB(1, r.l7(idA,
		policy.HTTPRule{Path: "/s/.*", HeaderMatches: []policy.HeaderMatch{{Name: "X-Token", Secret: ref}}},
		policy.HTTPRule{Path: "/f/.*", HeaderMatches: []policy.HeaderMatch{{Name: "X-Token", Secret: ref, Value: "fallback"}}}))
	testutil.Eventually(t, "revision 1 acknowledged", func() bool { return r.w.isAcked(1) })
	for _, c := range []struct{ path, token, want string }{
		{"/s/1", "v1", "200"}, {"/s/2", "v2", "403"}, {"/s/3", "", "403"}, {"/f/1", "v1", "200"}, {"/f/2", "fallback", "403"},
	} {
		if got := status(c.path, c.token); got != c.want {
			t.Errorf("secret v1: %s with %q: %s, want %s", c.path, c.token, got, c.want)
		}
	}
	setSecrets(map[string]string{"membrane-secrets/token": "v2"})
	testutil.Eventually(t, "the rotated secret in force", func() bool { return status("/s/4", "v2") == "200" })
	if got := status("/s/5", "v1"); got != "403" {
		t.Errorf("rotated: the old value: %s, want 403", got)
	}
	setSecrets(map[string]string{})
	testutil.Eventually(t, "the deleted secret in force", func() bool { return status("/s/6", "v2") == "403" })
	if got := status("/f/3", "fallback"); got != "200" {
		t.Errorf("deleted: the fallback value: %s, want 200", got)
	}
	if got := status("/f/4", "v2"); got != "403" {
		t.Errorf("deleted: the old secret with a fallback: %s, want 403", got)
	}
}
