package cni

import (
	"net"
	"net/netip"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
)

// buildResult is the spec result of an ADD: the host and container
// interfaces, the pod's address on the container interface with its
// gateway, and the routes the pod has.
func buildResult(conf *NetConf, args *skel.CmdArgs, v *veth, a podAddr) *types100.Result {
	gw := a.gateway.AsSlice()
	return &types100.Result{
		CNIVersion: types100.ImplementedSpecVersion,
		Interfaces: []*types100.Interface{
			{Name: v.hostName, Mac: v.hostMAC.String(), Mtu: conf.MTU},
			{Name: args.IfName, Mac: v.podMAC.String(), Mtu: conf.MTU, Sandbox: args.Netns},
		},
		IPs: []*types100.IPConfig{{
			Interface: types100.Int(1),
			Address:   *ipNet(netip.PrefixFrom(a.ip, 32)),
			Gateway:   gw,
		}},
		Routes: []*types.Route{
			{Dst: *ipNet(netip.PrefixFrom(a.gateway, 32)), Scope: types100.Int(int(scopeLink))},
			{Dst: net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, GW: gw},
		},
		DNS: conf.DNS,
	}
}

// scopeLink is RT_SCOPE_LINK.
const scopeLink = 253
