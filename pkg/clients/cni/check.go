package cni

import (
	"context"
	"errors"
	"net"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/pkg/clients/cni/skel"
)

// cmdCheck verifies the attachment: CNI_IFNAME exists in the netns with
// each of prevResult's addresses (IPv4 and IPv6), the link route to its
// gateway and the default route via it, and the agent reports the endpoint healthy (ready, host
// interface present). Anything else is error CodeCheckFailed.
func cmdCheck(args *skel.CmdArgs) error {
	c, err := newCall(args)
	if err != nil {
		return err
	}
	defer c.client.close()
	if err := checkIfName(args.IfName); err != nil {
		return err
	}
	if c.conf.RawPrevResult == nil {
		return configError("prevResult", "CHECK needs the ADD's result")
	}
	if err := version.ParsePrevResult(&c.conf.NetConf); err != nil {
		return configError("prevResult", "%v", err)
	}
	prev, err := types100.NewResultFromResult(c.conf.PrevResult)
	if err != nil {
		return configError("prevResult", "%v", err)
	}
	p, err := openPod(args.Netns)
	if err != nil {
		return err
	}
	defer p.Close()
	if err := checkPod(p, args.IfName, prev); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.conf.timeout)
	defer cancel()
	err = c.client.endpointHealth(ctx, attachmentRef(args.ContainerID, args.IfName))
	var ae *apiError
	switch {
	case err == nil:
		return nil
	case isNotFound(err):
		return newError(CodeCheckFailed, "agent has no endpoint for container %s interface %s", args.ContainerID, args.IfName)
	case errors.As(err, &ae) && ae.Code == "endpoint-unhealthy":
		// The health answer of an unhealthy endpoint: its body says why.
		return newError(CodeCheckFailed, "endpoint of container %s is not healthy: %s", args.ContainerID, strings.TrimSpace(ae.Message))
	}
	return agentError("check endpoint", err)
}

// checkPod verifies every address of prev (both families) on ifName,
// with the link route to its gateway and the default route via it.
func checkPod(p *pod, ifName string, prev *types100.Result) error {
	link, err := p.NL.LinkByName(ifName)
	if err != nil {
		return newError(CodeCheckFailed, "interface %s in netns %s: %v", ifName, p.Path, err)
	}
	// Listed once per family, and only for a family prev has.
	type lists struct {
		addrs  []netlink.Addr
		routes []netlink.Route
	}
	byFamily := map[int]*lists{}
	for _, ipc := range prev.IPs {
		fam := netlink.FAMILY_V4
		if ipc.Address.IP.To4() == nil {
			fam = netlink.FAMILY_V6
		}
		l := byFamily[fam]
		if l == nil {
			l = &lists{}
			if l.addrs, err = p.NL.AddrList(link, fam); err != nil {
				return kernelError("list addresses of "+ifName, err)
			}
			if l.routes, err = p.NL.RouteList(link, fam); err != nil {
				return kernelError("list routes of "+ifName, err)
			}
			byFamily[fam] = l
		}
		if !hasAddr(l.addrs, ipc.Address) {
			return newError(CodeCheckFailed, "interface %s lacks address %s", ifName, ipc.Address.String())
		}
		if ipc.Gateway != nil && !hasRoute(l.routes, ipc.Gateway) && !podRoutesVia(p, ipc.Gateway, fam) {
			return newError(CodeCheckFailed, "interface %s lacks the route to gateway %s or the default route via it", ifName, ipc.Gateway)
		}
	}
	return nil
}

// podRoutesVia reports whether the pod routes gw and the default route
// through another interface (a second attachment in the netns, which ADD
// gives no routes of its own).
func podRoutesVia(p *pod, gw net.IP, family int) bool {
	routes, err := p.NL.RouteList(nil, family)
	if err != nil {
		return false
	}
	for _, r := range routes {
		if r.Dst != nil && r.Dst.IP.Equal(gw) && r.Scope == netlink.SCOPE_LINK {
			var same []netlink.Route
			for _, o := range routes {
				if o.LinkIndex == r.LinkIndex {
					same = append(same, o)
				}
			}
			return hasRoute(same, gw)
		}
	}
	return false
}

func hasAddr(addrs []netlink.Addr, want net.IPNet) bool {
	for _, a := range addrs {
		if a.IPNet != nil && a.IP.Equal(want.IP) && a.Mask.String() == want.Mask.String() {
			return true
		}
	}
	return false
}

// hasRoute reports whether routes hold the link route to gw and the
// default route via gw.
func hasRoute(routes []netlink.Route, gw net.IP) bool {
	var link, def bool
	for _, r := range routes {
		switch {
		case r.Dst != nil && r.Dst.IP.Equal(gw) && (r.Scope == netlink.SCOPE_LINK || gw.To4() == nil):
			// IPv6 routes have no scope: the kernel lists them all as
			// universe.
			link = true
		case (r.Dst == nil || r.Dst.IP.IsUnspecified()) && r.Gw.Equal(gw):
			def = true
		}
	}
	return link && def
}

var _ = types.ErrInternal
