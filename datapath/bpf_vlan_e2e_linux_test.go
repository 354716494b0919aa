package datapath

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestBPFTaggedFramesDropped: a pod writes Ethernet frames itself on an
// AF_PACKET socket (CAP_NET_RAW, a container runtime's default). An
// untagged IPv4 frame from its own address arrives at the target (the
// frames are well formed). The same datagram from another pod's address
// inside a QinQ frame (802.1ad then 802.1Q, both VLAN 0: the host veth
// pulls the outer tag off before TC, so TC sees an 802.1Q ethertype,
// and the kernel strips both priority tags after TC and delivers the
// IPv4 packet), inside two 802.1Q tags, inside one 802.1Q tag, and an
// IPv6 one inside QinQ, is dropped by from_container as unknown-l3,
// counted and notified under the pod's endpoint, and never arrives;
// so are tagged frames from the pod's own address and an LLDP frame,
// with egress not enforced.
func TestBPFTaggedFramesDropped(t *testing.T) {
	for _, tcx := range []bool{false, true} {
		t.Run(map[bool]string{false: "tc", true: "tcx"}[tcx], func(t *testing.T) { testTaggedFrames(t, tcx) })
	}
}

func testTaggedFrames(t *testing.T, tcx bool) {
	e := newSrcEnv(t, LinuxConfig{EndpointTCX: tcx})
	p := e.dual
	own4, own6 := p.ep.IPv4, p.ep.IPv6
	qinq, dot1q := []uint16{testutil.TPID8021AD, testutil.TPID8021Q}, []uint16{testutil.TPID8021Q}
	payload := e.sendFrame(p, nil, own4)
	testutil.Eventually(t, payload+" (untagged, own source, raw socket) at the target", func() bool { ok, _ := e.sink.received(payload); return ok })
	for _, c := range []struct {
		name string
		tags []uint16
		src  netip.Addr
	}{
		{"qinq-spoofed", qinq, e.v4.ep.IPv4},
		{"two-8021q-spoofed", []uint16{testutil.TPID8021Q, testutil.TPID8021Q}, e.v4.ep.IPv4},
		{"8021q-spoofed", dot1q, e.v4.ep.IPv4},
		{"qinq-spoofed-ipv6", qinq, e.v6.ep.IPv6},
		{"qinq-own", qinq, own4},
		{"8021q-own", dot1q, own4},
		{"8021q-own-ipv6", dot1q, own6},
	} {
		if err := e.frameDropped(p, c.tags, c.src); err != nil {
			t.Errorf("%s: %v", c.name, err) // every case reports
		}
	}
	before := e.dropCount(p.ep.ID, DropUnknownL3, policy.Egress)
	lldp := testutil.Frame(net.HardwareAddr{0x01, 0x80, 0xc2, 0, 0, 0x0e}, podMAC(t, p), nil, testutil.EtherTypeLLDP, make([]byte, 46))
	if err := testutil.SendFrame(p.ns, "eth0", lldp); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the LLDP frame's unknown-l3 drop", func() bool { return e.dropCount(p.ep.ID, DropUnknownL3, policy.Egress) > before })
}

// sendFrame writes a UDP datagram from src to the target's address of
// its family on the pod's raw socket, inside VLAN tags (outermost
// first), and returns its payload.
func (e *srcEnv) sendFrame(p *stackPod, tags []uint16, src netip.Addr) string {
	e.t.Helper()
	e.n++
	payload := fmt.Sprintf("frame-%d-%s-%x", e.n, src, tags)
	ip := testutil.UDPPacket(src, e.dstAddr(src), 40000, uint16(e.sink.port), []byte(payload))
	etype := uint16(testutil.EtherTypeIPv4)
	if src.Is6() {
		etype = testutil.EtherTypeIPv6
	}
	frame := testutil.Frame(p.host.Attrs().HardwareAddr, podMAC(e.t, p), tags, etype, ip)
	if err := testutil.SendFrame(p.ns, "eth0", frame); err != nil {
		e.t.Fatal(err)
	}
	return payload
}

// frameDropped sends a tagged frame (sendFrame) that from_container
// must drop as unknown-l3: counted and notified under p's endpoint, and
// never delivered (a datagram from p's own address sent after the drop
// arrives alone). Delivered, or no drop counted within the bound, is an
// error.
func (e *srcEnv) frameDropped(p *stackPod, tags []uint16, src netip.Addr) error {
	e.t.Helper()
	before := e.dropCount(p.ep.ID, DropUnknownL3, policy.Egress)
	payload := e.sendFrame(p, tags, src)
	for deadline := time.Now().Add(10 * time.Second); e.dropCount(p.ep.ID, DropUnknownL3, policy.Egress) <= before; {
		if ok, got := e.sink.received(payload); ok {
			return fmt.Errorf("tagged frame %q delivered (target got %q)", payload, got)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("tagged frame %q neither delivered nor counted as unknown-l3", payload)
		}
		time.Sleep(10 * time.Millisecond)
	}
	testutil.Eventually(e.t, fmt.Sprintf("an unknown-l3 drop event of endpoint %d", p.ep.ID), func() bool {
		e.drops.mu.Lock()
		defer e.drops.mu.Unlock()
		for _, ev := range e.drops.events {
			if ev.Endpoint == p.ep.ID && ev.Reason == DropUnknownL3 && ev.Dir == policy.Egress {
				return true
			}
		}
		return false
	})
	e.mustPass(p, p.ep.IPv4)
	if ok, got := e.sink.received(payload); ok {
		return fmt.Errorf("tagged frame %q delivered after its drop was counted (target got %q)", payload, got)
	}
	return nil
}

// podMAC is the pod's eth0 hardware address.
func podMAC(t *testing.T, p *stackPod) net.HardwareAddr {
	t.Helper()
	l, err := p.ns.Netlink(t).LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().HardwareAddr
}
