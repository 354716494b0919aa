package datapath

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// cidrRepo computes MapStates from NetworkPolicy documents for pods of
// namespace x: a and c are siblings (app=client, one identity), b is
// app=server.
type cidrRepo struct {
	t *testing.T
	r *policy.Repository
}

func newCIDRRepo(t *testing.T, ids map[identity.NumericIdentity]string) *cidrRepo {
	r := policy.NewRepository()
	for id, app := range ids {
		r.UpsertIdentity(id, labels.Labels{
			{Source: labels.SourceK8s, Key: "app", Value: app},
			{Source: labels.SourceK8s, Key: policy.NamespaceLabel, Value: "x"},
		})
		r.MapState(id)
	}
	return &cidrRepo{t: t, r: r}
}

// set replaces every policy with doc and returns id's MapState.
func (c *cidrRepo) set(id identity.NumericIdentity, doc string) *policy.MapState {
	c.t.Helper()
	for _, p := range c.r.Policies() {
		c.r.DeleteByName(p.Key())
	}
	pols, err := policy.Parse([]byte(doc))
	if err != nil {
		c.t.Fatal(err)
	}
	c.r.Import(pols)
	return c.r.MapState(id)
}

const (
	cidrClientEgress = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-egress, namespace: x}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
`
	cidrServerIngress = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-ingress, namespace: x}
spec:
  podSelector: {matchLabels: {app: server}}
  policyTypes: [Ingress]
  ingress:
`
)

// TestBPFCIDREndToEnd: ipBlocks decide on pod addresses with real
// traffic between pod netns: 0.0.0.0/0 egress reaches pods, a pod's /32
// admits that pod and not its sibling with the same identity, and an
// except carves out exactly what it names, also when another policy
// allows a broader prefix.
func TestBPFCIDREndToEnd(t *testing.T) {
	e := newE2E(t, LinuxConfig{})
	a, b, c := e.a, e.b, e.c
	// C becomes A's sibling: same labels, same identity.
	c.ep.Identity = a.ep.Identity
	e.ipcache(c)
	e.realize(c)
	repo := newCIDRRepo(t, map[identity.NumericIdentity]string{a.ep.Identity: "client", b.ep.Identity: "server"})
	apply := func(p *testPod, doc string) {
		t.Helper()
		p.ep.Policy = repo.set(p.ep.Identity, doc)
		if p.ep.Policy == nil {
			t.Fatalf("no policy computed for endpoint %d", p.ep.ID)
		}
		e.realize(p)
		if p == a {
			c.ep.Policy = p.ep.Policy
			e.realize(c)
		}
	}
	clear := func(p *testPod) {
		p.ep.Policy = nil
		e.realize(p)
		if p == a {
			c.ep.Policy = nil
			e.realize(c)
		}
	}

	t.Run("egress to 0.0.0.0/0 reaches pods", func(t *testing.T) {
		apply(a, strings.TrimSuffix(cidrClientEgress, "  egress:\n"))
		e.mustNotTalk(a, b, 8080) // default deny egress
		apply(a, cidrClientEgress+"  - to: [{ipBlock: {cidr: 0.0.0.0/0}}]\n")
		e.mustTalk(a, b, 8080)
		e.mustTalk(a, b, 8081)
		clear(a)
	})
	t.Run("a pod's /32 admits exactly that pod", func(t *testing.T) {
		apply(b, cidrServerIngress+"  - from: [{ipBlock: {cidr: "+a.addr().String()+"/32}}]\n")
		e.mustTalk(a, b, 8080)
		e.mustNotTalk(c, b, 8080) // same identity, another address
		cidr, err := e.l.DumpCIDRPolicy(context.Background(), b.ep.ID)
		if err != nil || len(cidr) != 1 || !cidr[0].Entry.Allow || cidr[0].Packets == 0 {
			t.Fatalf("DumpCIDRPolicy(B) = %+v, %v, want one allow entry with packets", cidr, err)
		}
		clear(b)
	})
	t.Run("except carves out exactly", func(t *testing.T) {
		apply(b, cidrServerIngress+"  - from: [{ipBlock: {cidr: 10.244.60.0/24, except: ["+c.addr().String()+"/32]}}]\n")
		e.mustTalk(a, b, 8080)
		e.mustNotTalk(c, b, 8080)
		// Another policy's broader prefix on another port does not undo
		// the except on 8080; on its own port it allows C.
		apply(b, cidrServerIngress+"  - from: [{ipBlock: {cidr: 10.244.60.0/24, except: ["+c.addr().String()+"/32]}}]\n"+
			"---\n"+strings.Replace(cidrServerIngress, "server-ingress", "server-8081", 1)+"  - from: [{ipBlock: {cidr: 10.0.0.0/8}}]\n    ports: [{port: 8081}]\n")
		e.mustNotTalk(c, b, 8080)
		e.mustTalk(c, b, 8081)
		e.mustTalk(a, b, 8080)
		clear(b)
	})
}

