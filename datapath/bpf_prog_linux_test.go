package datapath

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// Addresses of the program tests: the endpoint and its peers.
var (
	podIP    = netip.MustParseAddr("10.0.0.10")
	peerA    = netip.MustParseAddr("10.0.1.1")  // identity 1000 (/32)
	peerB    = netip.MustParseAddr("10.0.2.5")  // identity 2000 (10.0.2.0/24)
	worldIP  = netip.MustParseAddr("192.0.2.1") // no entry: world
	pod6     = netip.MustParseAddr("fd00::10")
	peerA6   = netip.MustParseAddr("fd00::1:1") // identity 1000
	identA   = identity.NumericIdentity(1000)
	identB   = identity.NumericIdentity(2000)
	progTest = []struct {
		prefix string
		id     identity.NumericIdentity
	}{
		{"10.0.1.1/32", identA}, {"10.0.2.0/24", identB}, {"fd00::1:1/128", identA},
	}
)

func newPolicyHarness(t testing.TB) *progHarness {
	h := newProgHarness(t, 42, 5000)
	for _, e := range progTest {
		h.ipcache(t, e.prefix, e.id)
	}
	return h
}

// conn is a packet of a new connection between the endpoint and peer:
// from the endpoint for Egress, to it for Ingress.
func conn(dir policy.Direction, peer netip.Addr, proto uint8, dport uint16) pkt {
	pod := podIP
	if peer.Is6() {
		pod = pod6
	}
	p := pkt{src: pod, dst: peer, proto: proto, sport: 40001, dport: dport}
	if proto == policy.ProtoICMP || proto == policy.ProtoICMPv6 {
		p.icmpType, p.dport = 8, 0
		if proto == policy.ProtoICMPv6 {
			p.icmpType = 128
		}
	}
	if dir == policy.Ingress {
		p.src, p.dst = peer, pod
	}
	return p
}

