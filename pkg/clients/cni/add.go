package cni

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/membrane-cni/membrane/pkg/clients/cni/skel"

	"github.com/membrane-cni/membrane/datapath/podnet"
	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// cmdAdd attaches the pod through the agent (POST /v1/attach): the agent
// allocates an address of every family it serves, creates the veth with
// its peer already in the pod's netns, configures the pod's side while it
// creates the endpoint (sync: the host side is set up when it answers),
// and undoes all of it when any step fails. The plugin validates, sends
// one request and prints the result: one round trip, and a short-lived
// process without netlink work (measured in BENCHMARKS.md, "The plugin
// hands the ADD to the agent"). When the answer cannot be printed, the
// plugin removes the attachment again.
func cmdAdd(args *skel.CmdArgs) (retErr error) {
	pt := newPhaseTimer("ADD", args.ContainerID, args.IfName)
	defer func() { pt.write(retErr != nil) }()
	c, err := newCall(args)
	if err != nil {
		return err
	}
	defer c.client.close()
	if err := checkIfName(args.IfName); err != nil {
		return err
	}
	if args.Netns == "" {
		return envError("CNI_NETNS", "required for ADD")
	}
	// A netns that is not there fails here with its own code, agent or
	// not (the agent checks it is a network namespace).
	if _, err := os.Stat(args.Netns); err != nil {
		return newError(CodeNetns, "open netns %s: %v", args.Netns, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.conf.timeout)
	defer cancel()
	pt.mark("parse")

	req := &models.AttachRequest{
		ContainerID: args.ContainerID, ContainerInterfaceName: args.IfName, Netns: args.Netns,
		MTU: int64(c.conf.MTU), K8sNamespace: c.k8s.Namespace, K8sPodName: c.k8s.Pod, K8sUID: c.k8s.UID,
		Owner: c.k8s.Owner(),
	}
	// The network's name labels every endpoint (an identity needs a label
	// even outside Kubernetes); pods also carry their namespace.
	req.Labels = []string{"cni:network=" + c.conf.Name}
	if c.k8s.Namespace != "" {
		req.Labels = append(req.Labels, "k8s:io.kubernetes.pod.namespace="+c.k8s.Namespace)
	}
	for _, pm := range c.conf.RuntimeConfig.PortMappings {
		req.PortMappings = append(req.PortMappings, models.PortMapping{HostPort: int64(pm.HostPort),
			ContainerPort: int64(pm.ContainerPort), Protocol: pm.Protocol, HostIP: pm.HostIP})
	}
	if c.conf.RawPrevResult != nil {
		return c.addChained(ctx, req, pt)
	}
	var att models.AttachResponse
	var timing string
	err = retryStarting(ctx, func() (err error) {
		timing, err = c.client.attach(ctx, req, &att)
		return err
	})
	pt.mark("attach (the agent: address, veth, pod side, endpoint)")
	pt.agent(timing)
	if isNotFound(err) && isCode(err, "not-found") {
		return newError(CodeAgentError, "attach: the agent does not serve POST /v1/attach (older than this plugin? upgrade it): %v", err)
	}
	if err != nil {
		return agentError("attach", err)
	}
	defer func() {
		if retErr != nil {
			c.detach()
		}
	}()
	res, err := buildResult(c.conf, args, &att)
	if err != nil {
		return newError(CodeAgentError, "attach: agent answered %v", err)
	}
	if err := types.PrintResult(res, c.conf.CNIVersion); err != nil {
		return newError(types.ErrIOFailure, "print result: %v", err)
	}
	pt.mark("result")
	return nil
}

// attachAddrs returns the addresses of an attach answer, IPv4 first,
// checking each is of its family, as is its gateway.
func attachAddrs(att *models.AttachResponse) ([]podnet.Addr, error) {
	var addrs []podnet.Addr
	for _, f := range []struct {
		name string
		a    *models.AttachAddress
		is4  bool
	}{{"ipv4", att.IPv4, true}, {"ipv6", att.IPv6, false}} {
		if f.a == nil {
			continue
		}
		ip, err := netip.ParseAddr(f.a.IP)
		if err != nil || ip.Is4() != f.is4 || ip.Zone() != "" {
			return nil, fmt.Errorf("%s address %q", f.name, f.a.IP)
		}
		gw, err := netip.ParseAddr(f.a.Gateway)
		if err != nil || gw.Is4() != f.is4 || gw.Zone() != "" {
			return nil, fmt.Errorf("%s gateway %q", f.name, f.a.Gateway)
		}
		addrs = append(addrs, podnet.Addr{IP: ip, Gateway: gw})
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("no address")
	}
	return addrs, nil
}

// attachMACs parses the MACs of an attach answer.
func attachMACs(att *models.AttachResponse) (host, pod net.HardwareAddr, err error) {
	if host, err = net.ParseMAC(att.HostInterface.Mac); err != nil {
		return nil, nil, fmt.Errorf("host interface MAC %q", att.HostInterface.Mac)
	}
	if pod, err = net.ParseMAC(att.PodInterface.Mac); err != nil {
		return nil, nil, fmt.Errorf("pod interface MAC %q", att.PodInterface.Mac)
	}
	return host, pod, nil
}

// detach undoes an attach whose answer the plugin could not use: the
// agent deletes the endpoint (its addresses and host veth with it), and
// the interface in the pod's netns goes.
func (c *call) detach() {
	ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
	defer cancel()
	_ = c.client.endpointDeleteAttachment(ctx, c.args.ContainerID, c.args.IfName)
	c.deletePodInterface(false)
}
