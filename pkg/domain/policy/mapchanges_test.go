package policy

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// mapChangeEntries are the rule entries the random policies of
// TestMapChangesMatchRecompute are made of: allows and denies, L4 and
// named ports, L7 and DNS redirects, CIDR and FQDN peers, any peer.
var mapChangeEntries = struct{ egress, egressDeny, ingress, ingressDeny []string }{
	egress: []string{
		`{toFQDNs: [{matchPattern: "*.test"}], toPorts: [{ports: [{port: "80", protocol: TCP}]}]}`,
		`{toFQDNs: [{matchName: a.test}]}`,
		`{toFQDNs: [{matchPattern: "*.example"}], toPorts: [{ports: [{port: web, protocol: TCP}]}]}`,
		`{toFQDNs: [{matchPattern: "*"}], toPorts: [{ports: [{port: "8080", protocol: TCP}], rules: {http: [{method: GET, path: /x}]}}]}`,
		`{toFQDNs: [{matchName: b.test}, {matchPattern: "*.example"}], toPorts: [{ports: [{port: "0", protocol: UDP}]}]}`,
		`{toEntities: [world], toPorts: [{ports: [{port: "53", protocol: ANY}], rules: {dns: [{matchPattern: "*.test"}]}}]}`,
		`{toEntities: [world]}`,
		`{toEntities: [all], toPorts: [{ports: [{port: "443", protocol: TCP}]}]}`,
		`{toCIDR: [192.0.2.0/24], toPorts: [{ports: [{port: "8080", protocol: TCP}]}]}`,
		`{toCIDRSet: [{cidr: 192.0.2.0/24, except: [192.0.2.128/25]}]}`,
		`{toEndpoints: [{matchLabels: {app: dns}}], toPorts: [{ports: [{port: "53", protocol: ANY}], rules: {dns: [{matchPattern: "*"}]}}]}`,
		`{toPorts: [{ports: [{port: web, protocol: TCP}]}]}`,
		`{toEndpoints: [{matchLabels: {app: b}}], toPorts: [{ports: [{port: "80", protocol: TCP}], rules: {http: [{path: /b}]}}]}`,
	},
	egressDeny: []string{
		`{toEntities: [world], toPorts: [{ports: [{port: "80", protocol: TCP}]}]}`,
		`{toCIDR: [192.0.2.5/32]}`,
		`{toCIDRSet: [{cidr: 192.0.2.0/25}], toPorts: [{ports: [{port: "8080", protocol: TCP}]}]}`,
		`{toEntities: [all], toPorts: [{ports: [{port: "53", protocol: UDP}]}]}`,
		`{toEntities: [world], toPorts: [{ports: [{port: web, protocol: TCP}]}]}`,
	},
	ingress: []string{
		`{fromEntities: [world], toPorts: [{ports: [{port: "9090", protocol: TCP}]}]}`,
		`{fromCIDR: [192.0.2.0/24]}`,
		`{fromEntities: [world], toPorts: [{ports: [{port: web, protocol: TCP}]}]}`,
		`{fromEntities: [world], toPorts: [{ports: [{port: "81", protocol: TCP}], rules: {http: [{path: /in}]}}]}`,
		`{fromEntities: [world], toPorts: [{ports: [{port: web, protocol: TCP}], rules: {http: [{path: /named}]}}]}`,
	},
	ingressDeny: []string{
		`{fromCIDR: [192.0.2.7/32]}`,
		`{fromEntities: [world], toPorts: [{ports: [{port: "9090", protocol: TCP}]}]}`,
	},
}

// randomMapChangePolicy returns a CNP named name whose subject is app
// and whose entries are a random choice of mapChangeEntries.
func randomMapChangePolicy(rng *rand.Rand, name, app string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: %s}\nspec:\n  endpointSelector: {matchLabels: {app: %s}}\n", name, app)
	for _, sec := range []struct {
		field   string
		entries []string
	}{{"egress", mapChangeEntries.egress}, {"egressDeny", mapChangeEntries.egressDeny},
		{"ingress", mapChangeEntries.ingress}, {"ingressDeny", mapChangeEntries.ingressDeny}} {
		var picked []string
		for _, e := range sec.entries {
			if rng.IntN(3) == 0 {
				picked = append(picked, e)
			}
		}
		if len(picked) > 0 {
			fmt.Fprintf(&b, "  %s: [%s]\n", sec.field, strings.Join(picked, ", "))
		}
	}
	return b.String()
}

