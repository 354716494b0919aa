package datapath

import (
	"encoding/binary"
	"net/netip"

	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// pkt describes a crafted test packet.
type pkt struct {
	src, dst     netip.Addr
	proto        uint8
	sport, dport uint16 // ICMP echo: sport is the identifier
	icmpType     uint8  // ICMP/ICMPv6 type
	fragOff      uint16 // fragment offset in 8-byte units; non-zero: non-first fragment
	moreFrags    bool
	ethType      uint16 // non-zero: a non-IP frame of this EtherType
	badIHL       bool   // IPv4 header length field below 5 (malformed)
}

// reply is p's reply (addresses and ports swapped).
func (p pkt) reply() pkt {
	p.src, p.dst = p.dst, p.src
	if p.proto != policy.ProtoICMP && p.proto != policy.ProtoICMPv6 { // echo keeps its identifier
		p.sport, p.dport = p.dport, p.sport
	}
	if p.proto == policy.ProtoICMP && p.icmpType == 8 {
		p.icmpType = 0
	}
	if p.proto == policy.ProtoICMPv6 && p.icmpType == 128 {
		p.icmpType = 129
	}
	return p
}

// bytes renders the Ethernet frame.
func (p pkt) bytes() []byte {
	b := make([]byte, 0, 128)
	b = append(b, 0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2)
	if p.ethType != 0 {
		b = binary.BigEndian.AppendUint16(b, p.ethType)
		return append(b, make([]byte, 46)...)
	}
	l4 := p.l4()
	if p.src.Is4() {
		b = binary.BigEndian.AppendUint16(b, 0x0800)
		flags := p.fragOff & 0x1fff
		if p.moreFrags {
			flags |= 0x2000
		}
		vihl := byte(0x45)
		if p.badIHL {
			vihl = 0x43
		}
		b = append(b, vihl, 0)
		b = binary.BigEndian.AppendUint16(b, uint16(20+len(l4)))
		b = append(b, 0, 1)
		b = binary.BigEndian.AppendUint16(b, flags)
		b = append(b, 64, p.proto, 0, 0)
		b = append(b, p.src.AsSlice()...)
		b = append(b, p.dst.AsSlice()...)
	} else {
		b = binary.BigEndian.AppendUint16(b, 0x86dd)
		nh := p.proto
		ext := []byte(nil)
		if p.fragOff != 0 || p.moreFrags {
			nh = 44
			off := p.fragOff << 3
			if p.moreFrags {
				off |= 1
			}
			ext = append(ext, p.proto, 0)
			ext = binary.BigEndian.AppendUint16(ext, off)
			ext = append(ext, 0, 0, 0, 7)
		}
		b = append(b, 0x60, 0, 0, 0)
		b = binary.BigEndian.AppendUint16(b, uint16(len(ext)+len(l4)))
		b = append(b, nh, 64)
		b = append(b, p.src.AsSlice()...)
		b = append(b, p.dst.AsSlice()...)
		b = append(b, ext...)
	}
	b = append(b, l4...)
	for len(b) < 60 {
		b = append(b, 0)
	}
	return b
}

func (p pkt) l4() []byte {
	if p.fragOff != 0 {
		return []byte{0xde, 0xad, 0xbe, 0xef, 0xde, 0xad, 0xbe, 0xef}
	}
	var b []byte
	switch p.proto {
	case policy.ProtoTCP:
		b = binary.BigEndian.AppendUint16(b, p.sport)
		b = binary.BigEndian.AppendUint16(b, p.dport)
		b = append(b, 0, 0, 0, 1, 0, 0, 0, 0, 5<<4, 0x02, 0xff, 0xff, 0, 0, 0, 0)
	case policy.ProtoUDP, policy.ProtoSCTP:
		b = binary.BigEndian.AppendUint16(b, p.sport)
		b = binary.BigEndian.AppendUint16(b, p.dport)
		b = append(b, 0, 8, 0, 0)
	case policy.ProtoICMP, policy.ProtoICMPv6:
		b = append(b, p.icmpType, 0, 0, 0)
		b = binary.BigEndian.AppendUint16(b, p.sport)
		b = append(b, 0, 1)
	default:
		b = make([]byte, 8)
	}
	return b
}
