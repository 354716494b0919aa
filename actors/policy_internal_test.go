package actors

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// svPolicy lets app=a reach app=b on TCP 8080. sv endpoints carry no
// namespace label, so the policy is cluster-wide (a namespaced policy
// selects only endpoints of its namespace) and its selectors say so.
const svPolicy = `apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: sv}
spec:
  endpointSelector:
    matchLabels: {app: b}
    matchExpressions: [{key: io.kubernetes.pod.namespace, operator: DoesNotExist}]
  ingress:
  - fromEndpoints:
    - matchLabels: {app: a}
      matchExpressions: [{key: io.kubernetes.pod.namespace, operator: DoesNotExist}]
    toPorts: [{ports: [{port: "8080", protocol: TCP}]}]
  egress:
  - toCIDR: [198.51.100.0/24]
`

// TestPolicyActorRestartKeepsRules: a restarted policy actor rebuilds
// its rules, revision and CIDR identities from the index, still answers
// with the same policy, and still notifies endpoints when a rule goes.
func TestPolicyActorRestartKeepsRules(t *testing.T) {
	sys, dp := svSystem(t, nil)
	a := svCreate(t, sys, "a")
	b := svCreate(t, sys, "b")
	pols, err := policy.Parse([]byte(svPolicy))
	if err != nil {
		t.Fatal(err)
	}
	res := svAsk(t, sys, sys.policy, &messages.PolicyImport{Policies: pols}).(*messages.PolicyResult)
	if res.Err != nil || res.Revision != 1 {
		t.Fatalf("import = %+v", res)
	}
	testutil.Eventually(t, "B enforcing the policy", func() bool {
		return dp.Policy(b.ID).Allows(a.Identity, 8080, policy.ProtoTCP, policy.Ingress) && dp.Policy(b.ID).Enforced(policy.Ingress)
	})
	cidr := netip.MustParsePrefix("198.51.100.0/24")
	testutil.Eventually(t, "the CIDR in the ipcache", func() bool { return dp.IPCache()[cidr] >= policy.MinCIDRIdentity })
	cidrID := dp.IPCache()[cidr]
	before := dp.Policy(b.ID)
	// The index row is published after the datapath realised it.
	testutil.Eventually(t, "B's row with the policy, ready", func() bool {
		ep := mustEndpoint(t, sys, b.ID)
		return ep.Policy.Equal(before) && ep.State == endpoint.StateReady
	})
	regB := mustEndpoint(t, sys, b.ID).Regenerations

	sys.Actors.Root.Send(sys.policy, &crashForTest{})
	got := svAsk(t, sys, sys.policy, &messages.ComputePolicy{Endpoint: b.ID, Identity: b.Identity}).(*messages.PolicyComputed)
	if got.Revision != 1 || !got.Policy.Equal(before) {
		t.Fatalf("after restart: revision %d policy %+v, want revision 1 and %+v", got.Revision, got.Policy, before)
	}
	if id := dp.IPCache()[cidr]; id != cidrID {
		t.Errorf("CIDR identity changed across the restart: %d -> %d", cidrID, id)
	}
	if n := mustEndpoint(t, sys, b.ID).Regenerations; n != regB {
		t.Errorf("B regenerated %d times after the restart; its policy did not change", n-regB)
	}

	del := svAsk(t, sys, sys.policy, &messages.PolicyDelete{Name: "/sv"}).(*messages.PolicyResult)
	if del.Err != nil || del.Deleted != 1 || del.Revision != 2 {
		t.Fatalf("delete after restart = %+v", del)
	}
	testutil.Eventually(t, "B back to allow-all", func() bool { return dp.Policy(b.ID) == nil })
	testutil.Eventually(t, "the CIDR out of the ipcache", func() bool { _, ok := dp.IPCache()[cidr]; return !ok })
	if rows := sys.Index.Policies(); len(rows) != 0 {
		t.Errorf("policies table after delete: %v", rows)
	}
}

