package actors_test

import (
	"encoding/json"
	"net/netip"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// cidrPolicy returns a CNP named name for app=web in namespace default
// allowing egress to n host addresses from 10.0.0.0 upwards.
func cidrPolicy(tb testing.TB, name string, n int) []*policy.Policy {
	tb.Helper()
	cidrs := make([]string, n)
	for i := range cidrs {
		v := 10<<24 + uint32(i)
		cidrs[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), 32).String()
	}
	doc, err := json.Marshal(map[string]any{
		"apiVersion": policy.APIVersionCNP, "kind": policy.KindCNP,
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{
			"endpointSelector": map[string]any{"matchLabels": map[string]string{"app": "web"}},
			"egress":           []any{map[string]any{"toCIDR": cidrs}},
		},
	})
	if err != nil {
		tb.Fatal(err)
	}
	pols, err := policy.Parse(doc)
	if err != nil {
		tb.Fatal(err)
	}
	return pols
}

// TestEndpointCreateDuringLargeImport: a sync endpoint create sent while
// a 50,000-CIDR import is in flight gets its policy computed from the
// revision before the import (the policy actor answered between the
// import's steps instead of after it) and succeeds within a short
// RequestTimeout; the import succeeds too.
func TestEndpointCreateDuringLargeImport(t *testing.T) {
	h := startSystem(t, func(c *actors.Config) { c.Endpoint.RequestTimeout = 2 * time.Second })
	small := askAs[*messages.PolicyResult](t, h, h.sys.PIDForTest("policy"), &messages.PolicyImport{Policies: cidrPolicy(t, "small", 1)})
	if small.Err != nil {
		t.Fatalf("import small: %v", small.Err)
	}
	big := cidrPolicy(t, "big", 50000)
	imported := h.sys.Actors.Root.RequestFuture(h.sys.PIDForTest("policy"), &messages.PolicyImport{Policies: big}, 5*time.Minute)

	ep, err := h.create(t, podSpec(t, "c1", "default", "web", "k8s:app=web", "k8s:"+policy.NamespaceLabel+"=default"), true)
	if err != nil {
		t.Fatalf("create during the import: %v", err)
	}
	res, err := imported.Result()
	if err != nil {
		t.Fatalf("import big: %v", err)
	}
	r, ok := res.(*messages.PolicyResult)
	if !ok || r.Err != nil {
		t.Fatalf("import big = %#v", res)
	}
	if ep.Policy == nil {
		t.Fatal("endpoint built without a policy, want the small one's")
	}
	if ep.Policy.Revision != small.Revision || r.Revision <= small.Revision {
		t.Fatalf("endpoint built with the policy of revision %d (%d keys), want %d (before the import, revision %d): its policy waited for the import",
			ep.Policy.Revision, len(ep.Policy.Allow), small.Revision, r.Revision)
	}
	testutil.Eventually(t, "the endpoint regenerated with the imported policy", func() bool {
		cur, ok := h.indexed(ep.ID)
		return ok && cur.Policy != nil && cur.Policy.Revision == r.Revision && len(cur.Policy.Allow) == 50000 // small's CIDR is big's first
	})
}

// TestPolicyDeleteWaitsForStagedImport: a delete sent while an import
// is staged runs after it, in order: it finds the policy.
func TestPolicyDeleteWaitsForStagedImport(t *testing.T) {
	h := startSystem(t, func(c *actors.Config) { c.Policy.ImportStep = 10 })
	imported := h.sys.Actors.Root.RequestFuture(h.sys.PIDForTest("policy"), &messages.PolicyImport{Policies: cidrPolicy(t, "big", 1000)}, waitTimeout)
	del := askAs[*messages.PolicyResult](t, h, h.sys.PIDForTest("policy"), &messages.PolicyDelete{Name: "default/big"})
	if del.Err != nil || del.Deleted != 1 {
		t.Fatalf("delete during the import = %+v, want the imported policy deleted", del)
	}
	res, err := imported.Result()
	if r, ok := res.(*messages.PolicyResult); err != nil || !ok || r.Err != nil || r.Revision >= del.Revision {
		t.Fatalf("import = %#v, %v; want success before the delete (revision %d)", res, err, del.Revision)
	}
	if n := len(h.ix.Policies()); n != 0 {
		t.Errorf("%d policies left in the index", n)
	}
}
