package datapath

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// neighbours6 makes IPv6 work without neighbour discovery on the host's
// side of the veth, the part that has no IPv4 equivalent:
//
//   - a proxy entry per IPv6 gateway on the host veth, so the host
//     answers the pod's solicitations for its gateway (IPv4 needs none:
//     the host answers ARP for its local addresses on any interface, but
//     IPv6 only for addresses on the interface asked, and the gateways
//     live on the gateway device);
//   - a permanent neighbour entry for the pod's address with the pod's
//     MAC, when the endpoint has one (the CNI plugin reports it): the
//     host then never solicits the pod. A solicitation needs a link-local
//     source address, which a new veth has only after its duplicate
//     address detection (about a second), so the first packets to a new
//     pod would otherwise wait or be lost.
//
// Both are replaced in place (idempotent) and go with the interface.
func (l *Linux) neighbours6(idx int, ep *endpoint.Endpoint) error {
	for _, gw := range l.cfg.Gateways {
		if !gw.Is6() {
			continue
		}
		n := &netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V6, Flags: netlink.NTF_PROXY, IP: gw.AsSlice()}
		if err := l.nl.NeighSet(n); err != nil {
			return fmt.Errorf("proxy neighbour %s: %w", gw, err)
		}
	}
	if ep.MAC == "" {
		return nil
	}
	mac, err := net.ParseMAC(ep.MAC)
	if err == nil && len(mac) != 6 {
		err = fmt.Errorf("want 6 bytes, got %d", len(mac))
	}
	if err != nil {
		return fmt.Errorf("neighbour %s: mac %q: %w", ep.IPv6, ep.MAC, err)
	}
	n := &netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT,
		IP: ep.IPv6.AsSlice(), HardwareAddr: mac}
	if err := l.nl.NeighSet(n); err != nil {
		return fmt.Errorf("neighbour %s: %w", ep.IPv6, err)
	}
	return nil
}
