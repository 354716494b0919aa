package policy

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

func mustParse(t testing.TB, doc string) []*Policy {
	t.Helper()
	pols, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return pols
}

func podLabels(t testing.TB, ns string, kv ...string) labels.Labels {
	t.Helper()
	ss := []string{"k8s:" + NamespaceLabel + "=" + ns}
	for _, x := range kv {
		ss = append(ss, "k8s:"+x)
	}
	return mustLabels(t, ss...)
}

func changedIDs(res Result) []identity.NumericIdentity {
	var out []identity.NumericIdentity
	for _, c := range res.Changed {
		out = append(out, c.Identity)
	}
	return out
}

const allowAToB = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: a-to-b}
spec:
  endpointSelector: {matchLabels: {app: b}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: a}}]
    toPorts: [{ports: [{port: "8080", protocol: TCP}]}]
`

// TestRepositoryOnlyAffected: imports, deletes and identity changes
// report exactly the identities whose policy changed.
func TestRepositoryOnlyAffected(t *testing.T) {
	const a, b, c, a2 identity.NumericIdentity = 300, 301, 302, 303
	r := NewRepository()
	for id, app := range map[identity.NumericIdentity]string{a: "a", b: "b", c: "c"} {
		r.UpsertIdentity(id, podLabels(t, "default", "app="+app))
		if m := r.MapState(id); m != nil {
			t.Fatalf("identity %d: policy %+v without rules", id, m)
		}
	}
	steps := []struct {
		name string
		do   func() Result
		want []identity.NumericIdentity
		// check runs after the step on B's policy.
		check func(m *MapState) bool
	}{
		{"import", func() Result { return r.Import(mustParse(t, allowAToB)) }, []identity.NumericIdentity{b},
			func(m *MapState) bool {
				return m.Enforced(Ingress) && !m.Enforced(Egress) && m.Allows(a, 8080, ProtoTCP, Ingress) &&
					!m.Allows(a, 8081, ProtoTCP, Ingress) && !m.Allows(c, 8080, ProtoTCP, Ingress)
			}},
		{"re-import unchanged", func() Result { return r.Import(mustParse(t, allowAToB)) }, nil,
			func(m *MapState) bool { return m.Allows(a, 8080, ProtoTCP, Ingress) }},
		{"new identity selected as peer", func() Result { return r.UpsertIdentity(a2, podLabels(t, "default", "app=a", "x=y")) },
			[]identity.NumericIdentity{b}, func(m *MapState) bool { return m.Allows(a2, 8080, ProtoTCP, Ingress) }},
		{"identity in another namespace", func() Result { return r.UpsertIdentity(400, podLabels(t, "other", "app=a")) }, nil,
			func(m *MapState) bool { return !m.Allows(400, 8080, ProtoTCP, Ingress) }},
		{"peer identity released", func() Result { return r.RemoveIdentity(a2) }, []identity.NumericIdentity{b},
			func(m *MapState) bool { return !m.Has(Key{a2, 8080, ProtoTCP, Ingress}) }},
		{"delete", func() Result { res, _ := r.DeleteByName("default/a-to-b"); return res }, []identity.NumericIdentity{b},
			func(m *MapState) bool { return m == nil }},
	}
	for _, st := range steps {
		res := st.do()
		if got := changedIDs(res); !slices.Equal(got, st.want) {
			t.Errorf("%s: changed %v, want %v", st.name, got, st.want)
		}
		if m := r.MapState(b); !st.check(m) {
			t.Errorf("%s: B's policy %+v", st.name, m)
		}
	}
	if _, err := r.DeleteByName("default/a-to-b"); err != ErrNotFound {
		t.Errorf("second delete = %v, want ErrNotFound", err)
	}
	if r.Selectors() != 0 {
		t.Errorf("%d selectors left after deleting every rule", r.Selectors())
	}
}

// TestRepositoryShared: endpoints of one identity share one MapState
// pointer until it changes.
func TestRepositoryShared(t *testing.T) {
	r := NewRepository()
	r.UpsertIdentity(301, podLabels(t, "default", "app=b"))
	r.Import(mustParse(t, allowAToB))
	if m1, m2 := r.MapState(301), r.MapState(301); m1 == nil || m1 != m2 {
		t.Fatalf("MapState not shared: %p %p", m1, m2)
	}
}

// TestRepositoryCIDR: CIDR prefixes get local identities with ipcache
// entries; world covers them; deleting the policy removes them.
func TestRepositoryCIDR(t *testing.T) {
	r := NewRepository()
	r.UpsertIdentity(300, podLabels(t, "default", "app=a"))
	r.MapState(300)
	res := r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: cidr}
specs:
- endpointSelector: {matchLabels: {app: a}}
  egress:
  - toCIDRSet: [{cidr: 10.0.0.0/8, except: [10.1.0.0/16]}]
    toPorts: [{ports: [{port: "443", protocol: TCP}]}]
  - toCIDR: [0.0.0.0/0]
    toPorts: [{ports: [{port: "53", protocol: UDP}]}]
  ingress:
  - fromEntities: [world]
`))
	p8, p16 := netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("10.1.0.0/16")
	id8, id16 := res.CIDRUpserts[p8], res.CIDRUpserts[p16]
	if len(res.CIDRUpserts) != 2 || id8 < MinCIDRIdentity || id16 < MinCIDRIdentity || id8 == id16 {
		t.Fatalf("CIDR upserts %v, want 10.0.0.0/8 and 10.1.0.0/16 (0.0.0.0/0 needs no identity)", res.CIDRUpserts)
	}
	m := r.MapState(300)
	tests := []struct {
		name  string
		peer  identity.NumericIdentity
		port  uint16
		proto uint8
		dir   Direction
		want  bool
	}{
		{"inside the cidr", id8, 443, ProtoTCP, Egress, true},
		{"the except", id16, 443, ProtoTCP, Egress, false},
		{"0.0.0.0/0 is not the world identity (it holds IPv6 too)", identity.ReservedWorld, 53, ProtoUDP, Egress, false},
		{"0.0.0.0/0 covers cidr identities", id16, 53, ProtoUDP, Egress, true},
		{"world port not allowed", identity.ReservedWorld, 443, ProtoTCP, Egress, false},
		{"world entity ingress", identity.ReservedWorld, 1, ProtoTCP, Ingress, true},
		{"world entity covers cidr identities", id8, 1, ProtoTCP, Ingress, true},
		{"host is not world", identity.ReservedHost, 1, ProtoTCP, Ingress, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := m.Allows(tt.peer, tt.port, tt.proto, tt.dir); got != tt.want {
				t.Errorf("Allows(%d, %d, %d, %v) = %v, want %v", tt.peer, tt.port, tt.proto, tt.dir, got, tt.want)
			}
		})
	}
	for _, a := range []struct {
		addr string
		want bool
	}{{"192.0.2.1", true}, {"10.1.2.3", true}, {"2001:db8::1", false}} {
		if got := m.CIDRAllows(netip.MustParseAddr(a.addr), 53, ProtoUDP, Egress); got != a.want {
			t.Errorf("0.0.0.0/0 on UDP 53: %s allowed = %v, want %v", a.addr, got, a.want)
		}
	}
	res, _ = r.DeleteByName("default/cidr")
	if len(res.CIDRDeletes) != 2 || len(r.CIDRs()) != 0 {
		t.Errorf("after delete: CIDR deletes %v, left %v", res.CIDRDeletes, r.CIDRs())
	}
}

