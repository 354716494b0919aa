package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

const knpEgressHead = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: %s, namespace: x}
spec:
  podSelector: {matchLabels: {app: a}}
  policyTypes: [Egress]
  egress:
`

// cidrState imports docs and returns the MapState of a pod in x.
func cidrState(t *testing.T, docs ...string) *MapState {
	t.Helper()
	r := NewRepository()
	r.UpsertIdentity(300, podLabels(t, "x", "app=a"))
	r.MapState(300)
	for _, d := range docs {
		r.Import(mustParse(t, d))
	}
	m := r.MapState(300)
	if m == nil {
		t.Fatal("no policy computed")
	}
	return m
}

func egressBlock(name, rule string) string {
	return fmt.Sprintf(knpEgressHead, name) + rule
}

// TestCIDRAddresses: CIDR rules decide on the peer's address, pod
// addresses included; except carves out exactly, also across policies.
func TestCIDRAddresses(t *testing.T) {
	allowAll := egressBlock("all", "  - to: [{ipBlock: {cidr: 0.0.0.0/0}}]\n")
	pod32 := egressBlock("pod", "  - to: [{ipBlock: {cidr: 10.244.0.5/32}}]\n")
	carve := egressBlock("carve", "  - to: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}}]\n")
	inner := egressBlock("inner", "  - to: [{ipBlock: {cidr: 10.1.2.0/24}}]\n")
	carveAll := egressBlock("carve-all", "  - to: [{ipBlock: {cidr: 0.0.0.0/0, except: [10.0.0.0/8]}}]\n")
	carve80 := egressBlock("carve80", "  - to: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}}]\n    ports: [{port: 80}]\n")
	inner81 := egressBlock("inner81", "  - to: [{ipBlock: {cidr: 10.1.0.0/16}}]\n    ports: [{port: 81}]\n")
	type probe struct {
		addr  string
		port  uint16
		proto uint8
		want  bool
	}
	tests := []struct {
		name   string
		docs   []string
		probes []probe
	}{
		{"0.0.0.0/0 allows pods and the world (IPv4)", []string{allowAll}, []probe{
			{"10.244.0.5", 80, ProtoTCP, true}, {"8.8.8.8", 53, ProtoUDP, true}, {"fd00::1", 80, ProtoTCP, false}}},
		{"a pod's /32 admits exactly that address", []string{pod32}, []probe{
			{"10.244.0.5", 80, ProtoTCP, true}, {"10.244.0.6", 80, ProtoTCP, false}, {"10.244.0.4", 80, ProtoTCP, false}}},
		{"except carves out exactly", []string{carve}, []probe{
			{"10.0.0.1", 80, ProtoTCP, true}, {"10.1.0.0", 80, ProtoTCP, false}, {"10.1.255.255", 80, ProtoTCP, false},
			{"10.2.0.0", 80, ProtoTCP, true}, {"10.0.255.255", 80, ProtoTCP, true}, {"11.0.0.0", 80, ProtoTCP, false}}},
		{"a narrower rule of another policy re-allows part of an except", []string{carve, inner}, []probe{
			{"10.1.2.3", 80, ProtoTCP, true}, {"10.1.3.3", 80, ProtoTCP, false}, {"10.3.0.1", 80, ProtoTCP, true}}},
		{"a broader rule of another policy allows the except", []string{carve, allowAll}, []probe{
			{"10.1.3.3", 80, ProtoTCP, true}, {"11.0.0.1", 80, ProtoTCP, true}}},
		{"an except of another policy does not deny what one allows", []string{carve, carveAll}, []probe{
			{"10.1.3.3", 80, ProtoTCP, false}, {"10.2.0.1", 80, ProtoTCP, true}, {"11.0.0.1", 80, ProtoTCP, true}}},
		{"ports keep their own tables", []string{carve80, inner81}, []probe{
			{"10.1.2.3", 80, ProtoTCP, false}, {"10.1.2.3", 81, ProtoTCP, true}, {"10.2.2.3", 80, ProtoTCP, true},
			{"10.2.2.3", 81, ProtoTCP, false}, {"10.2.2.3", 80, ProtoUDP, false}}},
		{"an any-port except is not undone by a port rule's broader prefix", []string{carve, egressBlock("all80", "  - to: [{ipBlock: {cidr: 0.0.0.0/0}}]\n    ports: [{port: 80}]\n")}, []probe{
			{"10.1.2.3", 80, ProtoTCP, true}, {"10.1.2.3", 81, ProtoTCP, false}, {"10.2.2.3", 81, ProtoTCP, true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := cidrState(t, tt.docs...)
			for _, p := range tt.probes {
				a := netip.MustParseAddr(p.addr)
				if got := m.AllowsAddr(400, a, p.port, p.proto, Egress); got != p.want {
					t.Errorf("%s:%d/%d allowed = %v, want %v (entries %v)", p.addr, p.port, p.proto, got, p.want, m.CIDR)
				}
			}
		})
	}
}

// TestCIDRNoWidening: a pod's /32 adds no identity entry for the pod's
// identity, so its siblings (same labels) gain nothing.
func TestCIDRNoWidening(t *testing.T) {
	m := cidrState(t, egressBlock("pod", "  - to: [{ipBlock: {cidr: 10.244.0.5/32}}]\n"))
	for _, k := range m.Allow {
		if k.Identity < MinCIDRIdentity && k.Identity != identity.ReservedWorld {
			t.Errorf("identity entry %+v for a CIDR rule", k)
		}
	}
	want := []CIDREntry{{Dir: Egress, Prefix: netip.MustParsePrefix("10.244.0.5/32"), Allow: true}}
	if !slices.Equal(m.CIDR, want) {
		t.Errorf("CIDR = %v, want %v", m.CIDR, want)
	}
}

// TestCIDREntriesMinimal: entries that change no verdict are left out.
func TestCIDREntriesMinimal(t *testing.T) {
	m := cidrState(t, egressBlock("a", "  - to: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}}, {ipBlock: {cidr: 10.0.0.0/16}}]\n"))
	want := []CIDREntry{
		{Dir: Egress, Prefix: netip.MustParsePrefix("10.0.0.0/8"), Allow: true},
		{Dir: Egress, Prefix: netip.MustParsePrefix("10.1.0.0/16"), Allow: false},
	}
	if !slices.Equal(m.CIDR, want) {
		t.Errorf("CIDR = %v, want %v", m.CIDR, want)
	}
}

// TestCIDRAgainstModel: random CIDR rules over a small address space;
// the longest-prefix tables agree with evaluating every rule directly
// (in the prefix, outside every except, port matching) for every address.
func TestCIDRAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 17))
	randPrefix := func(within netip.Prefix) netip.Prefix {
		bits := within.Bits() + rng.IntN(32-within.Bits()+1)
		if bits > 32 {
			bits = 32
		}
		a := within.Addr().As4()
		v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
		v |= rng.Uint32() & (^uint32(0) >> within.Bits())
		if within.Bits() == 32 {
			v = uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
		}
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), bits).Masked()
	}
	space := netip.MustParsePrefix("10.0.0.0/28") // 16 addresses
	type rule struct {
		sel  *CIDRSelector
		port uint16 // 0: any
	}
	for round := range 200 {
		var rules []rule
		var docs []string
		for i := range 1 + rng.IntN(4) {
			p := randPrefix(netip.PrefixFrom(space.Addr(), 24+rng.IntN(5)))
			s := &CIDRSelector{Prefix: p}
			for range rng.IntN(3) {
				s.Except = append(s.Except, randPrefix(p))
			}
			var port uint16
			if rng.IntN(2) == 0 {
				port = uint16(80 + rng.IntN(2))
			}
			rules = append(rules, rule{s, port})
			var ex []string
			for _, e := range s.Except {
				ex = append(ex, e.String())
			}
			body := fmt.Sprintf("  - to: [{ipBlock: {cidr: %s, except: [%s]}}]\n", p, strings.Join(ex, ", "))
			if port != 0 {
				body += fmt.Sprintf("    ports: [{port: %d}]\n", port)
			}
			docs = append(docs, egressBlock(fmt.Sprintf("p%d", i), body))
		}
		m := cidrState(t, docs...)
		for a := space.Addr(); space.Contains(a); a = a.Next() {
			for _, port := range []uint16{80, 81, 82} {
				want := slices.ContainsFunc(rules, func(r rule) bool {
					if r.port != 0 && r.port != port || !r.sel.Prefix.Contains(a) {
						return false
					}
					return !slices.ContainsFunc(r.sel.Except, func(e netip.Prefix) bool { return e.Contains(a) })
				})
				if got := m.CIDRAllows(a, port, ProtoTCP, Egress); got != want {
					t.Fatalf("round %d: %s:%d allowed = %v, want %v\npolicies:\n%s\nentries %v", round, a, port, got, want, strings.Join(docs, "---\n"), m.CIDR)
				}
			}
		}
	}
}

func TestDiffCIDR(t *testing.T) {
	p := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	from := &MapState{CIDR: []CIDREntry{{Prefix: p("10.0.0.0/8"), Allow: true}, {Prefix: p("10.1.0.0/16")}}}
	to := &MapState{CIDR: []CIDREntry{{Prefix: p("10.0.0.0/8")}, {Prefix: p("10.2.0.0/16"), Allow: true}}}
	up, rm := DiffCIDR(from, to)
	if !slices.Equal(up, to.CIDR) || !slices.Equal(rm, []CIDREntry{{Prefix: p("10.1.0.0/16")}}) {
		t.Errorf("DiffCIDR = %v, %v", up, rm)
	}
	if up, rm := DiffCIDR(nil, to); !slices.Equal(up, to.CIDR) || rm != nil {
		t.Errorf("DiffCIDR(nil, to) = %v, %v", up, rm)
	}
	if !from.Equal(from) || from.Equal(to) {
		t.Error("Equal ignores the CIDR entries")
	}
}
