package cni

import (
	"net/netip"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
)

// buildResult is the spec result of an ADD: the host and container
// interfaces, each of the pod's addresses on the container interface
// (index 1) with its gateway, and the routes the pod has (per family: the
// link route to the gateway, the default route via it). PrintResult
// converts it to the version the runtime asked for (0.3.x and 0.4.0 carry
// each address's family as "version").
func buildResult(conf *NetConf, args *skel.CmdArgs, v *veth, addrs []podAddr) *types100.Result {
	res := &types100.Result{
		CNIVersion: types100.ImplementedSpecVersion,
		Interfaces: []*types100.Interface{
			{Name: v.hostName, Mac: v.hostMAC.String(), Mtu: conf.MTU},
			{Name: args.IfName, Mac: v.podMAC.String(), Mtu: conf.MTU, Sandbox: args.Netns},
		},
		DNS: conf.DNS,
	}
	for _, a := range addrs {
		gw := a.gateway.AsSlice()
		res.IPs = append(res.IPs, &types100.IPConfig{
			Interface: types100.Int(1),
			Address:   *ipNet(netip.PrefixFrom(a.ip, a.ip.BitLen())),
			Gateway:   gw,
		})
		res.Routes = append(res.Routes,
			&types.Route{Dst: *ipNet(netip.PrefixFrom(a.gateway, a.gateway.BitLen())), Scope: types100.Int(int(scopeLink))},
			&types.Route{Dst: *defaultRoute(a.ip), GW: gw})
	}
	return res
}

// scopeLink is RT_SCOPE_LINK.
const scopeLink = 253