func TestBPFPolicyVerdicts(t *testing.T) {
	tcp, udp, icmp := policy.ProtoTCP, policy.ProtoUDP, policy.ProtoICMP
	in, eg := policy.Ingress, policy.Egress
	tests := []struct {
		name   string
		policy *policy.MapState
		dir    policy.Direction
		pkt    pkt
		want   uint32
	}{
		{"no policy: ingress passes", nil, in, conn(in, peerA, tcp, 8080), verdictPass},
		{"no policy: egress passes", nil, eg, conn(eg, worldIP, udp, 53), verdictPass},
		{"enforcement off: entries irrelevant", policy.NewMapState(1, false, false, nil), in, conn(in, peerB, tcp, 22), verdictPass},
		{"ingress enforced, egress open", policy.NewMapState(1, true, false, nil), eg, conn(eg, peerB, tcp, 22), verdictPass},
		{"exact allow", exact(in), in, conn(in, peerA, tcp, 8080), verdictPass},
		{"exact: other port denied", exact(in), in, conn(in, peerA, tcp, 8081), verdictDrop},
		{"exact: other protocol denied", exact(in), in, conn(in, peerA, udp, 8080), verdictDrop},
		{"exact: other peer denied", exact(in), in, conn(in, peerB, tcp, 8080), verdictDrop},
		{"exact: world denied", exact(in), in, conn(in, worldIP, tcp, 8080), verdictDrop},
		{"default deny egress", policy.NewMapState(1, false, true, nil), eg, conn(eg, peerA, tcp, 80), verdictDrop},
		{"port wildcard", allow(in, policy.Key{Identity: identA, Proto: udp, Dir: in}), in, conn(in, peerA, udp, 9999), verdictPass},
		{"port wildcard: tcp denied", allow(in, policy.Key{Identity: identA, Proto: udp, Dir: in}), in, conn(in, peerA, tcp, 9999), verdictDrop},
		{"L3-only (prefix identity)", allow(in, policy.Key{Identity: identB, Dir: in}), in, conn(in, peerB, tcp, 1), verdictPass},
		{"L3-only allows ICMP", allow(in, policy.Key{Identity: identB, Dir: in}), in, conn(in, peerB, icmp, 0), verdictPass},
		{"any peer on a port", allow(eg, policy.Key{Port: 53, Proto: udp, Dir: eg}), eg, conn(eg, worldIP, udp, 53), verdictPass},
		{"any peer, any port of a proto", allow(eg, policy.Key{Proto: tcp, Dir: eg}), eg, conn(eg, peerB, tcp, 443), verdictPass},
		{"allow all of a direction", allow(eg, policy.Key{Dir: eg}), eg, conn(eg, worldIP, icmp, 0), verdictPass},
		{"world identity entry", allow(eg, policy.Key{Identity: identity.ReservedWorld, Port: 443, Proto: tcp, Dir: eg}), eg, conn(eg, worldIP, tcp, 443), verdictPass},
		{"entry of the other direction does not apply", allow(in, policy.Key{Identity: identA, Port: 8080, Proto: tcp, Dir: eg}), in, conn(in, peerA, tcp, 8080), verdictDrop},
		{"sctp port", allow(in, policy.Key{Identity: identA, Port: 9, Proto: policy.ProtoSCTP, Dir: in}), in, conn(in, peerA, policy.ProtoSCTP, 9), verdictPass},
		{"ipv6 exact", exact(in), in, conn(in, peerA6, tcp, 8080), verdictPass},
		{"ipv6 other port", exact(in), in, conn(in, peerA6, tcp, 8081), verdictDrop},
		{"ipv6 unknown peer is world", allow(eg, policy.Key{Identity: identity.ReservedWorld, Dir: eg}), eg, conn(eg, netip.MustParseAddr("2001:db8::1"), udp, 53), verdictPass},
		{"ipv6 neighbour solicitation passes", policy.NewMapState(1, true, true, nil), in, pkt{src: peerA6, dst: pod6, proto: policy.ProtoICMPv6, icmpType: 135}, verdictPass},
		{"ipv6 router advertisement passes", policy.NewMapState(1, true, true, nil), in, pkt{src: peerA6, dst: pod6, proto: policy.ProtoICMPv6, icmpType: 134}, verdictPass},
		{"ipv6 packet too big passes", policy.NewMapState(1, true, true, nil), in, pkt{src: peerA6, dst: pod6, proto: policy.ProtoICMPv6, icmpType: 2}, verdictPass},
		{"ipv6 destination unreachable passes", policy.NewMapState(1, true, true, nil), eg, pkt{src: pod6, dst: peerA6, proto: policy.ProtoICMPv6, icmpType: 1}, verdictPass},
		{"ipv6 MLDv2 report passes", policy.NewMapState(1, true, true, nil), eg, pkt{src: pod6, dst: peerA6, proto: policy.ProtoICMPv6, icmpType: 143}, verdictPass},
		{"ipv6 echo request is policy-checked", policy.NewMapState(1, true, true, nil), in, pkt{src: peerA6, dst: pod6, proto: policy.ProtoICMPv6, icmpType: 128}, verdictDrop},
		{"ipv6 node information query is policy-checked", policy.NewMapState(1, true, true, nil), in, pkt{src: peerA6, dst: pod6, proto: policy.ProtoICMPv6, icmpType: 139}, verdictDrop},
		{"ARP passes enforced", policy.NewMapState(1, true, true, nil), in, pkt{ethType: 0x0806}, verdictPass},
		{"other L2 passes when open", nil, in, pkt{ethType: 0x88cc}, verdictPass},
		{"other L2 dropped when enforced", policy.NewMapState(1, true, true, nil), eg, pkt{ethType: 0x88cc}, verdictDrop},
		{"bad IPv4 header passes when open", nil, in, pkt{src: peerA, dst: podIP, proto: tcp, badIHL: true}, verdictPass},
		{"bad IPv4 header dropped when enforced", allow(in, policy.Key{Dir: in}), in, pkt{src: peerA, dst: podIP, proto: tcp, badIHL: true}, verdictDrop},
	}
	h := newPolicyHarness(t)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h.setPolicy(t, tt.policy)
			p := tt.pkt
			p.sport = uint16(20000 + i) // a new connection per case
			essential := p.proto == policy.ProtoICMPv6 && icmpv6Essential(p.icmpType)
			if essential {
				p.sport = 0
			}
			if got := h.run(t, tt.dir, p); got != tt.want {
				t.Fatalf("verdict = %d, want %d", got, tt.want)
			}
			if p.ethType == 0 && !p.badIHL && !essential {
				want := verdictPass
				if !tt.policy.Allows(peerIdentity(p, tt.dir), policyPort(p), p.proto, tt.dir) {
					want = verdictDrop
				}
				if want != tt.want {
					t.Fatalf("table says %d but MapState.Allows says %d", tt.want, want)
				}
			}
		})
	}
}

