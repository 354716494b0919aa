package cni

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/membrane-cni/membrane/pkg/clients/models"
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
	defer c.client.close()
	if err := checkIfName(args.IfName); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()

	pod, err := openPod(args.Netns)
	if err != nil {
		return err
	}
	defer pod.Close()
	// The address is allocated while the veth is made: the two are
	// independent, and each is about a millisecond.
	alloc := c.allocateAsync(ctx)
	defer func() {
		if retErr != nil {
			if addr, err := alloc.wait(); err == nil {
				c.release(addr.ip)
			}
		}
	}()
	hostName, tmpName := VethNames(args.ContainerID, args.IfName)
	veth, err := pod.createVeth(hostName, tmpName, args.IfName, c.conf.MTU)
	if errors.Is(err, errVethExists) {
		// A name is taken (CNI_IFNAME, or this attachment's leftovers):
		// look closer only now, so the usual ADD makes no lookups.
		if err := c.clearStale(ctx, pod, hostName, tmpName); err != nil {
			return err
		}
		veth, err = pod.createVeth(hostName, tmpName, args.IfName, c.conf.MTU)
	}
	if errors.Is(err, errVethExists) {
		return newError(CodeInterfaceExists, "interface %q in netns %s or %s in the host stays taken: %v", args.IfName, args.Netns, hostName, err)
	}
	if err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			veth.rollback()
		}
	}()
	addr, err := alloc.wait()
	if err != nil {
		return err
	}
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

// pendingAddr is an allocation in flight.
type pendingAddr struct {
	done chan struct{}
	addr podAddr
	err  error
}

// wait returns the allocation's outcome; it may be called more than once.
func (p *pendingAddr) wait() (podAddr, error) {
	<-p.done
	return p.addr, p.err
}

func (c *call) allocateAsync(ctx context.Context) *pendingAddr {
	p := &pendingAddr{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.addr, p.err = c.allocate(ctx)
	}()
	return p
}

func (c *call) allocate(ctx context.Context) (podAddr, error) {
	var a podAddr
	err := retryStarting(ctx, func() error {
		res, err := c.client.ipamAllocate(ctx, "ipv4", c.k8s.Owner())
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
	_ = c.client.ipamRelease(ctx, ip.String())
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
		return c.client.endpointCreate(ctx, attachmentRef(c.args.ContainerID, c.args.IfName), req)
	})
	if err != nil {
		var ae *apiError
		return !errors.As(err, &ae), agentError("create endpoint", err)
	}
	return true, nil
}

// removeEndpoint deletes the endpoint during a rollback; a missing one
// (the agent removes an endpoint whose creation failed) is fine.
func (c *call) removeEndpoint() {
	ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
	defer cancel()
	_ = c.client.endpointDeleteAttachment(ctx, c.args.ContainerID, c.args.IfName)
}
