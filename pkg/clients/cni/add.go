package cni

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// cmdAdd attaches the pod: allocate an address of every family the agent
// serves, create the veth with its peer already in the pod's netns,
// configure the pod side while registering the endpoint (sync: the
// agent's datapath has set up the host side when it answers), print the
// result.
// Any failure undoes what this ADD made, every address included.
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
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()

	pt.mark("parse")
	pod, err := openPod(args.Netns)
	if err != nil {
		return err
	}
	defer pod.Close()
	pt.mark("netns")
	// The addresses are allocated while the veth is made: the two are
	// independent, and each is about a millisecond. (Started before the
	// netns is opened, the call slowed that step by as much as it could
	// gain: measured in BENCHMARKS.md.)
	alloc := c.allocateAsync(ctx)
	defer func() {
		if retErr != nil {
			if addrs, err := alloc.wait(); err == nil {
				c.release(addrs)
			}
		}
	}()
	hostName, tmpName := VethNames(args.ContainerID, args.IfName)
	veth, err := pod.createVeth(hostName, args.IfName, c.conf.MTU)
	if errors.Is(err, errVethExists) {
		// A name is taken (CNI_IFNAME, or this attachment's leftovers):
		// look closer only now, so the usual ADD makes no lookups.
		if err := c.clearStale(ctx, pod, hostName, tmpName); err != nil {
			return err
		}
		veth, err = pod.createVeth(hostName, args.IfName, c.conf.MTU)
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
	pt.mark("veth")
	addrs, err := alloc.wait()
	if err != nil {
		return err
	}
	pt.mark("ipam-wait")
	pt.span("ipam-call (overlaps veth)", alloc.start, alloc.end)

	// The endpoint is registered while the pod side is configured: the
	// agent's work (state, routes and programs on the host side) needs
	// the host veth and the addresses, not the pod's addresses and
	// routes. The ADD answers once both are done; if either failed, the
	// rollback removes the endpoint the PUT may have created.
	mayExist := false // an endpoint this ADD may have created
	defer func() {
		if retErr != nil && mayExist {
			c.removeEndpoint()
		}
	}()
	put := make(chan error, 1)
	go func() {
		var err error
		mayExist, err = c.putEndpoint(ctx, veth, addrs)
		put <- err
	}()
	cerr := pod.configure(veth, addrs)
	pt.mark("configure (the endpoint PUT runs alongside)")
	perr := <-put // mayExist is set
	if cerr != nil {
		return cerr
	}
	if perr != nil {
		return perr
	}
	pt.mark("put-endpoint (what was left after configure)")
	res := buildResult(c.conf, args, veth, addrs)
	if err := types.PrintResult(res, c.conf.CNIVersion); err != nil {
		return newError(types.ErrIOFailure, "print result: %v", err)
	}
	pt.mark("result")
	return nil
}

// podAddr is one of the pod's addresses and its family's gateway, from
// the agent's IPAM.
type podAddr struct {
	ip, gateway netip.Addr
}

// pendingAddr is an allocation in flight; start and end time it.
type pendingAddr struct {
	done       chan struct{}
	addrs      []podAddr
	err        error
	start, end time.Time
}

// wait returns the allocation's outcome; it may be called more than once.
func (p *pendingAddr) wait() ([]podAddr, error) {
	<-p.done
	return p.addrs, p.err
}

func (c *call) allocateAsync(ctx context.Context) *pendingAddr {
	p := &pendingAddr{done: make(chan struct{}), start: time.Now()}
	go func() {
		defer close(p.done)
		p.addrs, p.err = c.allocate(ctx)
		p.end = time.Now()
	}()
	return p
}

// allocate asks the agent for one address of every family it serves
// (POST /v1/ipam without a family: both or neither, the IPv4 address
// first). An answer without any address, or with one that does not
// parse, is an error; the addresses it did carry are released.
func (c *call) allocate(ctx context.Context) ([]podAddr, error) {
	var addrs []podAddr
	err := retryStarting(ctx, func() error {
		res, err := c.client.ipamAllocate(ctx, "", c.k8s.Owner())
		if err != nil {
			return err
		}
		addrs, err = parseAllocation(res)
		if err != nil {
			c.release(addrs)
			addrs = nil
		}
		return err
	})
	if err != nil {
		return nil, agentError("allocate address", err)
	}
	return addrs, nil
}

// parseAllocation returns the addresses of an IPAM answer, IPv4 first.
// On error it returns the addresses that parsed (for release).
func parseAllocation(res *models.IPAMResponse) ([]podAddr, error) {
	var addrs []podAddr
	var errs []error
	for _, f := range []struct {
		name string
		r    *models.IPAMAddressResponse
		is4  bool
	}{{"ipv4", res.IPv4, true}, {"ipv6", res.IPv6, false}} {
		if f.r == nil {
			continue
		}
		ip, err := netip.ParseAddr(f.r.IP)
		if err != nil || ip.Is4() != f.is4 || ip.Zone() != "" {
			errs = append(errs, fmt.Errorf("agent answered %s address %q", f.name, f.r.IP))
			continue
		}
		addrs = append(addrs, podAddr{ip: ip})
		gw, err := netip.ParseAddr(f.r.Gateway)
		if err != nil || gw.Is4() != f.is4 || gw.Zone() != "" {
			errs = append(errs, fmt.Errorf("agent answered %s gateway %q", f.name, f.r.Gateway))
			continue
		}
		addrs[len(addrs)-1].gateway = gw
	}
	if len(addrs) == 0 && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("agent answered no address"))
	}
	return addrs, errors.Join(errs...)
}

// release gives the addresses back during a rollback (the agent never
// releases an address whose endpoint creation failed: the plugin owns it).
func (c *call) release(addrs []podAddr) {
	if len(addrs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
	defer cancel()
	for _, a := range addrs {
		_ = c.client.ipamRelease(ctx, a.ip.String())
	}
}

// putEndpoint registers the endpoint and waits for its first
// regeneration. mayExist is false when the agent answered an error: it
// removes an endpoint whose creation failed, and a conflict means the
// endpoint is someone else's.
func (c *call) putEndpoint(ctx context.Context, v *veth, addrs []podAddr) (mayExist bool, err error) {
	pair := &models.AddressPair{}
	for _, a := range addrs {
		if a.ip.Is4() {
			pair.IPv4 = a.ip.String()
		} else {
			pair.IPv6 = a.ip.String()
		}
	}
	req := &models.EndpointChangeRequest{
		ContainerID:            c.args.ContainerID,
		ContainerInterfaceName: c.args.IfName,
		K8sNamespace:           c.k8s.Namespace,
		K8sPodName:             c.k8s.Pod,
		K8sUID:                 c.k8s.UID,
		Addressing:             pair,
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
