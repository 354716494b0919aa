package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/membrane-cni/membrane/pkg/domain/service"
)

// lbFrame is an Ethernet frame with an IPv4 or IPv6 header and a TCP
// (SYN) or UDP header plus payload, all checksums correct.
func lbFrame(src, dst netip.AddrPort, proto uint8) []byte {
	payload := []byte("membrane")
	var l4 []byte
	l4 = binary.BigEndian.AppendUint16(l4, src.Port())
	l4 = binary.BigEndian.AppendUint16(l4, dst.Port())
	if proto == service.TCP {
		l4 = append(l4, 0, 0, 0, 1, 0, 0, 0, 0, 5<<4, 0x02, 0xff, 0xff, 0, 0, 0, 0)
	} else {
		l4 = binary.BigEndian.AppendUint16(l4, uint16(8+len(payload)))
		l4 = append(l4, 0, 0)
	}
	l4 = append(l4, payload...)
	csumOff := 6
	if proto == service.TCP {
		csumOff = 16
	}
	binary.BigEndian.PutUint16(l4[csumOff:], l4Checksum(src.Addr(), dst.Addr(), proto, l4))
	b := []byte{0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2}
	if src.Addr().Is4() {
		b = binary.BigEndian.AppendUint16(b, 0x0800)
		ip := []byte{0x45, 0, 0, 0, 0, 1, 0, 0, 64, proto, 0, 0}
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
		ip = append(ip, src.Addr().AsSlice()...)
		ip = append(ip, dst.Addr().AsSlice()...)
		binary.BigEndian.PutUint16(ip[10:], ^fold(sum(ip)))
		return append(append(b, ip...), l4...)
	}
	b = binary.BigEndian.AppendUint16(b, 0x86dd)
	ip := []byte{0x60, 0, 0, 0, 0, 0, proto, 64}
	binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
	ip = append(ip, src.Addr().AsSlice()...)
	ip = append(ip, dst.Addr().AsSlice()...)
	return append(append(b, ip...), l4...)
}

func sum(b []byte) uint32 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	return s
}

func fold(s uint32) uint16 {
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// l4Checksum is the transport checksum over the pseudo-header and l4
// (whose checksum field must be zero).
func l4Checksum(src, dst netip.Addr, proto uint8, l4 []byte) uint16 {
	s := sum(src.AsSlice()) + sum(dst.AsSlice()) + uint32(proto) + uint32(len(l4))
	return ^fold(s + sum(l4))
}

// parsedFrame is what checkFrame read back.
type parsedFrame struct {
	src, dst netip.AddrPort
}

// checkFrame verifies the IP and transport checksums of f and returns
// its addresses and ports.
func checkFrame(t *testing.T, f []byte, proto uint8) parsedFrame {
	t.Helper()
	var src, dst netip.Addr
	var l4 []byte
	if binary.BigEndian.Uint16(f[12:]) == 0x0800 {
		ip := f[14:34]
		if fold(sum(ip)) != 0xffff {
			t.Errorf("IPv4 header checksum wrong: %x", ip)
		}
		src, dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
		l4 = f[34:]
	} else {
		src, dst = netip.AddrFrom16([16]byte(f[22:38])), netip.AddrFrom16([16]byte(f[38:54]))
		l4 = f[54:]
	}
	s := sum(src.AsSlice()) + sum(dst.AsSlice()) + uint32(proto) + uint32(len(l4)) + sum(l4)
	if fold(s) != 0xffff {
		t.Errorf("%s checksum wrong after translation (%s -> %s)", service.ProtoName(proto), src, dst)
	}
	return parsedFrame{
		src: netip.AddrPortFrom(src, binary.BigEndian.Uint16(l4[0:])),
		dst: netip.AddrPortFrom(dst, binary.BigEndian.Uint16(l4[2:])),
	}
}

// TestBPFServiceTranslationChecksums runs the programs on frames to a
// frontend (TCP and UDP, IPv4 and IPv6): from-container rewrites the
// destination to the backend, to-container rewrites the reply's source
// back to the frontend, and every checksum stays correct.
func TestBPFServiceTranslationChecksums(t *testing.T) {
	h := newProgHarness(t, 41, 1000) // the client is the harness's pod (podIP, pod6)
	for _, tc := range []struct {
		name                 string
		client, vip, backend string
		proto                uint8
	}{
		{"tcp4", "10.0.0.10:40000", "10.96.0.10:80", "10.200.0.9:8080", service.TCP},
		{"udp4", "10.0.0.10:40001", "10.96.0.10:53", "10.200.0.9:5353", service.UDP},
		{"tcp6", "[fd00::10]:40002", "[fd00:96::10]:80", "[fd00::9]:8080", service.TCP},
		{"udp6", "[fd00::10]:40003", "[fd00:96::10]:53", "[fd00::9]:5353", service.UDP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, vip, backend := netip.MustParseAddrPort(tc.client), netip.MustParseAddrPort(tc.vip), netip.MustParseAddrPort(tc.backend)
			s := LBService{ID: 7, Frontend: service.Frontend{Addr: vip.Addr(), Port: vip.Port(), Proto: tc.proto},
				Backends: []service.Backend{{Addr: backend.Addr(), Port: backend.Port()}}}
			if err := writeLBService(&h.b.maps.lb, s, 0); err != nil {
				t.Fatal(err)
			}
			out := make([]byte, 256)
			opts := &ebpf.RunOptions{Data: lbFrame(client, vip, tc.proto), DataOut: out}
			if ret, err := h.progs.from.Run(opts); err != nil || ret != verdictPass {
				t.Fatalf("from-container: %d, %v", ret, err)
			}
			got := checkFrame(t, opts.DataOut, tc.proto)
			if got.src != client || got.dst != backend {
				t.Errorf("translated %s -> %s, want %s -> %s", got.src, got.dst, client, backend)
			}
			opts = &ebpf.RunOptions{Data: lbFrame(backend, client, tc.proto), DataOut: make([]byte, 256)}
			if ret, err := h.progs.to.Run(opts); err != nil || ret != verdictPass {
				t.Fatalf("to-container: %d, %v", ret, err)
			}
			got = checkFrame(t, opts.DataOut, tc.proto)
			if got.src != vip || got.dst != client {
				t.Errorf("reply arrives as %s -> %s, want %s -> %s", got.src, got.dst, vip, client)
			}
		})
	}
}