// icmpv6Essential is the ICMPv6 the endpoint programs never drop
// (bpf/endpoint.c's header comment).
func icmpv6Essential(typ uint8) bool {
	return (typ >= 1 && typ <= 4) || (typ >= 130 && typ <= 137) || typ == 143
}

func exact(dir policy.Direction) *policy.MapState {
	return allow(dir, policy.Key{Identity: identA, Port: 8080, Proto: policy.ProtoTCP, Dir: dir})
}

// allow is a policy enforcing dir with keys.
func allow(dir policy.Direction, keys ...policy.Key) *policy.MapState {
	return policy.NewMapState(1, dir == policy.Ingress, dir == policy.Egress, keys)
}

// peerIdentity is the identity the test ipcache gives p's peer.
func peerIdentity(p pkt, dir policy.Direction) identity.NumericIdentity {
	peer := p.src
	if dir == policy.Egress {
		peer = p.dst
	}
	for _, e := range progTest {
		if netip.MustParsePrefix(e.prefix).Contains(peer) {
			return e.id
		}
	}
	return identity.ReservedWorld
}

func policyPort(p pkt) uint16 {
	if p.fragOff != 0 {
		return 0
	}
	switch p.proto {
	case policy.ProtoTCP, policy.ProtoUDP, policy.ProtoSCTP:
		return p.dport
	case policy.ProtoICMP, policy.ProtoICMPv6:
		return policy.ICMPTypePort(p.icmpType)
	}
	return 0
}

func TestBPFConntrackReplies(t *testing.T) {
	h := newPolicyHarness(t)
	// Egress open, ingress default-deny: replies to the endpoint's own
	// connections pass, nothing else comes in.
	h.setPolicy(t, policy.NewMapState(1, true, false, nil))
	for _, proto := range []uint8{policy.ProtoTCP, policy.ProtoUDP, policy.ProtoICMP} {
		out := conn(policy.Egress, peerA, proto, 80)
		if got := h.run(t, policy.Egress, out); got != verdictPass {
			t.Fatalf("proto %d: egress = %d", proto, got)
		}
		if got := h.run(t, policy.Ingress, out.reply()); got != verdictPass {
			t.Fatalf("proto %d: reply = %d, want pass via conntrack", proto, got)
		}
		other := out.reply()
		other.dport++ // not a reply: another port of the endpoint
		if proto == policy.ProtoICMP {
			other.sport++ // another echo identifier
		}
		if got := h.run(t, policy.Ingress, other); got != verdictDrop {
			t.Fatalf("proto %d: unrelated ingress = %d, want drop", proto, got)
		}
	}
	out6 := conn(policy.Egress, peerA6, policy.ProtoTCP, 443)
	if h.run(t, policy.Egress, out6) != verdictPass || h.run(t, policy.Ingress, out6.reply()) != verdictPass {
		t.Fatal("ipv6 reply did not pass via conntrack")
	}
	// Ingress allowed on 8080, egress default-deny: the endpoint's replies
	// pass, its own new connections do not.
	h.setPolicy(t, policy.NewMapState(2, true, true, []policy.Key{{Identity: identA, Port: 8080, Proto: policy.ProtoTCP, Dir: policy.Ingress}}))
	in := conn(policy.Ingress, peerA, policy.ProtoTCP, 8080)
	if got := h.run(t, policy.Ingress, in); got != verdictPass {
		t.Fatalf("allowed ingress = %d", got)
	}
	if got := h.run(t, policy.Egress, in.reply()); got != verdictPass {
		t.Fatalf("endpoint's reply = %d, want pass via conntrack", got)
	}
	if got := h.run(t, policy.Egress, conn(policy.Egress, peerA, policy.ProtoTCP, 8080)); got != verdictDrop {
		t.Fatalf("new egress connection = %d, want drop", got)
	}
	// A policy change applies to the original direction of established
	// connections at once.
	h.setPolicy(t, policy.NewMapState(3, true, true, nil))
	if got := h.run(t, policy.Ingress, in); got != verdictDrop {
		t.Fatalf("established connection after its entry went = %d, want drop", got)
	}
}

