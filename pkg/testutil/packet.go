package testutil

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// Ethertypes and VLAN tag protocol identifiers for Frame.
const (
	EtherTypeIPv4 = 0x0800
	EtherTypeIPv6 = 0x86dd
	EtherTypeLLDP = 0x88cc
	TPID8021Q     = 0x8100 // 802.1Q (a C-tag)
	TPID8021AD    = 0x88a8 // 802.1ad (an S-tag, QinQ's outer)
)

const (
	vxlanFlagVNI  = 0x08 // the VXLAN header's I flag: the VNI is valid
	ipProtoUDP    = 17
	ipv4HeaderLen = 20
	udpHeaderLen  = 8
)

// Frame builds an Ethernet frame: dst, src, one VLAN tag per entry of
// tags (its TPID, outermost first, with TCI 0: priority tags, VLAN 0),
// etherType and payload.
func Frame(dst, src net.HardwareAddr, tags []uint16, etherType uint16, payload []byte) []byte {
	b := append(append([]byte{}, dst...), src...)
	for _, tpid := range tags {
		b = binary.BigEndian.AppendUint16(b, tpid)
		b = binary.BigEndian.AppendUint16(b, 0)
	}
	b = binary.BigEndian.AppendUint16(b, etherType)
	return append(b, payload...)
}

// UDPPacket builds an IP packet (IPv4 or IPv6 by src's family; dst must
// be of the same) carrying a UDP datagram, with valid checksums.
func UDPPacket(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	udp := binary.BigEndian.AppendUint16(nil, sport)
	udp = binary.BigEndian.AppendUint16(udp, dport)
	udp = binary.BigEndian.AppendUint16(udp, uint16(udpHeaderLen+len(payload)))
	udp = append(binary.BigEndian.AppendUint16(udp, 0), payload...)
	// The pseudo-header: addresses, protocol, UDP length.
	pseudo := append(src.AsSlice(), dst.AsSlice()...)
	pseudo = append(pseudo, 0, ipProtoUDP)
	pseudo = binary.BigEndian.AppendUint16(pseudo, uint16(len(udp)))
	sum := checksum(append(pseudo, udp...))
	if sum == 0 {
		sum = 0xffff // 0 means "no checksum" (and is invalid over IPv6)
	}
	binary.BigEndian.PutUint16(udp[6:], sum)
	if src.Is4() {
		return append(ipv4Header(src, dst, len(udp)), udp...)
	}
	h := []byte{0x60, 0, 0, 0}
	h = binary.BigEndian.AppendUint16(h, uint16(len(udp)))
	h = append(h, ipProtoUDP, 64)
	h = append(append(h, src.AsSlice()...), dst.AsSlice()...)
	return append(h, udp...)
}

// ipv4Header is a 20-byte IPv4 header for a UDP payload of n bytes.
func ipv4Header(src, dst netip.Addr, n int) []byte {
	h := []byte{0x45, 0}
	h = binary.BigEndian.AppendUint16(h, uint16(ipv4HeaderLen+n))
	h = append(h, 0, 1, 0x40, 0, 64, ipProtoUDP, 0, 0) // ID 1, DF, TTL 64
	h = append(append(h, src.AsSlice()...), dst.AsSlice()...)
	binary.BigEndian.PutUint16(h[10:], checksum(h))
	return h
}

// VXLAN prefixes frame with a VXLAN header carrying vni (RFC 7348): the
// payload of a UDP datagram to a VXLAN port.
func VXLAN(vni uint32, frame []byte) []byte {
	h := []byte{vxlanFlagVNI, 0, 0, 0, byte(vni >> 16), byte(vni >> 8), byte(vni), 0}
	return append(h, frame...)
}

// checksum is the Internet checksum (RFC 1071) of b.
func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
