package policy

import (
	"cmp"
	"fmt"
)

// maxICMPFields bounds the fields of one ICMP rule, as Cilium's CRD does.
const maxICMPFields = 40

// The ICMP type names a rule may give instead of a number, per family:
// the names Cilium accepts (pkg/policy/api), with the IANA numbers.
var (
	icmpV4Types = map[string]uint8{
		"EchoReply": 0, "DestinationUnreachable": 3, "Redirect": 5, "Echo": 8, "EchoRequest": 8,
		"RouterAdvertisement": 9, "RouterSelection": 10, "TimeExceeded": 11, "ParameterProblem": 12,
		"Timestamp": 13, "TimestampReply": 14, "Photuris": 40, "ExtendedEchoRequest": 42, "ExtendedEchoReply": 43,
	}
	icmpV6Types = map[string]uint8{
		"DestinationUnreachable": 1, "PacketTooBig": 2, "TimeExceeded": 3, "ParameterProblem": 4,
		"EchoRequest": 128, "EchoReply": 129, "MulticastListenerQuery": 130, "MulticastListenerReport": 131,
		"MulticastListenerDone": 132, "RouterSolicitation": 133, "RouterAdvertisement": 134,
		"NeighborSolicitation": 135, "NeighborAdvertisement": 136, "RedirectMessage": 137,
		"RouterRenumbering": 138, "ICMPNodeInformationQuery": 139, "ICMPNodeInformationResponse": 140,
		"InverseNeighborDiscoverySolicitation": 141, "InverseNeighborDiscoveryAdvertisement": 142,
		"HomeAgentAddressDiscoveryRequest": 144, "HomeAgentAddressDiscoveryReply": 145,
		"MobilePrefixSolicitation": 146, "MobilePrefixAdvertisement": 147,
		"DuplicateAddressRequestCodeSuffix": 157, "DuplicateAddressConfirmationCodeSuffix": 158,
		"ExtendedEchoRequest": 160, "ExtendedEchoReply": 161,
	}
)

// ICMPTypePort is the port of a key matching ICMP (or ICMPv6) type t:
// the datapath matches an ICMP packet's type as its port, as Cilium
// does, offset by 0x100 so that type 0 (echo reply) is not port 0, the
// wildcard.
func ICMPTypePort(t uint8) uint16 { return 0x100 | uint16(t) }

// compileICMPs compiles an entry's icmps into keys on the ICMP type
// (ICMPTypePort): family IPv4 (the default) is protocol ICMP, IPv6
// ICMPv6.
func compileICMPs(rules []icmpRule, path string) ([]PortProto, error) {
	var out []PortProto
	for i, r := range rules {
		rp := fmt.Sprintf("%s.icmps[%d]", path, i)
		if len(r.Fields) == 0 {
			return nil, fmt.Errorf("%s.fields: missing (give at least one ICMP type)", rp)
		}
		if len(r.Fields) > maxICMPFields {
			return nil, fmt.Errorf("%s.fields: %d fields, more than %d", rp, len(r.Fields), maxICMPFields)
		}
		for j, f := range r.Fields {
			pp, err := compileICMPField(f, fmt.Sprintf("%s.fields[%d]", rp, j))
			if err != nil {
				return nil, err
			}
			out = append(out, pp)
		}
	}
	return out, nil
}

func compileICMPField(f icmpField, path string) (PortProto, error) {
	proto, names := ProtoICMP, icmpV4Types
	switch f.Family {
	case "", "IPv4":
	case "IPv6":
		proto, names = ProtoICMPv6, icmpV6Types
	default:
		return PortProto{}, fmt.Errorf("%s.family: unsupported family %q (want IPv4 or IPv6)", path, f.Family)
	}
	switch {
	case !f.Type.set:
		return PortProto{}, fmt.Errorf("%s.type: missing", path)
	case f.Type.name != "":
		t, ok := names[f.Type.name]
		if !ok {
			return PortProto{}, fmt.Errorf("%s.type: unknown %s ICMP type name %q", path, cmp.Or(f.Family, "IPv4"), f.Type.name)
		}
		return PortProto{Port: ICMPTypePort(t), Proto: proto}, nil
	case f.Type.num < 0 || f.Type.num > 255:
		return PortProto{}, fmt.Errorf("%s.type: %d outside 0..255", path, f.Type.num)
	}
	return PortProto{Port: ICMPTypePort(uint8(f.Type.num)), Proto: proto}, nil
}