func TestBPFFragments(t *testing.T) {
	h := newPolicyHarness(t)
	portOnly := allow(policy.Ingress, policy.Key{Identity: identA, Port: 8080, Proto: policy.ProtoUDP, Dir: policy.Ingress})
	protoWide := allow(policy.Ingress, policy.Key{Identity: identA, Proto: policy.ProtoUDP, Dir: policy.Ingress})
	l3 := allow(policy.Ingress, policy.Key{Identity: identA, Dir: policy.Ingress})
	for _, peer := range []netip.Addr{peerA, peerA6} {
		first := conn(policy.Ingress, peer, policy.ProtoUDP, 8080)
		first.moreFrags = true
		rest := first
		rest.fragOff = 185
		rest.moreFrags = false
		tests := []struct {
			name   string
			policy *policy.MapState
			p      pkt
			want   uint32
		}{
			{"first fragment is an ordinary packet", portOnly, first, verdictPass},
			{"non-first fragment needs more than a port entry", portOnly, rest, verdictDrop},
			{"non-first fragment passes a protocol-wide entry", protoWide, rest, verdictPass},
			{"non-first fragment passes an L3-only entry", l3, rest, verdictPass},
			{"non-first fragment passes when not enforced", nil, rest, verdictPass},
		}
		for _, tt := range tests {
			t.Run(peer.String()+"/"+tt.name, func(t *testing.T) {
				h.setPolicy(t, tt.policy)
				if got := h.run(t, policy.Ingress, tt.p); got != tt.want {
					t.Fatalf("verdict = %d, want %d", got, tt.want)
				}
			})
		}
	}
	c, err := dropCounters(h.b.maps.drops)
	if err != nil {
		t.Fatal(err)
	}
	if got := c[DropKey{Endpoint: 42, Reason: DropFragment, Dir: policy.Ingress}].Packets; got != 2 {
		t.Fatalf("fragment drops = %d, want 2 (IPv4 and IPv6)", got)
	}
}

func TestBPFDropCountersAndNotifications(t *testing.T) {
	h := newPolicyHarness(t)
	h.setPolicy(t, exact(policy.Ingress))
	p := conn(policy.Ingress, peerA, policy.ProtoTCP, 8081)
	p.sport = 31337
	for range 3 {
		if got := h.run(t, policy.Ingress, p); got != verdictDrop {
			t.Fatalf("verdict = %d", got)
		}
	}
	if got := h.run(t, policy.Ingress, conn(policy.Ingress, peerA, policy.ProtoTCP, 8080)); got != verdictPass {
		t.Fatalf("allowed verdict = %d", got)
	}
	c, err := dropCounters(h.b.maps.drops)
	if err != nil {
		t.Fatal(err)
	}
	got := c[DropKey{Endpoint: 42, Reason: DropPolicy, Dir: policy.Ingress}]
	if got.Packets != 3 || got.Bytes != 3*uint64(len(p.bytes())) {
		t.Fatalf("policy drops = %+v, want 3 packets of %d bytes", got, len(p.bytes()))
	}
	entries, ingress, egress, err := dumpPolicyMap(h.pm)
	if err != nil || !ingress || egress || len(entries) != 1 || entries[0].Packets != 1 {
		t.Fatalf("policy dump = %+v in=%v eg=%v err=%v, want the 8080 entry with one packet", entries, ingress, egress, err)
	}
	ev := readDrop(t, h.b.events)
	want := DropEvent{Endpoint: 42, Reason: DropPolicy, Dir: policy.Ingress, Src: peerA, Dst: podIP,
		SrcPort: 31337, DstPort: 8081, Proto: policy.ProtoTCP, TCPFlags: tcpSYN, PeerIdentity: identA, Length: uint32(len(p.bytes()))}
	ev.Time = time.Time{}
	if ev != want {
		t.Fatalf("drop event = %+v\nwant %+v", ev, want)
	}
	if err := deleteDropCounters(h.b.maps.drops, 42); err != nil {
		t.Fatal(err)
	}
	if c, _ := dropCounters(h.b.maps.drops); len(c) != 0 {
		t.Fatalf("drop counters after delete = %v", c)
	}
}

