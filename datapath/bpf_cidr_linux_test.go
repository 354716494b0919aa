package datapath

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// cidrPolicy is a policy enforcing dir with CIDR entries only.
func cidrPolicy(dir policy.Direction, entries ...policy.CIDREntry) *policy.MapState {
	m := allow(dir)
	m.CIDR = slices.Clone(entries)
	slices.SortFunc(m.CIDR, policy.CompareCIDR)
	return m
}

func cidrAllow(dir policy.Direction, prefix string, proto uint8, port uint16, ok bool) policy.CIDREntry {
	return policy.CIDREntry{Dir: dir, Proto: proto, Port: port, Prefix: netip.MustParsePrefix(prefix), Allow: ok}
}

// TestBPFCIDRVerdicts: CIDR entries decide on the peer's address, also
// an address the ipcache gives a pod identity; an except entry (a
// longer deny) carves out exactly; groups are tried exact, port
// wildcard, any protocol. Every case agrees with MapState.AllowsAddr.
func TestBPFCIDRVerdicts(t *testing.T) {
	tcp, udp := policy.ProtoTCP, policy.ProtoUDP
	in, eg := policy.Ingress, policy.Egress
	carve := cidrPolicy(eg, cidrAllow(eg, "10.0.0.0/16", 0, 0, true), cidrAllow(eg, "10.0.2.0/24", 0, 0, false))
	tests := []struct {
		name   string
		policy *policy.MapState
		dir    policy.Direction
		pkt    pkt
		want   uint32
	}{
		{"0.0.0.0/0 allows a pod's address", cidrPolicy(eg, cidrAllow(eg, "0.0.0.0/0", 0, 0, true)), eg, conn(eg, peerA, tcp, 80), verdictPass},
		{"0.0.0.0/0 allows the world", cidrPolicy(eg, cidrAllow(eg, "0.0.0.0/0", 0, 0, true)), eg, conn(eg, worldIP, udp, 53), verdictPass},
		{"0.0.0.0/0 is not IPv6", cidrPolicy(eg, cidrAllow(eg, "0.0.0.0/0", 0, 0, true)), eg, conn(eg, peerA6, tcp, 80), verdictDrop},
		{"a pod's /32 admits it", cidrPolicy(in, cidrAllow(in, "10.0.1.1/32", 0, 0, true)), in, conn(in, peerA, tcp, 80), verdictPass},
		{"a pod's /32 does not admit its neighbour", cidrPolicy(in, cidrAllow(in, "10.0.1.1/32", 0, 0, true)), in, conn(in, netip.MustParseAddr("10.0.1.2"), tcp, 80), verdictDrop},
		{"inside the prefix, outside the except", carve, eg, conn(eg, peerA, tcp, 80), verdictPass},
		{"inside the except", carve, eg, conn(eg, peerB, tcp, 80), verdictDrop},
		{"outside the prefix", carve, eg, conn(eg, worldIP, tcp, 80), verdictDrop},
		{"exact group", cidrPolicy(eg, cidrAllow(eg, "10.0.0.0/8", tcp, 80, true)), eg, conn(eg, peerB, tcp, 80), verdictPass},
		{"exact group: other port", cidrPolicy(eg, cidrAllow(eg, "10.0.0.0/8", tcp, 80, true)), eg, conn(eg, peerB, tcp, 81), verdictDrop},
		{"exact group: other protocol", cidrPolicy(eg, cidrAllow(eg, "10.0.0.0/8", tcp, 80, true)), eg, conn(eg, peerB, udp, 80), verdictDrop},
		{"port wildcard group", cidrPolicy(eg, cidrAllow(eg, "10.0.0.0/8", udp, 0, true)), eg, conn(eg, peerB, udp, 9999), verdictPass},
		{"a deny of the exact group does not hide the any group",
			cidrPolicy(eg, cidrAllow(eg, "10.0.0.0/8", tcp, 80, true), cidrAllow(eg, "10.0.2.0/24", tcp, 80, false), cidrAllow(eg, "10.0.2.5/32", 0, 0, true)),
			eg, conn(eg, peerB, tcp, 80), verdictPass},
		{"the other direction does not apply", cidrPolicy(in, cidrAllow(eg, "0.0.0.0/0", 0, 0, true)), in, conn(in, peerA, tcp, 80), verdictDrop},
		{"ipv6 prefix", cidrPolicy(in, cidrAllow(in, "fd00::/64", 0, 0, true)), in, conn(in, peerA6, tcp, 80), verdictPass},
		{"identity or address: identity entry", func() *policy.MapState {
			m := exact(in)
			m.CIDR = []policy.CIDREntry{cidrAllow(in, "10.0.2.0/24", 0, 0, true)}
			return m
		}(), in, conn(in, peerA, tcp, 8080), verdictPass},
		{"identity or address: address entry", func() *policy.MapState {
			m := exact(in)
			m.CIDR = []policy.CIDREntry{cidrAllow(in, "10.0.2.0/24", 0, 0, true)}
			return m
		}(), in, conn(in, peerB, tcp, 22), verdictPass},
	}
	h := newPolicyHarness(t)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h.setPolicy(t, tt.policy)
			p := tt.pkt
			p.sport = uint16(30000 + i)
			if got := h.run(t, tt.dir, p); got != tt.want {
				t.Fatalf("verdict = %d, want %d", got, tt.want)
			}
			want := verdictPass
			if !tt.policy.AllowsAddr(peerIdentity(p, tt.dir), peerAddr(p, tt.dir), policyPort(p), p.proto, tt.dir) {
				want = verdictDrop
			}
			if want != tt.want {
				t.Fatalf("table says %d but MapState.AllowsAddr says %d", tt.want, want)
			}
		})
	}
}