// TestIPCacheActorRestart: a restarted ipcache actor rebuilds from its
// table and still removes a deleted endpoint's address.
func TestIPCacheActorRestart(t *testing.T) {
	sys, dp := svSystem(t, nil)
	a := svCreate(t, sys, "a")
	pa := netip.PrefixFrom(a.IPv4, 32)
	testutil.Eventually(t, "A in the ipcache", func() bool { return dp.IPCache()[pa] == a.Identity })
	sys.Actors.Root.Send(sys.ipcache, &crashForTest{})
	b := svCreate(t, sys, "b")
	pb := netip.PrefixFrom(b.IPv4, 32)
	testutil.Eventually(t, "B in the ipcache", func() bool { return dp.IPCache()[pb] == b.Identity })
	if res := svAsk(t, sys, sys.endpoints, &messages.DeleteEndpoint{ID: a.ID}).(*messages.EndpointResult); res.Err != nil {
		t.Fatal(res.Err)
	}
	testutil.Eventually(t, "A out of the ipcache", func() bool { _, ok := dp.IPCache()[pa]; return !ok })
	rows := sys.Index.IPCache()
	for _, r := range rows {
		if r.Prefix == pa {
			t.Errorf("ipcache table still holds %v", r)
		}
	}
	gw := netip.MustParsePrefix("10.78.0.1/32")
	if id := dp.IPCache()[gw]; id != 1 {
		t.Errorf("gateway %s = identity %d, want host", gw, id)
	}
}

func mustEndpoint(t *testing.T, sys *System, id endpoint.ID) *endpoint.Endpoint {
	t.Helper()
	ep, ok := sys.Index.Endpoint(id)
	if !ok {
		t.Fatalf("endpoint %d not in the index", id)
	}
	return ep
}

// countStore is a StateStore that counts writes.
type countStore struct{ writes atomic.Int64 }

func (s *countStore) Write(_ *endpoint.Endpoint, done func(error)) { s.writes.Add(1); done(nil) }
func (s *countStore) Remove(_ endpoint.ID, done func(error))       { done(nil) }

// TestPolicyRegenerationsCoalesceAndSkipState: policy changes while an
// endpoint's regeneration runs coalesce into one more regeneration, and
// policy-only regenerations write no state.
func TestPolicyRegenerationsCoalesceAndSkipState(t *testing.T) {
	store := &countStore{}
	sys, dp := svSystem(t, func(c *Config) { c.State = store })
	a := svCreate(t, sys, "a")
	b := svCreate(t, sys, "b")
	importPort := func(port int) {
		doc := strings.Replace(svPolicy, `"8080"`, fmt.Sprintf("%q", fmt.Sprint(port)), 1)
		pols, err := policy.Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		if res := svAsk(t, sys, sys.policy, &messages.PolicyImport{Policies: pols}).(*messages.PolicyResult); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	importPort(1000)
	testutil.Eventually(t, "B enforcing port 1000", func() bool { return dp.Policy(b.ID).Allows(a.Identity, 1000, policy.ProtoTCP, policy.Ingress) })
	testutil.Eventually(t, "B's row ready", func() bool {
		ep := mustEndpoint(t, sys, b.ID)
		return ep.State == endpoint.StateReady && ep.Policy != nil
	})
	writes, regB := store.writes.Load(), mustEndpoint(t, sys, b.ID).Regenerations

	gate := newSvGate(t)
	dp.Set(datapath.FakeHooks{BeforeRealize: func(ctx context.Context, ep *endpoint.Endpoint, _ uint64) error {
		if ep.ID == b.ID {
			return gate.hold(ctx)
		}
		return nil
	}})
	importPort(1001)
	gate.await(t) // B's regeneration for 1001 is running
	stats := sys.MailboxStats(svPID(sys, b.ID).Id)
	handled := stats.Processed()
	for port := 1002; port <= 1006; port++ {
		importPort(port)
	}
	// The five requests reach B through the manager: wait until B took
	// them all in (nothing else arrives while its realise is held).
	testutil.Eventually(t, "B handling the five requests", func() bool { return stats.Processed() >= handled+5 })
	gate.open()
	testutil.Eventually(t, "B enforcing port 1006", func() bool {
		ep := mustEndpoint(t, sys, b.ID)
		return dp.Policy(b.ID).Allows(a.Identity, 1006, policy.ProtoTCP, policy.Ingress) && ep.State == endpoint.StateReady &&
			ep.Policy.Allows(a.Identity, 1006, policy.ProtoTCP, policy.Ingress)
	})
	if n := mustEndpoint(t, sys, b.ID).Regenerations - regB; n != 2 {
		t.Errorf("B regenerated %d times for 6 policy changes, want 2 (one running, one coalesced)", n)
	}
	if got := store.writes.Load(); got != writes {
		t.Errorf("policy-only regenerations wrote state %d times", got-writes)
	}
}

// TestIPCacheRetriesFailedWrites: failed datapath ipcache writes are
// retried (with backoff) until they succeed.
func TestIPCacheRetriesFailedWrites(t *testing.T) {
	sys, dp := svSystem(t, nil)
	var failures atomic.Int64
	dp.Set(datapath.FakeHooks{BeforeIPCache: func(context.Context, netip.Prefix) error {
		if failures.Add(1) <= 3 {
			return datapath.ErrInjected
		}
		return nil
	}})
	a := svCreate(t, sys, "a")
	pa := netip.PrefixFrom(a.IPv4, 32)
	testutil.Eventually(t, "A in the ipcache after retries", func() bool { return dp.IPCache()[pa] == a.Identity })
	if failures.Load() < 4 {
		t.Errorf("%d ipcache writes, want the 3 injected failures and a success", failures.Load())
	}
}

// TestPolicyRevisionEvents: an import and a delete each publish one
// policy-revision event carrying the new revision.
func TestPolicyRevisionEvents(t *testing.T) {
	hub := events.New(64)
	sys, _ := svSystem(t, func(c *Config) { c.Events = hub })
	sub := hub.Subscribe(0)
	t.Cleanup(sub.Close)
	pols, err := policy.Parse([]byte(svPolicy))
	if err != nil {
		t.Fatal(err)
	}
	if res := svAsk(t, sys, sys.policy, &messages.PolicyImport{Policies: pols}).(*messages.PolicyResult); res.Err != nil {
		t.Fatalf("import: %v", res.Err)
	}
	if res := svAsk(t, sys, sys.policy, &messages.PolicyDelete{Name: pols[0].Key()}).(*messages.PolicyResult); res.Err != nil {
		t.Fatalf("delete: %v", res.Err)
	}
	var revs []uint64
	for len(revs) < 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ev, err := sub.Next(ctx)
		cancel()
		if err != nil {
			t.Fatalf("waiting for policy-revision events (got %v): %v", revs, err)
		}
		if ev.Type == events.PolicyRevision {
			revs = append(revs, ev.Revision)
		}
	}
	if revs[0] != 1 || revs[1] != 2 {
		t.Fatalf("policy-revision events carry revisions %v, want [1 2]", revs)
	}
}