// fuzzPolicies are the policies FuzzRepository imports and deletes.
var fuzzPolicies = []string{
	allowAToB,
	`{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"k1"},"spec":{"podSelector":{"matchLabels":{"app":"a"}},"egress":[{"to":[{"podSelector":{"matchExpressions":[{"key":"app","operator":"In","values":["b","c"]}]}}],"ports":[{"port":53,"protocol":"UDP"}]}]}}`,
	`{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"k2","namespace":"other"},"spec":{"podSelector":{},"ingress":[{"from":[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"default"}}}]}]}}`,
	`{"apiVersion":"cilium.io/v2","kind":"CiliumNetworkPolicy","metadata":{"name":"c3"},"spec":{"endpointSelector":{"matchLabels":{"app":"a"}},"egress":[{"toCIDRSet":[{"cidr":"10.0.0.0/8","except":["10.1.0.0/16"]}],"toCIDR":["10.1.2.0/24","10.1.2.3/32"]},{"toEntities":["world"],"toPorts":[{"ports":[{"port":"53"}]}]}]}}`,
	`{"apiVersion":"cilium.io/v2","kind":"CiliumNetworkPolicy","metadata":{"name":"c4"},"spec":{"endpointSelector":{"matchLabels":{"app":"b"}},"ingress":[{"fromCIDR":["10.1.0.0/16","0.0.0.0/0"],"fromCIDRSet":[{"cidr":"fd00::/8","except":["fd00:1::/32"]}]}],"egress":[{"toCIDR":["10.1.2.3","fd00:1::1"]}]}}`,
	`{"apiVersion":"cilium.io/v2","kind":"CiliumNetworkPolicy","metadata":{"name":"c2"},"spec":{"endpointSelector":{"matchExpressions":[{"key":"app","operator":"NotIn","values":["a"]}]},"ingress":[{"fromEntities":["host","cluster"]},{"fromEndpoints":[{"matchExpressions":[{"key":"x","operator":"Exists"}]}]}],"egress":[{"toEndpoints":[{"matchExpressions":[{"key":"x","operator":"DoesNotExist"}]}]}]}}`,
}

