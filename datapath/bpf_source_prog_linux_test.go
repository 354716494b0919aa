package datapath

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// arpFrame is an Ethernet/IPv4 ARP request from sender spa.
func arpFrame(spa netip.Addr) []byte {
	b := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0, 0, 0, 1, 0x08, 0x06}
	b = append(b, 0, 1, 0x08, 0x00, 6, 4, 0, 1) // Ethernet, IPv4, request
	b = append(b, 0x02, 0, 0, 0, 0, 1)          // sender MAC
	b = append(b, spa.AsSlice()...)             // sender IP
	b = append(b, 0, 0, 0, 0, 0, 0)             // target MAC
	b = append(b, e2eGateway.AsSlice()...)      // target IP
	return append(b, make([]byte, 60-len(b))...)
}

// sourceCase is a frame the pod sends and the verdict it gets.
type sourceCase struct {
	name  string
	frame []byte
	want  uint32
}

func srcPkt(src, dst netip.Addr, proto uint8) []byte {
	return pkt{src: src, dst: dst, proto: proto, sport: 40001, dport: 53}.bytes()
}

var (
	llPod   = netip.MustParseAddr("fe80::10")
	llHost  = netip.MustParseAddr("fe80::1")
	unspec6 = netip.IPv6Unspecified()
	// icmp6 is an ICMPv6 message of type typ from src to a multicast
	// group; ns a neighbour solicitation.
	icmp6 = func(src netip.Addr, typ uint8) []byte {
		return pkt{src: src, dst: netip.MustParseAddr("ff02::1:ff00:1"), proto: policy.ProtoICMPv6, icmpType: typ}.bytes()
	}
	ns = func(src netip.Addr) []byte { return icmp6(src, 135) }
)

// TestBPFSourceCheck: from_container passes what the pod sends from its
// own addresses and drops anything else as invalid-source (counted and
// notified under the endpoint, before policy), for a dual-stack and
// both single-stack endpoints; essential ICMPv6 from a link-local source
// or :: passes, other link-local traffic does not; ARP must carry the
// IPv4 address as sender.
// The other direction is not checked.
func TestBPFSourceCheck(t *testing.T) {
	h := newPolicyHarness(t)
	udp, tcp := policy.ProtoUDP, policy.ProtoTCP
	common := []sourceCase{
		{"ipv6 neighbour solicitation from link-local", ns(llPod), verdictPass},
		{"ipv6 router solicitation from link-local", icmp6(llPod, 133), verdictPass},
		{"ipv6 MLDv2 report from link-local", icmp6(llPod, 143), verdictPass},
		{"ipv6 DAD solicitation from ::", ns(unspec6), verdictPass},
		{"ipv6 udp from link-local", srcPkt(llPod, llHost, udp), verdictDrop},
		{"ipv6 echo from link-local", pkt{src: llPod, dst: llHost, proto: policy.ProtoICMPv6, icmpType: 128}.bytes(), verdictDrop},
		{"ipv6 udp from ::", srcPkt(unspec6, peerA6, udp), verdictDrop},
		{"ipv6 neighbour solicitation from another pod's address", ns(peerA6), verdictDrop},
		{"ipv4 from another pod's address", srcPkt(peerA, worldIP, udp), verdictDrop},
		{"ipv4 from 0.0.0.0", srcPkt(netip.IPv4Unspecified(), netip.MustParseAddr("255.255.255.255"), udp), verdictDrop},
		{"ipv6 from another pod's address", srcPkt(peerA6, pod6, tcp), verdictDrop},
		{"arp from another pod's address", arpFrame(peerA), verdictDrop},
	}
	stacks := []struct {
		name  string
		addrs epAddrs
		cases []sourceCase
	}{
		{"dual-stack", epAddrs{podIP, pod6}, []sourceCase{
			{"ipv4 own", srcPkt(podIP, peerA, udp), verdictPass},
			{"ipv6 own", srcPkt(pod6, peerA6, udp), verdictPass},
			{"arp own", arpFrame(podIP), verdictPass},
		}},
		{"ipv4-only", epAddrs{v4: podIP}, []sourceCase{
			{"ipv4 own", srcPkt(podIP, peerA, udp), verdictPass},
			{"ipv6 without an address", srcPkt(pod6, peerA6, udp), verdictDrop},
			{"arp own", arpFrame(podIP), verdictPass},
		}},
		{"ipv6-only", epAddrs{v6: pod6}, []sourceCase{
			{"ipv6 own", srcPkt(pod6, peerA6, udp), verdictPass},
			{"ipv4 without an address", srcPkt(podIP, peerA, udp), verdictDrop},
			{"arp without an ipv4 address", arpFrame(podIP), verdictDrop},
		}},
	}
	for _, st := range stacks {
		if err := h.b.setEndpointInfo(endpointInfo(h.id, 5000, h.slot, st.addrs), harnessIfindex, 0); err != nil {
			t.Fatal(err)
		}
		for _, tt := range append(st.cases, common...) {
			t.Run(st.name+"/"+tt.name, func(t *testing.T) {
				before := h.invalidSource(t)
				ret, err := h.progs.from.Run(&ebpf.RunOptions{Data: tt.frame})
				if err != nil {
					t.Fatal(err)
				}
				if ret != tt.want {
					t.Fatalf("verdict = %d, want %d", ret, tt.want)
				}
				want := before
				if tt.want == verdictDrop {
					want++
				}
				if got := h.invalidSource(t); got != want {
					t.Fatalf("invalid-source drops %d -> %d, want %d", before, got, want)
				}
			})
		}
	}
	// Traffic to the pod keeps any source.
	if got := h.run(t, policy.Ingress, conn(policy.Ingress, peerA, udp, 53)); got != verdictPass {
		t.Fatalf("ingress verdict = %d, want pass", got)
	}
}

// TestBPFSourceCheckBeforePolicy: a spoofed packet that egress policy
// would allow is dropped as invalid-source, and its notification names
// the endpoint, the forged source and no peer.
func TestBPFSourceCheckBeforePolicy(t *testing.T) {
	h := newPolicyHarness(t)
	h.setPolicy(t, allow(policy.Egress, policy.Key{Dir: policy.Egress}))
	p := pkt{src: peerB, dst: peerA, proto: policy.ProtoTCP, sport: 40001, dport: 8080}
	if got := h.run(t, policy.Egress, p); got != verdictDrop {
		t.Fatalf("spoofed verdict = %d, want drop", got)
	}
	ev := readDrop(t, h.b.events)
	ev.Time = time.Time{}
	want := DropEvent{Endpoint: 42, Reason: DropInvalidSource, Dir: policy.Egress, Src: peerB, Dst: peerA,
		SrcPort: 40001, DstPort: 8080, Proto: policy.ProtoTCP, TCPFlags: tcpSYN, Length: uint32(len(p.bytes()))}
	if ev != want {
		t.Fatalf("drop event = %+v\nwant %+v", ev, want)
	}
	if got := h.run(t, policy.Egress, conn(policy.Egress, peerA, policy.ProtoTCP, 8080)); got != verdictPass {
		t.Fatalf("own source verdict = %d, want pass", got)
	}
}

// invalidSource is the harness endpoint's invalid-source drop count.
func (h *progHarness) invalidSource(t *testing.T) uint64 {
	t.Helper()
	c, err := endpointDropCounters(h.b.maps.drops, h.id)
	if err != nil {
		t.Fatal(err)
	}
	return c[DropKey{Endpoint: h.id, Reason: DropInvalidSource, Dir: policy.Egress}].Packets
}