// svServicesPolicy lets app=a reach Service y/db (toServices).
const svServicesPolicy = `apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: sv-services}
spec:
  endpointSelector:
    matchLabels: {app: a}
    matchExpressions: [{key: io.kubernetes.pod.namespace, operator: DoesNotExist}]
  egress:
  - toServices:
    - k8sService: {serviceName: db, namespace: "y"}
`

// TestPolicyActorRestartKeepsServices: the Services toServices rules
// follow survive a policy actor restart (the service watcher sends a
// Service only when it changes): the restarted actor computes the same
// policy, and a Service deleted afterwards still takes its peers away.
func TestPolicyActorRestartKeepsServices(t *testing.T) {
	sys, dp := svSystem(t, nil)
	a := svCreate(t, sys, "a")
	pols, err := policy.Parse([]byte(svServicesPolicy))
	if err != nil {
		t.Fatal(err)
	}
	if res := svAsk(t, sys, sys.policy, &messages.PolicyImport{Policies: pols}).(*messages.PolicyResult); res.Err != nil {
		t.Fatal(res.Err)
	}
	backend := netip.MustParsePrefix("203.0.113.7/32")
	sys.SetPolicyService("y", "db", &policy.Service{Addrs: []netip.Addr{backend.Addr()}})
	allowed := func() bool {
		id, ok := dp.IPCache()[backend]
		m := dp.Policy(a.ID) // nil allows everything
		return ok && m != nil && m.Enforced(policy.Egress) && m.Allows(id, 5432, policy.ProtoTCP, policy.Egress)
	}
	testutil.Eventually(t, "A allowed to the Service's backend", allowed)
	before := dp.Policy(a.ID)
	testutil.Eventually(t, "A's row with the policy, ready", func() bool {
		ep := mustEndpoint(t, sys, a.ID)
		return ep.Policy.Equal(before) && ep.State == endpoint.StateReady
	})

	sys.Actors.Root.Send(sys.policy, &crashForTest{})
	got := svAsk(t, sys, sys.policy, &messages.ComputePolicy{Endpoint: a.ID, Identity: a.Identity}).(*messages.PolicyComputed)
	if !got.Policy.Equal(before) {
		t.Fatalf("after restart: policy %+v, want %+v (the Service forgotten)", got.Policy, before)
	}
	if !allowed() {
		t.Fatal("after restart: A no longer allowed to the Service's backend")
	}
	sys.SetPolicyService("y", "db", nil)
	testutil.Eventually(t, "A no longer allowed once the Service is gone", func() bool { return !allowed() })
	testutil.Eventually(t, "the policy-services row gone", func() bool { return len(sys.Index.PolicyServices()) == 0 })
}