// TestBPFCIDRRestart: a new datapath on the same bpffs reads the CIDR
// map back (so the next policy applies by difference, removing what it
// no longer wants) and adopts the attached node programs.
func TestBPFCIDRRestart(t *testing.T) {
	e := newE2E(t, LinuxConfig{EndpointTCX: true})
	a, b, c := e.a, e.b, e.c
	only := func(p *testPod) *policy.MapState {
		m := policy.NewMapState(2, true, false, nil)
		m.CIDR = []policy.CIDREntry{{Dir: policy.Ingress, Proto: policy.ProtoTCP, Port: 8080,
			Prefix: netip.PrefixFrom(p.addr(), 32), Allow: true}}
		return m
	}
	b.ep.Policy = only(c)
	e.realize(b)
	_, progBefore := e.linkInfo(b, pinLinkTo)
	if err := e.l.Close(); err != nil {
		t.Fatal(err)
	}
	l2, err := NewLinux(e.l.cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l2.Close() })
	e.l = l2
	cidr, err := l2.DumpCIDRPolicy(context.Background(), b.ep.ID)
	if err != nil || len(cidr) != 1 || cidr[0].Entry != b.ep.Policy.CIDR[0] {
		t.Fatalf("DumpCIDRPolicy after restart = %+v, %v", cidr, err)
	}
	b.ep.Policy = only(a)
	e.realize(b)
	if _, p := e.linkInfo(b, pinLinkTo); p != progBefore {
		t.Fatalf("program %d reloaded as %d after restart; want it adopted", progBefore, p)
	}
	e.mustTalk(a, b, 8080)
	e.mustNotTalk(c, b, 8080)
	if cidr, err := l2.DumpCIDRPolicy(context.Background(), b.ep.ID); err != nil || len(cidr) != 1 || cidr[0].Entry != b.ep.Policy.CIDR[0] {
		t.Fatalf("DumpCIDRPolicy = %+v, %v; want only A's entry", cidr, err)
	}

	// An endpoint directory without the CIDR map (as an older build
	// leaves it): the identity policy is read back, a new CIDR map is
	// created and the outer map points the node's programs (kept) at it,
	// and the policy is enforced again.
	if err := l2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(l2.bpf.endpointDir(b.ep.ID), pinCIDR)); err != nil {
		t.Fatal(err)
	}
	l3, err := NewLinux(e.l.cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := l3.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l3.Close() })
	e.l = l3
	e.realize(b)
	if _, p := e.linkInfo(b, pinLinkTo); p != progBefore {
		t.Fatalf("program %d replaced by %d: the programs are the node's, only the CIDR map is new", progBefore, p)
	}
	var inner ebpf.MapID
	if err := l3.bpf.maps.cidrMaps.Lookup(slotOf(l3, b.ep.ID), &inner); err != nil {
		t.Fatal(err)
	}
	if info, err := l3.bpf.eps[b.ep.ID].cidrMap.Info(); err != nil {
		t.Fatal(err)
	} else if id, _ := info.ID(); id != inner {
		t.Fatalf("cidr_maps entry of b's slot = map %d, want the new CIDR map %d", inner, id)
	}
	e.mustTalk(a, b, 8080)
	e.mustNotTalk(c, b, 8080)
}
