package cni

import (
	"context"
	"net/netip"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/membrane-cni/membrane/pkg/clients/cni/skel"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/ifname"
)

// Chaining. membrane-cni runs in one of two modes, chosen per ADD by the
// network config alone, as the spec lays it out: an ADD without
// prevResult (membrane-cni first in its conflist) makes the attachment
// (POST /v1/attach: address, veth, endpoint); an ADD with prevResult
// (membrane-cni after a plugin such as ptp that made a veth) adopts it,
// as Cilium's generic-veth chaining: the previous result's container
// interface and addresses become the endpoint's, the veth's host end
// gets the node's programs (policy, Services), nothing is allocated or
// created, and the previous result is printed unchanged. Chained or
// not, membrane-cni does no IPAM (ipam is refused in the config). DEL
// deletes the endpoint; it deletes CNI_IFNAME in the pod only when its
// host end is membrane's own veth (deletePodInterface).

// ChainedAttachment parses and checks the prevResult of a chained ADD:
// exactly one interface named CNI_IFNAME in the sandbox CNI_NETNS (the
// pod end of the veth), at least one address on it and at most one per
// family, every address naming an interface of the result (addresses on
// other interfaces are another plugin's business and left alone), each
// gateway of its address's family. The host end is the result's one
// interface without a sandbox, when there is exactly one (else the
// agent finds it as the pod end's peer). Returns the result, converted
// to the current version, and the attachment to ask the agent for;
// errors are CNI error 7 naming prevResult.
func ChainedAttachment(conf *NetConf, args *skel.CmdArgs) (*types100.Result, *models.AttachChained, error) {
	if err := version.ParsePrevResult(&conf.NetConf); err != nil {
		return nil, nil, configError("prevResult", "%v", err)
	}
	prev, err := types100.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return nil, nil, configError("prevResult", "%v", err)
	}
	pod, host := -1, -1
	hosts := 0
	for i, iface := range prev.Interfaces {
		if iface == nil {
			return nil, nil, configError("prevResult", "interfaces[%d]: null", i)
		}
		switch {
		case iface.Sandbox == "":
			hosts++
			host = i
		case iface.Name == args.IfName && iface.Sandbox == args.Netns:
			if pod >= 0 {
				return nil, nil, configError("prevResult", "interfaces[%d] and [%d] both name %s in %s", pod, i, args.IfName, args.Netns)
			}
			pod = i
		case iface.Name == args.IfName:
			return nil, nil, configError("prevResult", "interfaces[%d]: %s is in sandbox %q, not CNI_NETNS %q", i, iface.Name, iface.Sandbox, args.Netns)
		}
	}
	if pod < 0 {
		return nil, nil, configError("prevResult", "no interface %s in sandbox %s: membrane-cni chains after a plugin that made it", args.IfName, args.Netns)
	}
	ch := &models.AttachChained{}
	if hosts == 1 {
		if name := prev.Interfaces[host].Name; ifname.Valid(name) {
			ch.HostInterface = name
		} else {
			return nil, nil, configError("prevResult", "interfaces[%d]: %q is not an interface name", host, name)
		}
	}
	for i, ipc := range prev.IPs {
		if ipc == nil {
			return nil, nil, configError("prevResult", "ips[%d]: null", i)
		}
		if ipc.Interface == nil || *ipc.Interface < 0 || *ipc.Interface >= len(prev.Interfaces) {
			return nil, nil, configError("prevResult", "ips[%d]: want the index of an interface of the result", i)
		}
		if *ipc.Interface != pod {
			continue
		}
		ip, ok := netip.AddrFromSlice(ipc.Address.IP)
		if !ok || ip.Unmap().IsUnspecified() {
			return nil, nil, configError("prevResult", "ips[%d]: address %q", i, ipc.Address.String())
		}
		ip = ip.Unmap()
		if ipc.Gateway != nil {
			gw, ok := netip.AddrFromSlice(ipc.Gateway)
			if !ok || gw.Unmap().Is4() != ip.Is4() {
				return nil, nil, configError("prevResult", "ips[%d]: gateway %s is not of the family of %s", i, ipc.Gateway, ip)
			}
		}
		dst := &ch.IPv6
		if ip.Is4() {
			dst = &ch.IPv4
		}
		if *dst != "" {
			return nil, nil, configError("prevResult", "ips[%d]: a second address of %s's family on %s (an endpoint holds one per family)", i, ip, args.IfName)
		}
		*dst = ip.String()
	}
	if ch.IPv4 == "" && ch.IPv6 == "" {
		return nil, nil, configError("prevResult", "no address on %s", args.IfName)
	}
	return prev, ch, nil
}

// addChained is cmdAdd's chained mode (see ChainedAttachment): the agent
// adopts the previous plugin's veth and addresses and the previous
// result is printed unchanged. When the result cannot be printed the
// endpoint is deleted again (the veth stays the previous plugin's).
func (c *call) addChained(ctx context.Context, req *models.AttachRequest, pt *phaseTimer) (retErr error) {
	prev, ch, err := ChainedAttachment(c.conf, c.args)
	if err != nil {
		return err
	}
	req.Chained, req.MTU = ch, 0
	pt.mark("prevResult")
	var att models.AttachResponse
	var timing string
	err = retryStarting(ctx, func() (err error) {
		timing, err = c.client.attach(ctx, req, &att)
		return err
	})
	pt.mark("attach (the agent: adopt the veth, endpoint)")
	pt.agent(timing)
	if isCode(err, "invalid-argument") || isCode(err, "invalid-address") {
		return configError("prevResult", "the agent refused the attachment: %v", err)
	}
	if err != nil {
		return agentError("attach (chained)", err)
	}
	defer func() {
		if retErr != nil {
			ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
			defer cancel()
			_ = c.client.endpointDeleteAttachment(ctx, c.args.ContainerID, c.args.IfName)
		}
	}()
	if err := types.PrintResult(prev, c.conf.CNIVersion); err != nil {
		return newError(types.ErrIOFailure, "print result: %v", err)
	}
	pt.mark("result")
	return nil
}
