package cni

import (
	"context"
	"errors"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/clients/cni/delqueue"
)

// cmdDel detaches the pod. It only asks the agent to delete the endpoint
// (which releases the address and tears the host veth down, lazily: see
// docs/cni-notes.md); it does not touch the pod's netns, which the
// runtime deletes next. Idempotent: a missing endpoint, netns or link is
// success. When the agent is unreachable the deletion is queued on disk
// for the agent to drain when it starts.
func cmdDel(args *skel.CmdArgs) error {
	c, err := newCall(args)
	if err != nil {
		return err
	}
	defer c.client.close()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	err = retryStarting(ctx, func() error {
		return c.client.endpointDeleteByContainer(ctx, args.ContainerID)
	})
	switch {
	case err == nil, isCode(err, "endpoint-deleting"):
		return nil
	case isNotFound(err):
		return c.deleteLeftoverVeth()
	case unreachable(err):
		return c.queue()
	}
	return agentError("delete endpoint", err)
}

// deleteLeftoverVeth removes the host veth of an attachment the agent
// does not know (an ADD killed before it could roll back). Usually the
// link is gone or already queued for lazy teardown; deleting it is
// idempotent either way.
func (c *call) deleteLeftoverVeth() error {
	hostName, _ := VethNames(c.args.ContainerID)
	nl, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return kernelError("netlink", err)
	}
	defer nl.Close()
	link, err := nl.LinkByName(hostName)
	if isLinkNotFound(err) {
		return nil
	}
	if err != nil {
		return kernelError("look up "+hostName, err)
	}
	if err := nl.LinkDel(link); err != nil && !isLinkNotFound(err) {
		return kernelError("delete "+hostName, err)
	}
	return nil
}

// queue persists the deletion for the agent. Returns CNI error 11 when
// the queue is full, so the runtime retries later.
func (c *call) queue() error {
	hostName, _ := VethNames(c.args.ContainerID)
	e := &delqueue.Entry{
		ContainerID: c.args.ContainerID, IfName: c.args.IfName, Netns: c.args.Netns,
		Namespace: c.k8s.Namespace, Pod: c.k8s.Pod, HostInterface: hostName,
		IPs: c.prevIPs(), Queued: time.Now().UTC(),
	}
	if _, err := delqueue.Write(c.conf.DeleteQueueDir, e); err != nil {
		if errors.Is(err, delqueue.ErrFull) {
			return newError(types.ErrTryAgainLater, "agent unreachable and %v; try again later", err)
		}
		return newError(CodeDeleteQueue, "agent unreachable and %v", err)
	}
	return nil
}

// prevIPs returns the addresses of the DEL's prevResult, if it has one.
func (c *call) prevIPs() []string {
	if c.conf.RawPrevResult == nil {
		return nil
	}
	if err := version.ParsePrevResult(&c.conf.NetConf); err != nil {
		return nil
	}
	res, err := types100.NewResultFromResult(c.conf.PrevResult)
	if err != nil {
		return nil
	}
	var ips []string
	for _, ipc := range res.IPs {
		ips = append(ips, ipc.Address.IP.String())
	}
	return ips
}
