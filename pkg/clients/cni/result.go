package cni

import (
	"fmt"
	"net/netip"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/membrane-cni/membrane/pkg/clients/cni/skel"

	"github.com/membrane-cni/membrane/datapath/podnet"
	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// buildResult is the spec result of an ADD from the agent's attach
// answer: the host and container interfaces, each of the pod's addresses
// on the container interface (index 1) with its gateway, and the routes
// the pod has (per family: the link route to the gateway, the default
// route via it, with the agent's route MTU). PrintResult converts it to the version the runtime asked
// for (0.3.x and 0.4.0 carry each address's family as "version"). An
// answer that does not parse is an error.
func buildResult(conf *NetConf, args *skel.CmdArgs, att *models.AttachResponse) (*types100.Result, error) {
	addrs, err := attachAddrs(att)
	if err != nil {
		return nil, err
	}
	hostMAC, podMAC, err := attachMACs(att)
	if err != nil {
		return nil, err
	}
	if want, _ := VethNames(args.ContainerID, args.IfName); att.HostInterface.Name != want {
		return nil, fmt.Errorf("host interface %q, want %q", att.HostInterface.Name, want)
	}
	res := &types100.Result{
		CNIVersion: types100.ImplementedSpecVersion,
		Interfaces: []*types100.Interface{
			{Name: att.HostInterface.Name, Mac: hostMAC.String(), Mtu: conf.MTU},
			{Name: args.IfName, Mac: podMAC.String(), Mtu: conf.MTU, Sandbox: args.Netns},
		},
		DNS: conf.DNS,
	}
	for _, a := range addrs {
		gw := a.Gateway.AsSlice()
		res.IPs = append(res.IPs, &types100.IPConfig{
			Interface: types100.Int(1),
			Address:   *podnet.IPNet(netip.PrefixFrom(a.IP, a.IP.BitLen())),
			Gateway:   gw,
		})
		res.Routes = append(res.Routes,
			&types.Route{Dst: *podnet.IPNet(netip.PrefixFrom(a.Gateway, a.Gateway.BitLen())), Scope: types100.Int(int(scopeLink)), MTU: int(att.RouteMTU)},
			&types.Route{Dst: *podnet.DefaultRoute(a.IP), GW: gw, MTU: int(att.RouteMTU)})
	}
	return res, nil
}

// scopeLink is RT_SCOPE_LINK.
const scopeLink = 253