// FuzzRepository applies random imports, deletes and identity changes
// and checks the incremental selector cache against a from-scratch
// computation, and that exactly the identities whose policy changed are
// reported.
func FuzzRepository(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})
	f.Add([]byte{3, 9, 9, 1, 4, 2, 8, 16, 33, 7})
	f.Fuzz(func(t *testing.T, ops []byte) {
		pols := make([]*Policy, len(fuzzPolicies))
		for i, d := range fuzzPolicies {
			pols[i] = mustParse(t, d)[0]
		}
		r := NewRepository()
		apps := []string{"a", "b", "c"}
		nss := []string{"default", "other"}
		for i, op := range ops {
			prev := map[identity.NumericIdentity]*MapState{}
			for id := range r.ids {
				prev[id] = r.MapState(id)
			}
			var res Result
			switch op % 4 {
			case 0:
				res = r.Import([]*Policy{pols[int(op/4)%len(pols)]})
			case 1:
				res, _ = r.DeleteByName(pols[int(op/4)%len(pols)].Key())
			case 2:
				id := identity.NumericIdentity(300 + int(op/4)%8)
				kv := []string{"app=" + apps[int(op/32)%3]}
				if i%2 == 0 {
					kv = append(kv, "x=1")
				}
				res = r.UpsertIdentity(id, podLabels(t, nss[int(op/4)%2], kv...))
			case 3:
				res = r.RemoveIdentity(identity.NumericIdentity(300 + int(op/4)%8))
			}
			checkAgainstScratch(t, r, prev, res)
		}
	})
}

func checkAgainstScratch(t *testing.T, r *Repository, prev map[identity.NumericIdentity]*MapState, res Result) {
	t.Helper()
	fresh := NewRepository()
	for id, ls := range r.ids {
		if _, isCIDR := r.cidrIDs[id]; !isCIDR {
			fresh.UpsertIdentity(id, ls)
		}
	}
	for p, c := range r.cidrs { // the same numbers, as after a restart
		fresh.SeedCIDR(p, c.id)
	}
	fresh.Import(r.Policies())
	changed := map[identity.NumericIdentity]bool{}
	for _, c := range res.Changed {
		changed[c.Identity] = true
	}
	for key, cs := range r.selectors {
		for id, ls := range r.ids {
			if _, got := cs.ids[id]; got != cs.sel.Matches(ls) {
				t.Fatalf("selector %s: holds identity %d (%v) = %v, Matches says %v", key, id, ls, got, !got)
			}
		}
		for id := range cs.ids {
			if _, ok := r.ids[id]; !ok {
				t.Fatalf("selector %s holds unknown identity %d", key, id)
			}
		}
	}
	for id := range r.ids {
		got, want := r.MapState(id), fresh.MapState(id)
		if !got.Equal(want) {
			t.Fatalf("identity %d: incremental policy %+v, from scratch %+v", id, got, want)
		}
		if old, had := prev[id]; had && changed[id] == old.Equal(got) {
			t.Fatalf("identity %d: reported changed=%v, but policy went from %+v to %+v", id, changed[id], old, got)
		}
	}
}