// TestMapChangesMatchRecompute is the oracle of the incremental policy
// changes: random policies, random DNS answers (addresses learned and
// forgotten, shared between names, inside and outside the policies'
// CIDRs), identity and policy changes between them; after each change
// every cached policy must equal its full recompute, a patched policy
// must differ from the one before only in the entries of the peers it
// names (what the datapath writes), and the patch must have been taken.
func TestMapChangesMatchRecompute(t *testing.T) {
	seeds := 80
	if testing.Short() {
		seeds = 20
	}
	patches := 0
	for seed := range seeds {
		patches += mapChangesRun(t, uint64(seed))
	}
	if patches == 0 {
		t.Fatal("no policy was patched: the incremental path is not exercised")
	}
	t.Logf("%d patched policies over %d runs", patches, seeds)
}

func mapChangesRun(t *testing.T, seed uint64) int {
	rng := rand.New(rand.NewPCG(seed, 39))
	r := NewRepository()
	const a, b, dns, c identity.NumericIdentity = 300, 301, 302, 303
	r.UpsertIdentity(a, podLabels(t, "default", "app=a"))
	r.UpsertIdentity(b, podLabels(t, "default", "app=b"))
	r.UpsertIdentity(dns, podLabels(t, "default", "app=dns"))
	r.UpsertIdentity(c, podLabels(t, "default", "app=c"))
	aPorts, cPorts := mustPorts(t, "web=8000"), mustPorts(t, "web=8443")
	r.SetEndpointPorts("ep:1", a, aPorts)
	r.SetEndpointPorts("ep:3", c, cPorts)
	ports := map[identity.NumericIdentity]NamedPorts{a: aPorts, c: cPorts}
	var pols []*Policy
	for i := range 1 + rng.IntN(3) {
		app := []string{"a", "a", "b", "c"}[rng.IntN(4)]
		pols = append(pols, mustParse(t, randomMapChangePolicy(rng, fmt.Sprintf("p%d", i), app))...)
	}
	r.Import(pols)
	names := []string{"a.test", "b.test", "c.example", "d.other", "e.test"}
	addrs := []netip.Addr{
		netip.MustParseAddr("192.0.2.5"), netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("192.0.2.200"),
		netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.2"), netip.MustParseAddr("2001:db8::1"),
	}
	patchedRuns := 0
	// What every policy of the run held when it was cached: a patch
	// never changes an earlier policy.
	frozen := map[*MapState]MapState{}
	for step := range 40 {
		for _, id := range []identity.NumericIdentity{a, b, dns, c} {
			r.MapStateFor(id, ports[id]) // cached: the changes below patch or recompute them
		}
		prev := map[identity.NumericIdentity]*MapState{}
		for id, m := range r.mapStates {
			prev[id] = m
			if _, seen := frozen[m]; m != nil && !seen {
				frozen[m] = MapState{Allow: slices.Clone(m.Allow), Deny: slices.Clone(m.Deny), L7: slices.Clone(m.L7),
					DNS: slices.Clone(m.DNS), Named: slices.Clone(m.Named), NamedDeny: slices.Clone(m.NamedDeny)}
			}
		}
		what := ""
		switch op := rng.IntN(20); {
		case op == 0:
			// Another policy: a full recompute between the patches.
			p := mustParse(t, randomMapChangePolicy(rng, fmt.Sprintf("p%d", rng.IntN(3)), []string{"a", "b", "c"}[rng.IntN(3)]))
			r.Import(p)
			what = "import"
		case op == 1:
			r.UpsertIdentity(b, podLabels(t, "default", "app=b", fmt.Sprintf("v=%d", step)))
			what = "relabel"
		default:
			name := names[rng.IntN(len(names))]
			var ips []netip.Addr
			for _, ip := range addrs {
				if rng.IntN(3) == 0 {
					ips = append(ips, ip)
				}
			}
			r.SetFQDN(name, ips)
			what = fmt.Sprintf("SetFQDN(%s, %v)", name, ips)
		}
		for m, f := range frozen {
			if !slices.Equal(m.Allow, f.Allow) || !slices.Equal(m.Deny, f.Deny) || !l7Equal(m.L7, f.L7) || !dnsEqual(m.DNS, f.DNS) ||
				!slices.Equal(m.Named, f.Named) || !slices.Equal(m.NamedDeny, f.NamedDeny) {
				t.Fatalf("seed %d step %d %s: an earlier policy (a datapath may still hold it) was changed in place", seed, step, what)
			}
		}
		for id, got := range r.mapStates {
			saved := r.bySubjects
			r.bySubjects = nil
			want := r.compute(id)
			r.bySubjects = saved
			if !got.Equal(want) {
				t.Fatalf("seed %d step %d %s: identity %d: incremental %+v\nfull recompute %+v", seed, step, what, id, got, want)
			}
			if p, ok := ports[id]; ok && !got.ForPorts(p).Equal(want.ForPorts(p)) {
				t.Fatalf("seed %d step %d %s: identity %d: resolved for its ports: incremental %+v\nfull recompute %+v", seed, step, what, id, got.ForPorts(p), want.ForPorts(p))
			}
			old := prev[id]
			peers, patched := got.PatchedFrom(old)
			if !patched {
				continue
			}
			patchedRuns++
			checkPatchedFrom(t, fmt.Sprintf("seed %d step %d %s: identity %d", seed, step, what, id), old, got, peers)
		}
	}
	return patchedRuns
}

