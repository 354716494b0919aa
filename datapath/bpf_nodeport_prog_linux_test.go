package datapath

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/service"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// bpf/nodeport.h's NAT port range.
const (
	natPortMin   = 61000
	natPortCount = 4536
)

// TestBPFNodePortNATPorts runs from_netdev (BPF_PROG_TEST_RUN) on SYNs to
// a NodePort whose backend is remote: the first is DNATed and SNATed to
// the frontend's address with a port of the NAT range (checksums
// correct); with every NAT port held by live connections a new one is
// dropped as nat-exhausted; ports whose connections saw only a FIN 2 s
// ago stay held, ports whose connections saw an RST 2 s ago are reused.
func TestBPFNodePortNATPorts(t *testing.T) {
	testutil.RequireRoot(t)
	b, err := openBPF(LinuxConfig{BPFFS: testutil.BPFFSDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.close)
	progs, err := loadNetdev(b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(progs.close)
	prog := progs.from
	fe := netip.MustParseAddrPort("192.168.93.1:30080")
	be := netip.MustParseAddrPort("10.244.61.130:8080")
	s := LBService{ID: 9, External: true, Frontend: service.Frontend{Addr: fe.Addr(), Port: fe.Port(), Proto: service.TCP},
		Backends: []service.Backend{{Addr: be.Addr(), Port: be.Port()}}}
	if err := writeLBService(&b.maps.lb, s, 0); err != nil {
		t.Fatal(err)
	}
	// syn runs a SYN from client port cport and returns the translated
	// frame's source (the NAT address and port).
	syn := func(cport uint16) parsedFrame {
		t.Helper()
		out := make([]byte, 256)
		opts := &ebpf.RunOptions{Data: lbFrame(netip.AddrPortFrom(netip.MustParseAddr("192.168.93.2"), cport), fe, service.TCP), DataOut: out}
		if _, err := prog.Run(opts); err != nil {
			t.Fatal(err)
		}
		return checkFrame(t, opts.DataOut, service.TCP)
	}
	got := syn(40000)
	if got.dst != be || got.src.Addr() != fe.Addr() || got.src.Port() < natPortMin || int(got.src.Port()) >= natPortMin+natPortCount {
		t.Fatalf("first SYN translated to %s -> %s, want %s:<NAT port> -> %s", got.src, got.dst, fe.Addr(), be)
	}
	// Every NAT port held by a live connection of another client.
	key := func(port uint16) bpf.EndpointLbTuple {
		return bpf.EndpointLbTuple{Saddr: addrWords(addr16(be.Addr())), Daddr: addrWords(addr16(fe.Addr())),
			Sport: htons(be.Port()), Dport: htons(port), Proto: service.TCP, Family: familyV4}
	}
	held := func(closing uint32, age time.Duration) bpf.EndpointLbNatrevValue {
		return bpf.EndpointLbNatrevValue{LastSeen: ktimeNow() - uint64(age), Client: addrWords(addr16(netip.MustParseAddr("10.9.9.9"))),
			Frontend: addrWords(addr16(fe.Addr())), ClientPort: htons(1), FrontendPort: htons(fe.Port()), Closing: closing}
	}
	holdAll := func(closing uint32, age time.Duration) {
		t.Helper()
		for p := natPortMin; p < natPortMin+natPortCount; p++ {
			if err := b.maps.lb.natRev.Update(key(uint16(p)), held(closing, age), ebpf.UpdateAny); err != nil {
				t.Fatal(err)
			}
		}
	}
	holdAll(0, 0)
	exhausted := func() uint64 {
		var v bpf.EndpointDropValue
		if err := b.maps.drops.Lookup(bpf.EndpointDropKey{Ep: 0, Reason: 17, Dir: 0}, &v); err != nil {
			return 0
		}
		return v.Packets
	}
	before := exhausted()
	syn(40001)
	if exhausted() != before+1 {
		t.Fatalf("nat-exhausted drops %d -> %d with every NAT port held, want one more", before, exhausted())
	}
	// Ports whose connections saw a FIN 2 s ago stay held (10 s); ports
	// whose connections saw an RST 2 s ago are free (1 s).
	holdAll(1, 2*time.Second)
	syn(40002)
	if exhausted() != before+2 {
		t.Fatal("a NAT port 2 s after a FIN was reused, want it held 10 s")
	}
	holdAll(2, 2*time.Second)
	if got := syn(40003); got.src.Addr() != fe.Addr() || got.src.Port() < natPortMin || exhausted() != before+2 {
		t.Fatalf("SYN with the NAT ports freed by RSTs: translated from %s (nat-exhausted %d), want a NAT port", got.src, exhausted()-before)
	}
}
