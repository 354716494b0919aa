package policy

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// BenchmarkSetFQDNNewAddress: a DNS answer with a new address for a
// name a toFQDNs selector matches, with 1, 400 and 2,000 names learned
// before (the
// policy of test/fqdn's BenchmarkDNSProxyDelay): the learn's repository
// part, SetFQDN and the asking identity's policy, then the name's
// expiry (an op is both).
func BenchmarkSetFQDNNewAddress(b *testing.B) {
	for _, learned := range []int{1, 400, 2000} {
		b.Run(fmt.Sprintf("learned=%d", learned), func(b *testing.B) { benchSetFQDN(b, learned) })
	}
}

func benchSetFQDN(b *testing.B, learned int) {
	r := NewRepository()
	const a identity.NumericIdentity = 300
	r.UpsertIdentity(a, podLabels(b, "default", "app=a"))
	r.Import(mustParse(b, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: fqdn}
spec:
  endpointSelector: {matchLabels: {app: a}}
  egress:
  - toEntities: [world]
    toPorts:
    - ports: [{port: "53", protocol: ANY}]
      rules:
        dns: [{matchPattern: "*.test"}]
  - toFQDNs: [{matchPattern: "*.test"}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
`))
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}) }
	for i := range learned {
		r.SetFQDN(fmt.Sprintf("h%d.test", i), []netip.Addr{addr(i)})
		r.MapStateFor(a, nil)
	}
	b.ResetTimer()
	for i := range b.N {
		name := fmt.Sprintf("n%d.test", i)
		r.SetFQDN(name, []netip.Addr{addr(100000 + i)})
		r.MapStateFor(a, nil)
		r.SetFQDN(name, nil) // back to the names learned before
		r.MapStateFor(a, nil)
	}
}