// checkPatchedFrom checks what the datapath relies on when to was
// patched from from (peers): the entries of other peers, the CIDR
// entries and the enforcement are from's, and DiffPeers is Diff.
func checkPatchedFrom(t *testing.T, what string, from, to *MapState, peers []identity.NumericIdentity) {
	t.Helper()
	other := func(id identity.NumericIdentity) bool { _, in := slices.BinarySearch(peers, id); return !in }
	keep := func(ks []Key) []Key {
		return slices.DeleteFunc(slices.Clone(ks), func(k Key) bool { return !other(k.Identity) })
	}
	keepL7 := func(es []L7Entry) []L7Entry {
		return slices.DeleteFunc(slices.Clone(es), func(e L7Entry) bool { return !other(e.Key.Identity) })
	}
	keepDNS := func(es []DNSEntry) []DNSEntry {
		return slices.DeleteFunc(slices.Clone(es), func(e DNSEntry) bool { return !other(e.Key.Identity) })
	}
	switch {
	case !slices.Equal(keep(from.Allow), keep(to.Allow)), !slices.Equal(keep(from.Deny), keep(to.Deny)):
		t.Fatalf("%s: patched for peers %v, but entries of other peers changed: %+v -> %+v", what, peers, from, to)
	case !l7Equal(keepL7(from.L7), keepL7(to.L7)), !dnsEqual(keepDNS(from.DNS), keepDNS(to.DNS)):
		t.Fatalf("%s: patched for peers %v, but redirects of other peers changed: %+v -> %+v", what, peers, from, to)
	case !slices.Equal(from.CIDR, to.CIDR), from.IngressEnforced != to.IngressEnforced, from.EgressEnforced != to.EgressEnforced:
		t.Fatalf("%s: patched, but CIDR entries or enforcement changed: %+v -> %+v", what, from, to)
	}
	pp := ProxyPorts{ParserHTTP: 1, ParserKafka: 2, ParserDNS: 3}
	full, err := to.Redirects(pp)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := to.RedirectsOf(to.PeerKeys(peers), pp)
	if err != nil {
		t.Fatal(err)
	}
	maps.DeleteFunc(full, func(k Key, _ uint16) bool { return other(k.Identity) })
	if len(full) == 0 {
		full = nil
	}
	if !maps.Equal(full, sub) {
		t.Fatalf("%s: RedirectsOf the peers' entries %v, Redirects %v", what, sub, full)
	}
	add, remove := Diff(from, to)
	padd, premove := DiffPeers(from, to, peers)
	if !slices.Equal(add, padd) || !slices.Equal(remove, premove) {
		t.Fatalf("%s: DiffPeers %v/%v, Diff %v/%v", what, padd, premove, add, remove)
	}
}

// TestPatchedFromCopies: a copy of a patched policy (ForPorts, WithDeny)
// and an unrelated policy are not patched from anything.
func TestPatchedFromCopies(t *testing.T) {
	r := NewRepository()
	const a identity.NumericIdentity = 300
	r.UpsertIdentity(a, podLabels(t, "default", "app=a"))
	r.Import(mustParse(t, fqdnPolicy))
	r.SetEndpointPorts("ep:1", a, mustPorts(t, "web=8000"))
	old := r.MapState(a)
	r.SetFQDN("allowed.test", []netip.Addr{netip.MustParseAddr("192.0.2.10")})
	m := r.MapState(a)
	peers, ok := m.PatchedFrom(old)
	if !ok || len(peers) != 1 || peers[0] < MinCIDRIdentity {
		t.Fatalf("PatchedFrom = %v, %v", peers, ok)
	}
	if _, ok := m.PatchedFrom(m); ok {
		t.Error("patched from itself")
	}
	if _, ok := m.WithDeny([]Key{{Dir: Egress, Identity: peers[0]}}).PatchedFrom(old); ok {
		t.Error("a copy with more denies claims to be patched from the old policy")
	}
	c := *m
	if _, ok := (&c).PatchedFrom(old); ok {
		t.Error("a copy claims to be patched")
	}
	// Two answers in a row: the second policy is patched from either.
	r.SetFQDN("allowed.test", []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11")})
	m2 := r.MapState(a)
	if p, ok := m2.PatchedFrom(old); !ok || len(p) != 2 {
		t.Fatalf("two steps back: %v %v", p, ok)
	}
	if p, ok := m2.PatchedFrom(m); !ok || len(p) != 1 {
		t.Fatalf("one step back: %v %v", p, ok)
	}
}
