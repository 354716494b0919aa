package actors_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

const fqdnPolicy = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: fqdn}
spec:
  endpointSelector: {matchLabels: {app: a}}
  egress:
  - toEntities: [world]
    toPorts:
    - ports: [{port: "53", protocol: ANY}]
      rules: {dns: [{matchPattern: "*.test"}]}
  - toFQDNs: [{matchName: allowed.test}]
`

// TestLearnFQDN: an endpoint's DNS answer for a name a toFQDNs selector
// matches is released only once the address's CIDR identity is in the
// (fake) datapath's ipcache and the endpoint's realised policy allows
// it; after the TTL the address leaves both.
func TestLearnFQDN(t *testing.T) {
	h := startSystem(t, func(c *actors.Config) {
		c.Policy.FQDN = fqdn.CacheConfig{MaxIPsPerEndpoint: 4}
	})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	pols, err := policy.Parse([]byte(fqdnPolicy))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.sys.ImportPolicy(ctx, pols); err != nil {
		t.Fatal(err)
	}
	ep := h.mustCreate(t, podSpec(t, "c1", "default", "a", "k8s:app=a", "k8s:io.kubernetes.pod.namespace=default"))
	other := h.mustCreate(t, podSpec(t, "c2", "default", "b", "k8s:app=b", "k8s:io.kubernetes.pod.namespace=default"))
	if m := h.fake.Policy(ep.ID); !m.HasDNS() || m.AllowsAddr(0, netip.MustParseAddr("192.0.2.10"), 443, policy.ProtoTCP, policy.Egress) {
		t.Fatalf("policy not enforced: %+v", m)
	}
	addr := netip.MustParseAddr("192.0.2.10")
	prefix := netip.PrefixFrom(addr, 32)
	if err := h.sys.LearnFQDN(ctx, ep.ID, "allowed.test", []netip.Addr{addr}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	// Released: both are already in the datapath, no waiting for them.
	id, ok := h.fake.IPCache()[prefix]
	if !ok {
		t.Fatal("answer released before the ipcache holds the address")
	}
	if m := h.fake.Policy(ep.ID); !m.AllowsAddr(id, addr, 443, policy.ProtoTCP, policy.Egress) {
		t.Fatalf("answer released before the policy map allows %s (identity %d)", addr, id)
	}
	es, err := h.sys.FQDNCache(ctx)
	if err != nil || len(es) != 1 || es[0].Name != "allowed.test." || es[0].IP != addr || es[0].Endpoint != uint16(ep.ID) {
		t.Fatalf("FQDNCache = %+v, %v", es, err)
	}
	// Bounds and refusals.
	many := []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3"), netip.MustParseAddr("192.0.2.4")}
	if err := h.sys.LearnFQDN(ctx, ep.ID, "x.test", many, time.Second); !errors.Is(err, fqdn.ErrLimit) {
		t.Fatalf("over the per-endpoint limit: %v", err)
	}
	if err := h.sys.LearnFQDN(ctx, 4000, "x.test", many[:1], time.Second); !errors.Is(err, actors.ErrEndpointNotFound) {
		t.Fatalf("unknown endpoint: %v", err)
	}
	if err := h.sys.LearnFQDN(ctx, ep.ID, "bad name", many[:1], time.Second); !errors.Is(err, fqdn.ErrInvalidName) {
		t.Fatalf("bad name: %v", err)
	}
	// An endpoint without FQDN policy may learn too; nothing selects it.
	if err := h.sys.LearnFQDN(ctx, other.ID, "denied.test", many[:1], time.Second); err != nil {
		t.Fatal(err)
	}
	// After the TTL the address leaves the ipcache and the policy map.
	testutil.Eventually(t, "learned address to expire", func() bool {
		_, ok := h.fake.IPCache()[prefix]
		return !ok && !h.fake.Policy(ep.ID).AllowsAddr(id, addr, 443, policy.ProtoTCP, policy.Egress)
	})
	testutil.Eventually(t, "cache to empty", func() bool {
		es, err := h.sys.FQDNCache(ctx)
		return err == nil && len(es) == 0
	})
	// A deleted endpoint's names go with it.
	if err := h.sys.LearnFQDN(ctx, ep.ID, "allowed.test", []netip.Addr{addr}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := h.remove(t, ep.ID, endpoint.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "deleted endpoint's address to leave the ipcache", func() bool {
		_, ok := h.fake.IPCache()[prefix]
		return !ok
	})
}

// TestImportRefusesDNSWithoutProxy: NoDNSProxy refuses toFQDNs policies.
func TestImportRefusesDNSWithoutProxy(t *testing.T) {
	h := startSystem(t, func(c *actors.Config) { c.NoDNSProxy = true })
	pols, err := policy.Parse([]byte(fqdnPolicy))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.sys.ImportPolicy(context.Background(), pols); !errors.Is(err, policy.ErrInvalidPolicy) {
		t.Fatalf("import without a DNS proxy: %v", err)
	}
}

// fqdnEndpoint starts a system with fqdnPolicy and an endpoint it
// selects; ctx ends with the test.
func fqdnEndpoint(t *testing.T) (*harness, context.Context, *endpoint.Endpoint) {
	t.Helper()
	h := startSystem(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	pols, err := policy.Parse([]byte(fqdnPolicy))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.sys.ImportPolicy(ctx, pols); err != nil {
		t.Fatal(err)
	}
	return h, ctx, h.mustCreate(t, podSpec(t, "c1", "default", "a", "k8s:app=a", "k8s:io.kubernetes.pod.namespace=default"))
}

// TestLearnFQDNHeldUntilRealised: the answer is not released while the
// endpoint's regeneration (which adds the learned address to its policy
// map) is held in the datapath, nor while the ipcache write fails (it is
// retried); a failed regeneration fails the answer.
func TestLearnFQDNHeldUntilRealised(t *testing.T) {
	h, ctx, ep := fqdnEndpoint(t)
	addr := netip.MustParseAddr("192.0.2.10")
	prefix := netip.PrefixFrom(addr, 32)

	entered, gate := make(chan struct{}, 1), make(chan struct{})
	failures := 2
	h.fake.Set(datapath.FakeHooks{
		BeforeRealize: func(ctx context.Context, e *endpoint.Endpoint, _ uint64) error {
			if e.ID == ep.ID {
				select {
				case entered <- struct{}{}:
				default:
				}
				<-gate
			}
			return nil
		},
		BeforeIPCache: func(_ context.Context, p netip.Prefix) error {
			if p == prefix && failures > 0 {
				failures--
				return errors.New("injected ipcache failure")
			}
			return nil
		},
	})
	done := make(chan error, 1)
	go func() { done <- h.sys.LearnFQDN(ctx, ep.ID, "allowed.test", []netip.Addr{addr}, time.Hour) }()
	select {
	case <-entered: // the regeneration realising the address is in the datapath
	case err := <-done:
		t.Fatalf("answer released (%v) without the regeneration that realises the address", err)
	}
	select {
	case err := <-done:
		t.Fatalf("answer released (%v) while the regeneration is held", err)
	default:
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if id, ok := h.fake.IPCache()[prefix]; !ok || !h.fake.Policy(ep.ID).AllowsAddr(id, addr, 443, policy.ProtoTCP, policy.Egress) {
		t.Fatalf("released before the datapath holds the address: ipcache %v", ok)
	}
	// A failing regeneration fails the answer.
	h.fake.Set(datapath.FakeHooks{BeforeRealize: func(context.Context, *endpoint.Endpoint, uint64) error {
		return errors.New("injected realize failure")
	}})
	err := h.sys.LearnFQDN(ctx, ep.ID, "allowed.test", []netip.Addr{netip.MustParseAddr("192.0.2.11")}, time.Hour)
	if err == nil || !strings.Contains(err.Error(), "injected realize failure") {
		t.Fatalf("learn with a failing regeneration: %v", err)
	}
	h.fake.Set(datapath.FakeHooks{})
}

// TestLearnFQDNRealisedAnswer: an answer whose addresses the endpoint
// realised already, with the very policy it still has, is released
// without waiting (a cancelled context does not fail it) and renews the
// TTL; a new address, a changed policy or a TTL about to end make it
// wait again (that context fails it).
func TestLearnFQDNRealisedAnswer(t *testing.T) {
	h, ctx, ep := fqdnEndpoint(t)
	addr, addr2 := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11")
	cancelled, stop := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer stop()
	expires := func() time.Time {
		es, err := h.sys.FQDNCache(ctx)
		if err != nil || len(es) == 0 {
			t.Fatalf("FQDNCache = %+v, %v", es, err)
		}
		return es[0].Expires
	}
	if err := h.sys.LearnFQDN(cancelled, ep.ID, "allowed.test", []netip.Addr{addr}, time.Hour); err == nil {
		t.Fatal("a first answer was released without waiting")
	}
	if err := h.sys.LearnFQDN(ctx, ep.ID, "allowed.test", []netip.Addr{addr}, time.Hour); err != nil {
		t.Fatal(err)
	}
	first := expires()
	time.Sleep(10 * time.Millisecond)
	if err := h.sys.LearnFQDN(cancelled, ep.ID, "allowed.test", []netip.Addr{addr}, time.Hour); err != nil {
		t.Fatalf("a realised answer waited: %v", err)
	}
	testutil.Eventually(t, "the released answer to renew the TTL", func() bool { return expires().After(first) })
	if err := h.sys.LearnFQDN(cancelled, ep.ID, "allowed.test", []netip.Addr{addr, addr2}, time.Hour); err == nil {
		t.Fatal("an answer with a new address was released without waiting")
	}
	if err := h.sys.LearnFQDN(ctx, ep.ID, "allowed.test", []netip.Addr{addr, addr2}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := h.sys.LearnFQDN(cancelled, ep.ID, "allowed.test", []netip.Addr{addr2}, time.Hour); err != nil {
		t.Fatalf("a realised answer waited: %v", err)
	}
	// Another policy: the endpoint realises a new one, nothing is known
	// realised for it.
	pols2, err := policy.Parse([]byte(strings.Replace(fqdnPolicy, "name: fqdn", "name: fqdn2", 1) + "  - toCIDR: [198.51.100.0/24]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.sys.ImportPolicy(ctx, pols2); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the endpoint to realise the new policy", func() bool {
		return h.sys.LearnFQDN(cancelled, ep.ID, "allowed.test", []netip.Addr{addr}, time.Hour) != nil
	})
	// A TTL within the margin: the renewal could come too late, so wait.
	if err := h.sys.LearnFQDN(ctx, ep.ID, "allowed.test", []netip.Addr{addr}, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := h.sys.LearnFQDN(cancelled, ep.ID, "allowed.test", []netip.Addr{addr}, time.Second); err == nil {
		t.Fatal("an answer whose TTL ends within the margin was released without waiting")
	}
}
