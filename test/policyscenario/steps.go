package policyscenario

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// Run runs the whole scenario on env's fresh agent: no policy, a CNP
// allowing A to B on TCP 8080, its deletion, the Kubernetes
// NetworkPolicy equivalent, a relabel of C into A's role (only B
// regenerates), the ipcache, and a CIDR egress policy.
func Run(t *testing.T, env Env) Pods {
	c := env.Client
	p := Setup(t, env)
	idA, idB, idC := identityOf(t, c, p.A.ID), identityOf(t, c, p.B.ID), identityOf(t, c, p.C.ID)

	t.Run("no policy allows everything", func(t *testing.T) {
		for _, id := range []int64{p.A.ID, p.B.ID, p.C.ID} {
			WaitRealized(t, c, id, "no enforcement", allowAll)
		}
	})
	bAllowsAOnly := func(t *testing.T, what string) { t.Helper(); checkBAllowsAOnly(t, c, p, idA, idC, what) }
	t.Run("CNP lets A reach B on TCP 8080", func(t *testing.T) {
		regA, regC := regenerations(t, c, p.A.ID), regenerations(t, c, p.C.ID)
		mustImport(t, c, CNPAllowAToB, client.ContentTypeYAML, "default/a-to-b")
		bAllowsAOnly(t, "the CNP realised")
		if a, cc := regenerations(t, c, p.A.ID), regenerations(t, c, p.C.ID); a != regA || cc != regC {
			t.Errorf("regenerations A %d->%d C %d->%d; only B's policy changed", regA, a, regC, cc)
		}
		if _, err := c.PolicyDelete(context.Background(), "default/a-to-b"); err != nil {
			t.Fatal(err)
		}
		WaitRealized(t, c, p.B.ID, "allow-all after the delete", allowAll)
	})
	t.Run("NetworkPolicy lets A reach B on TCP 8080", func(t *testing.T) {
		mustImport(t, c, KNPAllowAToB, client.ContentTypeJSON, "default/knp-a-to-b")
		bAllowsAOnly(t, "the NetworkPolicy realised")
	})
	t.Run("relabel C to app=a regenerates only B and C", func(t *testing.T) { idC = checkRelabel(t, c, p, idC) })
	t.Run("ipcache holds every endpoint", func(t *testing.T) {
		checkIPCache(t, c, p, map[int64]identity.NumericIdentity{p.A.ID: idA, p.B.ID: idB, p.C.ID: idC})
	})
	t.Run("CIDR egress", func(t *testing.T) { checkCIDR(t, c, p) })
	return p
}

