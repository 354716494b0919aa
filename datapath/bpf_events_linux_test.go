package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"unsafe"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

func encodeDrop(t testing.TB, e bpf.EndpointDropEvent) []byte {
	b, err := binary.Append(nil, binary.NativeEndian, &e)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeDrop(t *testing.T) {
	var e bpf.EndpointDropEvent
	e.Ep, e.Reason, e.Dir, e.Family, e.Proto, e.Sport, e.Dport, e.PeerIdentity = 7, 1, 1, 6, 6, 1234, 80, 2
	e.Saddr = addrWords(netip.MustParseAddr("fd00::1").As16())
	e.Daddr = addrWords(netip.MustParseAddr("2001:db8::2").As16())
	ev, ok := decodeDrop(encodeDrop(t, e))
	if !ok || ev.Endpoint != 7 || ev.Reason != DropPolicy || ev.Dir != policy.Egress ||
		ev.Src != netip.MustParseAddr("fd00::1") || ev.Dst != netip.MustParseAddr("2001:db8::2") || ev.DstPort != 80 {
		t.Fatalf("decoded %+v, %v", ev, ok)
	}
	if _, ok := decodeDrop(make([]byte, unsafe.Sizeof(e)-1)); ok {
		t.Fatal("decoded a short record")
	}
	e.Reason, e.Family = 99, 0
	if ev, ok := decodeDrop(encodeDrop(t, e)); !ok || ev.Reason != "reason-99" || ev.Src.IsValid() {
		t.Fatalf("unknown reason, non-IP: %+v", ev)
	}
}

// FuzzDecodeDrop: any ring-buffer record decodes without panicking, and
// addresses are only set for the two IP families.
func FuzzDecodeDrop(f *testing.F) {
	var e bpf.EndpointDropEvent
	e.Family = 4
	f.Add(encodeDrop(f, e))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, raw []byte) {
		ev, ok := decodeDrop(raw)
		if !ok {
			return
		}
		if ev.Src.IsValid() != ev.Dst.IsValid() || (ev.Src.IsValid() && ev.Src.Is4() != ev.Dst.Is4()) {
			t.Fatalf("inconsistent addresses %v %v", ev.Src, ev.Dst)
		}
	})
}
