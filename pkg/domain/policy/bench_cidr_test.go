package policy

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// cidrDoc returns a CNP for app=web in namespace ns0 allowing egress to
// n CIDRs: host addresses from 10.0.0.0 upwards, every 256th replaced
// by the /24 it starts (so prefixes nest), on TCP 443.
func cidrDoc(name string, n int) []byte {
	cidrs := make([]string, n)
	base := netip.MustParseAddr("10.0.0.0").As4()
	for i := range cidrs {
		v := uint32(base[0])<<24 + uint32(i)
		a := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
		p := netip.PrefixFrom(a, 32)
		if i%256 == 0 {
			p = netip.PrefixFrom(a, 24).Masked()
		}
		cidrs[i] = p.String()
	}
	doc := map[string]any{
		"apiVersion": APIVersionCNP, "kind": KindCNP,
		"metadata": map[string]any{"name": name, "namespace": "ns0"},
		"spec": map[string]any{
			"endpointSelector": map[string]any{"matchLabels": map[string]string{"app": "web"}},
			"egress": []any{map[string]any{
				"toCIDR":  cidrs,
				"toPorts": []any{map[string]any{"ports": []any{map[string]any{"port": "443", "protocol": "TCP"}}}},
			}},
		},
	}
	b, err := json.Marshal(doc)
	if err != nil {
		panic(err)
	}
	return b
}

// cidrBenchRepo returns a repository with 1,000 pod identities in 10
// namespaces, every one's policy computed, and policies that peer the
// world entity, 0.0.0.0/0 and 10.0.0.0/8 (selectors every new CIDR
// identity joins).
func cidrBenchRepo(tb testing.TB) *Repository {
	tb.Helper()
	r := NewRepository()
	for i := range 1000 {
		r.UpsertIdentity(identity.NumericIdentity(256+i), podLabels(tb, fmt.Sprintf("ns%d", i%10), fmt.Sprintf("app=app%d", i%20), "role=web"))
	}
	r.UpsertIdentity(256+1000, podLabels(tb, "ns0", "app=web"))
	var docs string
	for ns := range 10 {
		docs += fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: base, namespace: ns%d}
spec:
  endpointSelector: {matchLabels: {role: web}}
  egress:
  - toEntities: [world]
    toPorts: [{ports: [{port: "53", protocol: UDP}]}]
  - toCIDR: [0.0.0.0/0]
    toPorts: [{ports: [{port: "80", protocol: TCP}]}]
  - toCIDRSet: [{cidr: 10.0.0.0/8, except: [10.255.0.0/16]}]
---
`, ns)
	}
	r.Import(mustParse(tb, docs))
	for i := range 1001 {
		r.MapState(identity.NumericIdentity(256 + i))
	}
	return r
}

// BenchmarkImportCIDRs: importing one policy with n new CIDR peers into
// a repository whose identities all have their policy computed (the
// policy actor's share of PUT /v1/policy; parsing is timed separately).
func BenchmarkImportCIDRs(b *testing.B) {
	for _, n := range []int{1000, 10000, 50000} {
		b.Run(fmt.Sprintf("cidrs=%d", n), func(b *testing.B) {
			pols := mustParse(b, string(cidrDoc("many", n)))
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				r := cidrBenchRepo(b)
				b.StartTimer()
				if res := r.Import(pols); len(res.CIDRUpserts) != n {
					b.Fatalf("%d CIDR upserts, want %d", len(res.CIDRUpserts), n)
				}
			}
		})
	}
}

// BenchmarkParseCIDRs: parsing the same documents (JSON, as the API's
// callers send them).
func BenchmarkParseCIDRs(b *testing.B) {
	for _, n := range []int{1000, 10000, 50000} {
		b.Run(fmt.Sprintf("cidrs=%d", n), func(b *testing.B) {
			doc := cidrDoc("many", n)
			b.ResetTimer()
			for range b.N {
				if _, err := Parse(doc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