// readDrop reads one drop notification (waiting at most 5 s).
func readDrop(t *testing.T, rd *ringbuf.Reader) DropEvent {
	t.Helper()
	rd.SetDeadline(time.Now().Add(5 * time.Second))
	defer rd.SetDeadline(time.Time{})
	rec, err := rd.Read()
	if err != nil {
		t.Fatalf("read drop notification: %v", err)
	}
	ev, ok := decodeDrop(rec.RawSample)
	if !ok {
		t.Fatalf("undecodable drop notification %x", rec.RawSample)
	}
	return ev
}

// TestBPFMatchesMapState compares the kernel's verdicts with
// policy.MapState.Allows on random policies and packets.
func TestBPFMatchesMapState(t *testing.T) {
	h := newPolicyHarness(t)
	rng := rand.New(rand.NewPCG(4, uint64(time.Now().UnixNano())))
	peers := []netip.Addr{peerA, peerB, worldIP}
	idents := []identity.NumericIdentity{0, identA, identB, identity.ReservedWorld}
	protos := []uint8{policy.ProtoTCP, policy.ProtoUDP, policy.ProtoSCTP, policy.ProtoICMP}
	ports := []uint16{53, 80, 8080}
	// Echo requests and replies: their id tells flows apart (another
	// type's flows with one peer are one conntrack entry).
	icmpTypes := []uint8{0, 8}
	randKeys := func(n int) []policy.Key {
		var keys []policy.Key
		for range n {
			k := policy.Key{Identity: idents[rng.IntN(len(idents))], Dir: policy.Direction(rng.IntN(2))}
			if rng.IntN(3) > 0 {
				k.Proto = protos[rng.IntN(len(protos))]
				if rng.IntN(2) == 0 {
					k.Port = ports[rng.IntN(len(ports))]
					if k.Proto == policy.ProtoICMP {
						k.Port = policy.ICMPTypePort(icmpTypes[rng.IntN(len(icmpTypes))])
					}
				}
			}
			keys = append(keys, k)
		}
		return keys
	}
	for round := range 80 {
		ms := policy.NewMapState(uint64(round), rng.IntN(2) == 0, rng.IntN(2) == 0, randKeys(rng.IntN(6)))
		if round%2 == 1 {
			// Deny entries (ingressDeny, egressDeny), and the allows
			// they turn into denies.
			ms = ms.WithDeny(randKeys(1 + rng.IntN(3)))
		}
		h.setPolicy(t, ms)
		for i := range 25 {
			dir := policy.Direction(rng.IntN(2))
			proto := protos[rng.IntN(len(protos))]
			p := conn(dir, peers[rng.IntN(len(peers))], proto, ports[rng.IntN(len(ports))])
			// Source ports never seen as a reversed tuple: no packet is
			// a reply of another.
			p.sport = uint16(40000 + 10000*int(dir) + round*25 + i)
			if proto == policy.ProtoICMP {
				p.dport = 0
				// An echo reply (0) is a reply only to an echo the
				// endpoint saw: here it is a new flow too.
				p.icmpType = icmpTypes[rng.IntN(len(icmpTypes))]
			}
			want := verdictDrop
			if ms.Allows(peerIdentity(p, dir), policyPort(p), proto, dir) {
				want = verdictPass
			}
			if got := h.run(t, dir, p); got != want {
				t.Fatalf("round %d: policy %+v, %s packet %+v: kernel %d, MapState %d", round, ms, dir, p, got, want)
			}
		}
	}
}

func TestBPFPolicySyncRejectsReserved(t *testing.T) {
	h := newPolicyHarness(t)
	bad := []policy.Key{
		{Identity: identity.NumericIdentity(enforceIdentity), Dir: policy.Ingress},
		{Identity: identA, Port: 80, Dir: policy.Ingress},
	}
	for _, k := range bad {
		err := syncPolicyMap(h.pm, h.cm, policyTarget{noPolicy, nil}, policyTarget{policy.NewMapState(1, true, false, []policy.Key{k}), nil})
		if !errors.Is(err, ErrInvalidPolicy) {
			t.Fatalf("sync of %+v = %v, want ErrInvalidPolicy", k, err)
		}
	}
}
