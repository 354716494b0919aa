package client

import "github.com/membrane-cni/membrane/pkg/clients/models"

// POST /v1/ipam answers are decoded by hand like endpoint answers (see
// endpoint_decode.go): the agent's shape only, encoding/json otherwise.

// decodeIPAM decodes data into *out and reports true, or reports false
// and leaves *out alone.
func decodeIPAM(data []byte, out *models.IPAMResponse) bool {
	p := parser{b: data}
	var r models.IPAMResponse
	var seen uint32
	ok := p.object(func(key []byte) (uint32, bool) {
		switch string(key) {
		case "address":
			r.Address = &models.AddressPair{}
			return 1, p.addressing(r.Address)
		case "host-addressing":
			r.HostAddressing = &models.NodeAddressing{}
			return 2, p.nodeAddressing(r.HostAddressing)
		case "ipv4":
			r.IPv4 = &models.IPAMAddressResponse{}
			return 4, p.ipamAddress(r.IPv4)
		case "ipv6":
			r.IPv6 = &models.IPAMAddressResponse{}
			return 8, p.ipamAddress(r.IPv6)
		}
		return 0, false
	}, &seen)
	if !ok {
		return false
	}
	p.ws()
	if p.i != len(p.b) {
		return false
	}
	*out = r
	return true
}

func (p *parser) ipamAddress(a *models.IPAMAddressResponse) bool {
	var seen uint32
	return p.object(func(key []byte) (uint32, bool) {
		switch string(key) {
		case "ip":
			return 1, p.str(&a.IP)
		case "gateway":
			return 2, p.str(&a.Gateway)
		case "cidrs":
			return 4, p.strs(&a.Cidrs)
		case "owner":
			return 8, p.str(&a.Owner)
		}
		return 0, false
	}, &seen)
}

func (p *parser) nodeAddressing(n *models.NodeAddressing) bool {
	var seen uint32
	return p.object(func(key []byte) (uint32, bool) {
		switch string(key) {
		case "ipv4":
			n.IPv4 = &models.NodeAddressingElement{}
			return 1, p.nodeElement(n.IPv4)
		case "ipv6":
			n.IPv6 = &models.NodeAddressingElement{}
			return 2, p.nodeElement(n.IPv6)
		}
		return 0, false
	}, &seen)
}

func (p *parser) nodeElement(e *models.NodeAddressingElement) bool {
	var seen uint32
	return p.object(func(key []byte) (uint32, bool) {
		switch string(key) {
		case "enabled":
			return 1, p.bool(&e.Enabled)
		case "ip":
			return 2, p.str(&e.IP)
		case "alloc-range":
			return 4, p.str(&e.AllocRange)
		}
		return 0, false
	}, &seen)
}
