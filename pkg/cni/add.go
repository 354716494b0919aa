package cni

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/membrane-cni/membrane/pkg/client"
	"github.com/membrane-cni/membrane/pkg/models"
)

// cmdAdd attaches the pod: allocate an address, create the veth with its
// peer already in the pod's netns, configure the pod side, register the
// endpoint (sync: the agent's datapath has set up the host side when it
// answers), print the result. Any failure undoes what this ADD made.
func cmdAdd(args *skel.CmdArgs) (retErr error) {
	c, err := newCall(args)
	if err != nil {
		return err
	}
	defer c.client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()

	pod, err := openPod(args.Netns)
	if err != nil {
		return err
	}
	defer pod.Close()
	hostName, tmpName := VethNames(args.ContainerID)
	if err := c.clearStale(ctx, pod, hostName); err != nil {
		return err
	}

	addr, err := c.allocate(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			c.release(addr.ip)
		}
	}()

	veth, err := pod.createVeth(hostName, tmpName, args.IfName, c.conf.MTU)
	if err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			veth.rollback()
		}
	}()
	if err := pod.configure(veth, addr); err != nil {
		return err
	}

	mayExist := false // an endpoint this ADD may have created
	defer func() {
		if retErr != nil && mayExist {
			c.removeEndpoint()
		}
	}()
	if mayExist, err = c.putEndpoint(ctx, veth, addr); err != nil {
		return err
	}
	res := buildResult(c.conf, args, veth, addr)
	if err := types.PrintResult(res, c.conf.CNIVersion); err != nil {
		return newError(types.ErrIOFailure, "print result: %v", err)
	}
	return nil
}

// podAddr is the pod's address and gateway from the agent's IPAM.
type podAddr struct {
	ip, gateway netip.Addr
}

func (c *call) allocate(ctx context.Context) (podAddr, error) {
	var a podAddr
	err := retryStarting(ctx, func() error {
		res, err := c.client.IPAMAllocate(ctx, "ipv4", c.k8s.Owner())
		if err != nil {
			return err
		}
		if res.IPv4 == nil {
			return fmt.Errorf("agent answered no ipv4 address")
		}
		if a.ip, err = netip.ParseAddr(res.IPv4.IP); err != nil {
			return fmt.Errorf("agent answered ip %q: %w", res.IPv4.IP, err)
		}
		if a.gateway, err = netip.ParseAddr(res.IPv4.Gateway); err != nil {
			return fmt.Errorf("agent answered gateway %q: %w", res.IPv4.Gateway, err)
		}
		return nil
	})
	if err != nil {
		return a, agentError("allocate address", err)
	}
	return a, nil
}

// release gives the address back during a rollback (the agent never
// releases an address whose endpoint creation failed: the plugin owns it).
func (c *call) release(ip netip.Addr) {
	ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
	defer cancel()
	_ = c.client.IPAMRelease(ctx, ip.String())
}

// putEndpoint registers the endpoint and waits for its first
// regeneration. mayExist is false when the agent answered an error: it
// removes an endpoint whose creation failed, and a conflict means the
// endpoint is someone else's.
func (c *call) putEndpoint(ctx context.Context, v *veth, a podAddr) (mayExist bool, err error) {
	req := &models.EndpointChangeRequest{
		ContainerID:            c.args.ContainerID,
		ContainerInterfaceName: c.args.IfName,
		K8sNamespace:           c.k8s.Namespace,
		K8sPodName:             c.k8s.Pod,
		K8sUID:                 c.k8s.UID,
		Addressing:             &models.AddressPair{IPv4: a.ip.String()},
		InterfaceName:          v.hostName,
		InterfaceIndex:         int64(v.hostIndex),
		Mac:                    v.podMAC.String(),
		HostMac:                v.hostMAC.String(),
		Netns:                  c.args.Netns,
		SyncBuild:              true,
	}
	// The network's name labels every endpoint (an identity needs a label
	// even outside Kubernetes); pods also carry their namespace.
	req.Labels = []string{"cni:network=" + c.conf.Name}
	if c.k8s.Namespace != "" {
		req.Labels = append(req.Labels, "k8s:io.kubernetes.pod.namespace="+c.k8s.Namespace)
	}
	err = retryStarting(ctx, func() error {
		_, err := c.client.EndpointCreate(ctx, "container-id:"+c.args.ContainerID, req)
		return err
	})
	if err != nil {
		var ae *client.APIError
		return !errors.As(err, &ae), agentError("create endpoint", err)
	}
	return true, nil
}

// removeEndpoint deletes the endpoint during a rollback; a missing one
// (the agent removes an endpoint whose creation failed) is fine.
func (c *call) removeEndpoint() {
	ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
	defer cancel()
	_ = c.client.EndpointDeleteByContainer(ctx, c.args.ContainerID)
}