func peerAddr(p pkt, dir policy.Direction) netip.Addr {
	if dir == policy.Egress {
		return p.dst
	}
	return p.src
}

// TestBPFCIDRRandom: random CIDR policies compiled by the policy package
// and changed in place by difference (syncCIDRMap); the programs'
// verdict equals MapState.AllowsAddr for every address of a small
// range, and the map reads back as the policy.
func TestBPFCIDRRandom(t *testing.T) {
	h := newPolicyHarness(t)
	rng := rand.New(rand.NewPCG(7, 17))
	sport := uint16(1000)
	for round := range 40 {
		r := policy.NewRepository()
		r.UpsertIdentity(300, labels.Labels{{Source: labels.SourceK8s, Key: policy.NamespaceLabel, Value: "x"}})
		r.MapState(300)
		var docs string
		for i := range 1 + rng.IntN(3) {
			bits := 26 + rng.IntN(7)
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 1, byte(rng.IntN(16))}), bits).Masked()
			ex := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 1, byte(rng.IntN(16))}), min(32, bits+1+rng.IntN(3))).Masked()
			except := ""
			if p.Contains(ex.Addr()) && rng.IntN(2) == 0 {
				except = ", except: [" + ex.String() + "]"
			}
			ports := ""
			if rng.IntN(2) == 0 {
				ports = fmt.Sprintf("\n    ports: [{port: %d}]", 80+rng.IntN(2))
			}
			docs += fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p%d, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: %s%s}}]%s
---
`, i, p, except, ports)
		}
		if round%2 == 1 {
			// CIDR deny entries over the allows, and over an allow of
			// any peer (whose entry the denies must beat).
			bits := 26 + rng.IntN(7)
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 1, byte(rng.IntN(16))}), bits).Masked()
			ex := netip.PrefixFrom(p.Addr(), min(32, bits+1+rng.IntN(3))).Masked()
			anyPeer := ""
			if rng.IntN(2) == 0 {
				anyPeer = "  egress: [{}]\n"
			}
			docs += fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: deny, namespace: x}
spec:
  endpointSelector: {}
%s  egressDeny:
  - toCIDRSet: [{cidr: %s, except: [%s]}]
    toPorts: [{ports: [{port: "%d", protocol: TCP}]}]
`, anyPeer, p, ex, 80+rng.IntN(2))
		}
		pols, err := policy.Parse([]byte(docs))
		if err != nil {
			t.Fatal(err)
		}
		r.Import(pols)
		ms := r.MapState(300)
		h.setPolicy(t, ms)
		got, _, err := realisedState(h.pm, h.cm)
		if err != nil || !slices.Equal(got.CIDR, ms.CIDR) || !slices.Equal(got.Allow, ms.Allow) || !slices.Equal(got.Deny, ms.Deny) {
			t.Fatalf("round %d: read back %v (%v), want %v", round, got, err, ms)
		}
		for a := netip.MustParseAddr("10.0.1.0"); a.As4()[3] < 16; a = a.Next() {
			for _, port := range []uint16{80, 81} {
				sport++
				p := conn(policy.Egress, a, policy.ProtoTCP, port)
				p.sport = sport
				want := verdictDrop
				if ms.AllowsAddr(peerIdentity(p, policy.Egress), a, port, policy.ProtoTCP, policy.Egress) {
					want = verdictPass
				}
				if v := h.run(t, policy.Egress, p); v != want {
					t.Fatalf("round %d: %s:%d verdict %d, want %d\n%s\nentries %v", round, a, port, v, want, docs, ms.CIDR)
				}
			}
		}
	}
}
