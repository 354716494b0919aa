package datapath

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// patchPolicy is a toFQDNs policy whose learned addresses get allows,
// DNS and HTTP redirects and denies of a broader selector (world).
const patchPolicy = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: fqdn, namespace: default}
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
    - ports: [{port: "80", protocol: TCP}, {port: "443", protocol: TCP}]
  - toFQDNs: [{matchPattern: "web*.test"}]
    toPorts:
    - ports: [{port: "8080", protocol: TCP}]
      rules:
        http: [{method: GET}]
  egressDeny:
  - toEntities: [world]
    toPorts:
    - ports: [{port: "443", protocol: TCP}]
  - toCIDR: [192.0.2.128/25]
`

// TestBPFPolicyPatch: a policy patched by DNS answers (addresses
// learned, moved between names, forgotten) is written by its patched
// entries alone (syncPatch), and the policy map then holds exactly what
// a full write of it would: every entry, its deny flag and proxy port.
func TestBPFPolicyPatch(t *testing.T) {
	h := newProgHarness(t, 42, 5000)
	const self identity.NumericIdentity = 5000
	r := policy.NewRepository()
	ls, err := labels.New(labels.Label{Source: "k8s", Key: "app", Value: "a"}, labels.Label{Source: "k8s", Key: policy.NamespaceLabel, Value: "default"})
	if err != nil {
		t.Fatal(err)
	}
	r.UpsertIdentity(self, ls)
	pols, err := policy.Parse([]byte(patchPolicy))
	if err != nil {
		t.Fatal(err)
	}
	r.Import(pols)
	pp := policy.ProxyPorts{policy.ParserHTTP: 15001, policy.ParserDNS: 15053}
	full, err := r.MapState(self).Redirects(pp)
	if err != nil {
		t.Fatal(err)
	}
	if err := syncPolicyMap(h.pm, h.cm, policyTarget{h.have, h.ports}, policyTarget{r.MapState(self), full}); err != nil {
		t.Fatal(err)
	}
	h.have, h.ports = r.MapState(self), full
	patched := 0
	for i := range 40 {
		name := fmt.Sprintf("%s%d.test", []string{"web", "api"}[i%2], i%7)
		var ips []netip.Addr
		if i%5 != 4 { // every fifth answer forgets the name
			ips = []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(60 + 3*i)}), netip.AddrFrom4([4]byte{198, 51, 100, byte(i % 9)})}
		}
		r.SetFQDN(name, ips)
		want := r.MapState(self)
		peers, ok := want.PatchedFrom(h.have)
		if !ok {
			if want != h.have {
				t.Fatalf("answer %d: policy changed but not patched", i)
			}
			continue
		}
		patched++
		ports, err := syncPatch(h.pm, policyTarget{h.have, h.ports}, want, peers, pp)
		if err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		h.have, h.ports = want, ports
		got, gotPorts, err := realisedState(h.pm, h.cm)
		if err != nil {
			t.Fatal(err)
		}
		wantPorts, err := want.Redirects(pp)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case !slices.Equal(got.Allow, want.Allow):
			t.Fatalf("answer %d (%s %v): map holds %v, want %v", i, name, ips, got.Allow, want.Allow)
		case !slices.Equal(got.Deny, want.Deny):
			t.Fatalf("answer %d (%s %v): map denies %v, want %v", i, name, ips, got.Deny, want.Deny)
		case !maps.Equal(gotPorts, wantPorts) || !maps.Equal(h.ports, wantPorts):
			t.Fatalf("answer %d (%s %v): proxy ports %v (kept %v), want %v", i, name, ips, gotPorts, h.ports, wantPorts)
		case got.EgressEnforced != want.EgressEnforced || !slices.Equal(got.CIDR, want.CIDR):
			t.Fatalf("answer %d: enforcement or CIDR entries differ: %+v, want %+v", i, got, want)
		}
	}
	if patched < 20 {
		t.Fatalf("%d patched writes of 40 answers", patched)
	}
}

// BenchmarkBPFPolicyPatch: writing a DNS answer's new address into a
// policy map holding 400 learned ones (syncPatch), against the full diff
// of the same change (syncPolicyMap).
func BenchmarkBPFPolicyPatch(b *testing.B) {
	for _, mode := range []string{"patch", "full"} {
		b.Run(mode, func(b *testing.B) {
			h := newProgHarness(b, 42, 5000)
			const self identity.NumericIdentity = 5000
			r := policy.NewRepository()
			ls, err := labels.New(labels.Label{Source: "k8s", Key: "app", Value: "a"}, labels.Label{Source: "k8s", Key: policy.NamespaceLabel, Value: "default"})
			if err != nil {
				b.Fatal(err)
			}
			r.UpsertIdentity(self, ls)
			pols, err := policy.Parse([]byte(patchPolicy))
			if err != nil {
				b.Fatal(err)
			}
			r.Import(pols)
			pp := policy.ProxyPorts{policy.ParserHTTP: 15001, policy.ParserDNS: 15053}
			addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}) }
			for i := range 400 {
				r.SetFQDN(fmt.Sprintf("h%d.test", i), []netip.Addr{addr(i)})
			}
			sync := func(want *policy.MapState) {
				if peers, ok := want.PatchedFrom(h.have); ok && mode == "patch" {
					ports, err := syncPatch(h.pm, policyTarget{h.have, h.ports}, want, peers, pp)
					if err != nil {
						b.Fatal(err)
					}
					h.have, h.ports = want, ports
					return
				}
				ports, err := want.Redirects(pp)
				if err != nil {
					b.Fatal(err)
				}
				if err := syncPolicyMap(h.pm, h.cm, policyTarget{h.have, h.ports}, policyTarget{want, ports}); err != nil {
					b.Fatal(err)
				}
				h.have, h.ports = want, ports
			}
			sync(r.MapState(self))
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				name := fmt.Sprintf("n%d.test", i)
				r.SetFQDN(name, []netip.Addr{addr(1000 + i)})
				want := r.MapState(self)
				b.StartTimer()
				sync(want)
				b.StopTimer()
				r.SetFQDN(name, nil)
				sync(r.MapState(self))
				b.StartTimer()
			}
		})
	}
}