// waitRegenerations waits until endpoint id completed at least n regenerations.
func waitRegenerations(t *testing.T, c *client.Client, id int64, n uint64) {
	t.Helper()
	deadline := time.Now().Add(Wait)
	for regenerations(t, c, id) < n {
		if time.Now().After(deadline) {
			t.Fatalf("endpoint %d: timed out waiting for %d regenerations", id, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkBAllowsAOnly waits until B lets A in on TCP 8080 and checks that
// nothing else gets in and that A and C enforce nothing.
func checkBAllowsAOnly(t *testing.T, c *client.Client, p Pods, idA, idC identity.NumericIdentity, what string) {
	t.Helper()
	m := WaitRealized(t, c, p.B.ID, what, func(m *policy.MapState) bool {
		return m.Enforced(policy.Ingress) && m.Allows(idA, 8080, policy.ProtoTCP, policy.Ingress)
	})
	for _, tc := range []struct {
		peer  identity.NumericIdentity
		port  uint16
		proto uint8
	}{{idA, 8081, policy.ProtoTCP}, {idA, 8080, policy.ProtoUDP}, {idC, 8080, policy.ProtoTCP}, {identity.ReservedWorld, 8080, policy.ProtoTCP}} {
		if m.Allows(tc.peer, tc.port, tc.proto, policy.Ingress) {
			t.Errorf("B allows identity %d port %d proto %d; want denied", tc.peer, tc.port, tc.proto)
		}
	}
	if m.Enforced(policy.Egress) {
		t.Errorf("B's egress is enforced; no rule selects it for egress")
	}
	for _, id := range []int64{p.A.ID, p.C.ID} {
		WaitRealized(t, c, id, "no enforcement", allowAll)
	}
}

// checkRelabel relabels C to app=a and checks that its new identity is
// let into B and that only B and C regenerate; it returns C's identity.
func checkRelabel(t *testing.T, c *client.Client, p Pods, idC identity.NumericIdentity) identity.NumericIdentity {
	regA, regB, regC := regenerations(t, c, p.A.ID), regenerations(t, c, p.B.ID), regenerations(t, c, p.C.ID)
	if _, err := c.EndpointPatchLabels(context.Background(), fmt.Sprint(p.C.ID), []string{"k8s:app=a"}, nil); err != nil {
		t.Fatal(err)
	}
	newC := identityOf(t, c, p.C.ID)
	if newC == idC {
		t.Fatalf("C kept identity %d after the relabel", idC)
	}
	WaitRealized(t, c, p.B.ID, "C's new identity allowed into B", func(m *policy.MapState) bool {
		return m.Allows(newC, 8080, policy.ProtoTCP, policy.Ingress) && !m.Allows(newC, 8081, policy.ProtoTCP, policy.Ingress)
	})
	// The realised policy is visible before the regeneration is
	// counted: wait for the counts, then check them exactly.
	waitRegenerations(t, c, p.B.ID, regB+1)
	waitRegenerations(t, c, p.C.ID, regC+1)
	if got := regenerations(t, c, p.B.ID); got != regB+1 {
		t.Errorf("B regenerated %d times, want 1", got-regB)
	}
	if got := regenerations(t, c, p.A.ID); got != regA {
		t.Errorf("A regenerated %d times, want 0 (its policy did not change)", got-regA)
	}
	return newC
}

func mustImport(t *testing.T, c *client.Client, doc, ct, want string) {
	t.Helper()
	res, err := c.PolicyImport(context.Background(), []byte(doc), ct)
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if len(res.Policies) != 1 || res.Policies[0] != want || res.Revision == 0 {
		t.Fatalf("import = %+v, want [%s] and a revision", res, want)
	}
}

func checkIPCache(t *testing.T, c *client.Client, p Pods, ids map[int64]identity.NumericIdentity) {
	waitIPCache(t, c, "every endpoint address with its identity", func(got map[string]ipcacheRow) bool {
		for _, ep := range []int64{p.A.ID, p.B.ID, p.C.ID} {
			e := map[int64]string{p.A.ID: ipOf(t, p.A).String(), p.B.ID: ipOf(t, p.B).String(), p.C.ID: ipOf(t, p.C).String()}[ep]
			if r, ok := got[e]; !ok || r.id != ids[ep] || r.source != "endpoint" {
				return false
			}
		}
		return true
	})
}

type ipcacheRow struct {
	id     identity.NumericIdentity
	source string
}

func waitIPCache(t *testing.T, c *client.Client, what string, cond func(map[string]ipcacheRow) bool) map[string]ipcacheRow {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Wait)
	defer cancel()
	for {
		rows, err := c.IPCache(ctx)
		got := map[string]ipcacheRow{}
		for _, r := range rows {
			got[r.CIDR] = ipcacheRow{id: identity.NumericIdentity(r.Identity), source: r.Source}
		}
		if err == nil && cond(got) {
			return got
		}
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for the ipcache to hold %s; last %v, err %v", what, got, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func checkCIDR(t *testing.T, c *client.Client, p Pods) {
	if _, err := c.PolicyImport(context.Background(), []byte(CNPEgressCIDR), ""); err != nil {
		t.Fatal(err)
	}
	var cidrID, exceptID identity.NumericIdentity
	waitIPCache(t, c, "the policy's CIDR prefixes", func(got map[string]ipcacheRow) bool {
		r, ok1 := got["192.0.2.0/24"]
		e, ok2 := got["192.0.2.128/25"]
		cidrID, exceptID = r.id, e.id
		return ok1 && ok2 && r.source == "cidr-policy" && r.id >= policy.MinCIDRIdentity && e.id >= policy.MinCIDRIdentity
	})
	m := WaitRealized(t, c, p.A.ID, "A's egress policy", func(m *policy.MapState) bool { return m.Enforced(policy.Egress) })
	switch {
	case !m.Allows(cidrID, 443, policy.ProtoTCP, policy.Egress):
		t.Errorf("A cannot reach 192.0.2.0/24 (identity %d)", cidrID)
	case m.Allows(exceptID, 443, policy.ProtoTCP, policy.Egress):
		t.Errorf("A reaches the except 192.0.2.128/25 (identity %d)", exceptID)
	case !m.Allows(identity.ReservedHost, 53, policy.ProtoUDP, policy.Egress):
		t.Errorf("A cannot reach the host entity")
	case m.Allows(identity.ReservedWorld, 443, policy.ProtoTCP, policy.Egress):
		t.Errorf("A reaches world")
	case m.Enforced(policy.Ingress):
		t.Errorf("A's ingress is enforced by an egress-only rule")
	case !m.CIDRAllows(netip.MustParseAddr("192.0.2.127"), 443, policy.ProtoTCP, policy.Egress):
		t.Errorf("A's realised CIDR entries %v do not allow the address 192.0.2.127", m.CIDR)
	case m.CIDRAllows(netip.MustParseAddr("192.0.2.128"), 443, policy.ProtoTCP, policy.Egress):
		t.Errorf("A's realised CIDR entries %v allow the except address 192.0.2.128", m.CIDR)
	}
	if _, err := c.PolicyDelete(context.Background(), "a-egress"); err != nil {
		t.Fatal(err)
	}
	waitIPCache(t, c, "the CIDR prefixes gone", func(got map[string]ipcacheRow) bool {
		_, ok := got["192.0.2.0/24"]
		return !ok
	})
	WaitRealized(t, c, p.A.ID, "A back to allow-all", allowAll)
}
