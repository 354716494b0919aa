package policyscenario_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/policyscenario"
)

// startAgent starts an in-process agent on the fake datapath.
func startAgent(tb testing.TB) (*agent.Agent, *datapath.Fake, *client.Client) {
	tb.Helper()
	return startAgentIn(tb, tb.TempDir())
}

// startAgentIn starts an agent (a new process, as far as the fake
// datapath knows) on dir's socket and state directory.
func startAgentIn(tb testing.TB, dir string) (*agent.Agent, *datapath.Fake, *client.Client) {
	tb.Helper()
	fake := datapath.NewFake(1)
	cfg := agent.Config{Socket: filepath.Join(dir, "a.sock"), StateDir: filepath.Join(dir, "state"),
		IPv4Range: netip.MustParsePrefix("10.210.0.0/16"), Datapath: "fake", Fake: fake}
	a, err := agent.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		tb.Fatal(err)
	}
	c := client.New(cfg.Socket)
	tb.Cleanup(func() {
		c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := a.Stop(ctx); err != nil {
			tb.Errorf("agent stop: %v", err)
		}
	})
	return a, fake, c
}

// TestPoliciesSurviveAgentRestart: policies are in <state-dir>/policy.json
// before PUT answers; a new agent loads them before restoring endpoints,
// so a restored endpoint realises its policy in its first regeneration.
func TestPoliciesSurviveAgentRestart(t *testing.T) {
	dir := t.TempDir()
	a1, _, c1 := startAgentIn(t, dir)
	p := policyscenario.Setup(t, policyscenario.Env{Client: c1, CreatePod: policyscenario.APIPods(c1)})
	res, err := c1.PolicyImport(context.Background(), []byte(policyscenario.CNPAllowAToB), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c1.PolicyImport(context.Background(), []byte(policyscenario.CNPEgressCIDR), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "state", agent.PolicyFile)); err != nil {
		t.Fatalf("policy file after PUT: %v", err)
	}
	c1.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a1.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	_, fake, c2 := startAgentIn(t, dir)
	list, err := c2.PolicyList(context.Background())
	if err != nil || list.Revision != res.Revision+1 || len(list.Policies) != 2 {
		t.Fatalf("after restart: %+v, %v; want revision %d and two policies", list, err, res.Revision+1)
	}
	idA := identity.NumericIdentity(p.A.Identity.ID)
	testutil.EventuallyErr(t, "restored B to allow A on 8080 only", func() error {
		if m := fake.Policy(endpoint.ID(p.B.ID)); !m.Allows(idA, 8080, policy.ProtoTCP, policy.Ingress) || !m.Enforced(policy.Ingress) {
			return fmt.Errorf("realised %+v", m)
		}
		return nil
	})
	rows, err := c2.IPCache(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range rows {
		found = found || (r.CIDR == "192.0.2.0/24" && r.Source == "cidr-policy")
	}
	if !found {
		t.Errorf("restored ipcache %+v lacks the policy's CIDR", rows)
	}
}

// TestCorruptPolicyFile: an unreadable policy file is set aside and the
// agent starts without policies.
func TestCorruptPolicyFile(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	if err := os.MkdirAll(state, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, agent.PolicyFile), []byte(`{"revision": 3, "policies": [{"kind": "Nope"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, c := startAgentIn(t, dir)
	list, err := c.PolicyList(context.Background())
	if err != nil || list.Revision != 0 || len(list.Policies) != 0 {
		t.Fatalf("policies = %+v, %v; want none", list, err)
	}
	if _, err := os.Stat(filepath.Join(state, agent.PolicyFile+".corrupt")); err != nil {
		t.Errorf("corrupt file not set aside: %v", err)
	}
}

// TestScenarioFake runs the scenario on the fake datapath and checks
// the fake's own record of what was realised too.
func TestScenarioFake(t *testing.T) {
	_, fake, c := startAgent(t)
	p := policyscenario.Run(t, policyscenario.Env{Client: c, CreatePod: policyscenario.APIPods(c)})
	// After Run: the NetworkPolicy still selects B.
	b := fake.Policy(endpoint.ID(p.B.ID))
	a := fake.Policy(endpoint.ID(p.A.ID))
	if !b.Enforced(policy.Ingress) || !b.Allows(identity.NumericIdentity(p.A.Identity.ID), 8080, policy.ProtoTCP, policy.Ingress) {
		t.Errorf("fake: B's realised policy %+v does not let A in on 8080", b)
	}
	if a != nil {
		t.Errorf("fake: A's realised policy = %+v, want nil (no rule selects A)", a)
	}
	ipc := fake.IPCache()
	for _, ep := range []int64{p.A.ID, p.B.ID, p.C.ID} {
		cur, err := c.EndpointGet(context.Background(), fmt.Sprint(ep))
		if err != nil {
			t.Fatal(err)
		}
		pfx := netip.PrefixFrom(netip.MustParseAddr(cur.Addressing.IPv4), 32)
		if got := ipc[pfx]; got != identity.NumericIdentity(cur.Identity.ID) {
			t.Errorf("fake ipcache %s = %d, want endpoint %d's identity %d", pfx, got, ep, cur.Identity.ID)
		}
	}
	if len(ipc) < 4 { // three endpoints and the gateway (host)
		t.Errorf("fake ipcache %v: want the three endpoints and the gateway", ipc)
	}
	if id, ok := ipc[netip.MustParsePrefix("10.210.0.1/32")]; !ok || id != identity.ReservedHost {
		t.Errorf("fake ipcache: gateway 10.210.0.1/32 = %d %v, want the host identity", id, ok)
	}
}

// BenchmarkPolicyPropagation: time from PUT /v1/policy until every one
// of 200 endpoints (all selected by the policy) realised it on the fake
// datapath. Each iteration changes the allowed port, so every endpoint's
// policy changes.
func BenchmarkPolicyPropagation(b *testing.B) {
	const n = 200
	_, fake, c := startAgent(b)
	create := policyscenario.APIPods(c)
	ids := make([]endpoint.ID, n)
	ctx := context.Background()
	for i := range ids {
		ep, err := create(ctx, policyscenario.Namespace, fmt.Sprintf("bench-%d", i), []string{"k8s:app=bench", fmt.Sprintf("k8s:instance=%d", i%10)})
		if err != nil {
			b.Fatal(err)
		}
		ids[i] = endpoint.ID(ep.ID)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		doc := fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: bench}
spec:
  endpointSelector: {matchLabels: {app: bench}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: bench}}]
    toPorts: [{ports: [{port: "%d", protocol: TCP}]}]
`, 1000+i)
		res, err := c.PolicyImport(ctx, []byte(doc), client.ContentTypeYAML)
		if err != nil {
			b.Fatal(err)
		}
		for _, id := range ids {
			for {
				if m := fake.Policy(id); m != nil && m.Revision >= res.Revision {
					break
				}
				time.Sleep(time.Millisecond)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/put-to-200-realised")
}

// TestPolicyFileWriteFails: when the policy file cannot be written the
// import is applied but PUT says it was not persisted.
func TestPolicyFileWriteFails(t *testing.T) {
	dir := t.TempDir()
	_, _, c := startAgentIn(t, dir)
	// A directory where the file should go: the rename onto it fails.
	if err := os.Mkdir(filepath.Join(dir, "state", agent.PolicyFile), 0o750); err != nil {
		t.Fatal(err)
	}
	_, err := c.PolicyImport(context.Background(), []byte(policyscenario.CNPAllowAToB), "")
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != 500 || !strings.Contains(ae.Message, "applied but not persisted") {
		t.Fatalf("import with an unwritable policy file = %v, want a 500 saying it was not persisted", err)
	}
	list, err := c.PolicyList(context.Background())
	if err != nil || len(list.Policies) != 1 {
		t.Fatalf("policies = %+v, %v; want the import applied", list, err)
	}
}
