package policy

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

const fqdnPolicy = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: fqdn}
spec:
  endpointSelector: {matchLabels: {app: a}}
  egress:
  - toEndpoints: [{matchLabels: {app: dns}}]
    toPorts:
    - ports: [{port: "53", protocol: ANY}]
      rules:
        dns: [{matchPattern: "*.test"}]
  - toFQDNs: [{matchName: allowed.test}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
`

func TestFQDNMapState(t *testing.T) {
	r := NewRepository()
	const a, dns identity.NumericIdentity = 300, 301
	r.UpsertIdentity(a, podLabels(t, "default", "app=a"))
	r.UpsertIdentity(dns, podLabels(t, "default", "app=dns"))
	r.Import(mustParse(t, fqdnPolicy))
	m := r.MapState(a)
	udp53, tcp53 := Key{dns, 53, ProtoUDP, Egress}, Key{dns, 53, ProtoTCP, Egress}
	for _, k := range []Key{udp53, tcp53} {
		e, ok := m.DNSRedirected(k)
		if !m.Has(k) || !ok || len(e.Names) != 1 || e.Names[0].MatchPattern != "*.test" {
			t.Fatalf("%+v: allowed %v, DNS entry %+v %v", k, m.Has(k), e, ok)
		}
	}
	if m.Has(Key{dns, 53, ProtoSCTP, Egress}) {
		t.Error("DNS rules expanded ANY to SCTP")
	}
	// Nothing learned: no address of allowed.test is allowed.
	allowed, other := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.20")
	res := r.SetFQDN("Allowed.Test", []netip.Addr{allowed})
	id, ok := res.CIDRUpserts[netip.PrefixFrom(allowed, 32)]
	if !ok || id < MinCIDRIdentity || len(res.Changed) != 1 || res.Changed[0].Identity != a {
		t.Fatalf("SetFQDN: %+v", res)
	}
	m = r.MapState(a)
	if !m.Allows(id, 80, ProtoTCP, Egress) || m.Allows(id, 81, ProtoTCP, Egress) {
		t.Fatalf("learned address: %+v", m.Allow)
	}
	// A name no selector matches gets no identity (nothing could select it).
	res = r.SetFQDN("denied.test", []netip.Addr{other})
	if len(res.Changed) != 0 || len(res.CIDRUpserts) != 0 {
		t.Fatalf("denied.test: %+v", res)
	}
	// The same address under a second name keeps its identity.
	if res := r.SetFQDN("alias.test", []netip.Addr{allowed}); len(res.CIDRUpserts) != 0 || len(res.Changed) != 0 {
		t.Fatalf("alias: %+v", res)
	}
	r.SetFQDN("alias.test", nil)
	// Forgetting the name removes the entry and the identity.
	res = r.SetFQDN("allowed.test", nil)
	if len(res.CIDRDeletes) != 1 || res.CIDRDeletes[0] != netip.PrefixFrom(allowed, 32) || len(res.Changed) != 1 {
		t.Fatalf("forget: %+v", res)
	}
	if r.MapState(a).Allows(id, 80, ProtoTCP, Egress) {
		t.Fatal("forgotten address still allowed")
	}
	// A selector imported after the answer selects what was learned: the
	// address gets its identity then, and loses it with the selector.
	if res := r.SetFQDN("late.test", []netip.Addr{other}); len(res.CIDRUpserts) != 0 {
		t.Fatalf("late.test before its selector: %+v", res)
	}
	res = r.Import(mustParse(t, strings.ReplaceAll(strings.Replace(fqdnPolicy, "name: fqdn", "name: late", 1), "allowed.test", "late.test")))
	lid, ok := res.CIDRUpserts[netip.PrefixFrom(other, 32)]
	if !ok || !r.MapState(a).Allows(lid, 80, ProtoTCP, Egress) {
		t.Fatalf("selector added after the answer does not select the learned address: %+v", res)
	}
	res, err := r.DeleteByName("default/late")
	if err != nil || len(res.CIDRDeletes) != 1 || res.CIDRDeletes[0] != netip.PrefixFrom(other, 32) {
		t.Fatalf("selector deleted: %+v %v", res, err)
	}
	// Staged imports take the same path.
	st := r.Stage(mustParse(t, strings.ReplaceAll(strings.Replace(fqdnPolicy, "name: fqdn", "name: late2", 1), "allowed.test", "late.test")))
	for !st.Step(1) {
	}
	res = st.Import()
	if lid, ok := res.CIDRUpserts[netip.PrefixFrom(other, 32)]; !ok || !r.MapState(a).Allows(lid, 80, ProtoTCP, Egress) {
		t.Fatalf("staged import: %+v", res)
	}
}

func TestFQDNParseRefuses(t *testing.T) {
	head := "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: p}\nspec:\n  endpointSelector: {}\n  egress:\n"
	cases := []struct{ name, egress, want string }{
		{"toFQDNs with toEndpoints", "  - toFQDNs: [{matchName: a.test}]\n    toEndpoints: [{}]\n", "spec.egress[0].toFQDNs: cannot be combined"},
		{"bad matchName", "  - toFQDNs: [{matchName: '*.test'}]\n", "spec.egress[0].toFQDNs[0].matchName"},
		{"both", "  - toFQDNs: [{matchName: a.test, matchPattern: '*'}]\n", "spec.egress[0].toFQDNs[0]: matchName and matchPattern"},
		{"unknown selector field", "  - toFQDNs: [{matchRegex: x}]\n", `unsupported field "spec.egress[0].toFQDNs[0].matchRegex"`},
		{"dns without port", "  - toPorts: [{rules: {dns: [{matchName: a.test}]}}]\n", "L7 rules need at least one port"},
		{"dns port 0", "  - toPorts: [{ports: [{port: \"0\"}], rules: {dns: [{matchName: a.test}]}}]\n", "DNS rules need a port"},
		{"dns and http", "  - toPorts: [{ports: [{port: \"53\"}], rules: {dns: [{matchName: a.test}], http: [{}]}}]\n", "with dns in one port rule"},
		{"bad dns pattern", "  - toPorts: [{ports: [{port: \"53\"}], rules: {dns: [{matchPattern: 'a**'}]}}]\n", "spec.egress[0].toPorts[0].rules.dns[0].matchPattern"},
		{"kafka and dns", "  - toPorts: [{ports: [{port: \"53\"}], rules: {kafka: [], dns: []}}]\n", "with dns in one port rule"},
		{"dns with toFQDNs", "  - toFQDNs: [{matchName: a.test}]\n    toPorts: [{ports: [{port: \"53\"}], rules: {dns: [{matchName: a.test}]}}]\n", "rules.dns in the same entry"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(head + c.egress))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Parse = %v, want an error containing %q", err, c.want)
			}
		})
	}
}

func TestDNSRulesMerge(t *testing.T) {
	r := NewRepository()
	const a identity.NumericIdentity = 300
	r.UpsertIdentity(a, podLabels(t, "default", "app=a"))
	p := strings.Replace(fqdnPolicy, "  - toFQDNs: [{matchName: allowed.test}]\n    toPorts:\n    - ports: [{port: \"80\", protocol: TCP}]\n", "", 1)
	p = strings.Replace(p, "toEndpoints: [{matchLabels: {app: dns}}]", "toEntities: [world]", 1)
	r.Import(mustParse(t, p))
	r.Import(mustParse(t, strings.NewReplacer("name: fqdn", "name: two", `"*.test"`, "x.example").Replace(p)))
	m := r.MapState(a)
	if len(m.DNS) != 2 {
		t.Fatalf("DNS = %+v", m.DNS)
	}
	world := Key{identity.ReservedWorld, 53, ProtoUDP, Egress}
	e, ok := m.DNSRedirected(world)
	want := []fqdn.Selector{{MatchPattern: "*.test"}, {MatchPattern: "x.example"}}
	if !ok || len(e.Names) != 2 || e.Names[0] != want[0] || e.Names[1] != want[1] {
		t.Fatalf("merged names = %+v", e)
	}
	// rules.dns: [] allows every name.
	r.Import(mustParse(t, strings.NewReplacer("name: fqdn", "name: three", `dns: [{matchPattern: "*.test"}]`, "dns: []").Replace(p)))
	e, _ = r.MapState(a).DNSRedirected(world)
	if len(e.Names) != 3 || e.Names[0].MatchPattern != "*" {
		t.Fatalf("empty dns rules: %+v", e)
	}
}
