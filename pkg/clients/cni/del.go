package cni

import (
	"context"
	"errors"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/clients/cni/skel"

	"github.com/membrane-cni/membrane/datapath/podnet"
	"github.com/membrane-cni/membrane/pkg/clients/cni/delqueue"
	"github.com/membrane-cni/membrane/pkg/domain/ifname"
)

// cmdDel detaches the pod, best effort by container ID and interface:
// it succeeds whenever nothing of the attachment remains or its removal
// is durably queued, and fails only when neither holds (the delete queue
// cannot be written). The agent deletes the attachment's endpoint (which
// releases the address and tears the host veth down, lazily: see
// docs/cni-notes.md); CNI_IFNAME is then deleted in the pod's netns if
// that still exists, so a later ADD there starts clean. A missing
// endpoint, netns or link is success. When the agent is unreachable or
// fails, the deletion is queued on disk for the agent to drain. A config
// or CNI_ARGS detail the plugin dislikes does not fail DEL (newDelCall).
func cmdDel(args *skel.CmdArgs) (retErr error) {
	pt := newPhaseTimer("DEL", args.ContainerID, args.IfName)
	defer func() { pt.write(retErr != nil) }()
	c := newDelCall(args)
	defer c.client.close()
	pt.mark("parse")
	if !ifname.Valid(args.IfName) {
		// ADD refuses such a name, so no attachment of it exists.
		warnf("DEL %s: CNI_IFNAME %q is not an interface name; nothing to delete", args.ContainerID, args.IfName)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.conf.timeout)
	defer cancel()
	err := retryStarting(ctx, func() error {
		return c.client.endpointDeleteAttachment(ctx, args.ContainerID, args.IfName)
	})
	pt.mark("delete-endpoint")
	tombstone := false
	switch {
	case err == nil, isCode(err, "endpoint-deleting"):
		// The agent took the host end out of service (down, renamed to
		// its tombstone) and deletes the pair later, with the pod end.
		tombstone = true
	case isNotFound(err), isCode(err, "invalid-argument"):
		// The agent has no such attachment (it refuses to create one with
		// an ID it calls invalid): only a leftover veth may remain.
		if err := c.deleteLeftoverVeth(); err != nil {
			warnf("DEL %s: %v; queueing the deletion", args.ContainerID, err)
			if err := c.queue(); err != nil {
				return err
			}
		}
	default:
		if !unreachable(err) {
			warnf("DEL %s: agent: %v; queueing the deletion", args.ContainerID, err)
		}
		if err := c.queue(); err != nil {
			return err
		}
	}
	pt.mark("queue-or-leftovers")
	c.deletePodInterface(tombstone)
	pt.mark("delete-pod-interface")
	return nil
}

// deleteLeftoverVeth removes the host veth of an attachment the agent
// does not know (an ADD killed before it could roll back). Usually the
// link is gone or already queued for lazy teardown; deleting it is
// idempotent either way.
func (c *call) deleteLeftoverVeth() error {
	hostName, _ := VethNames(c.args.ContainerID, c.args.IfName)
	nl, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return kernelError("netlink", err)
	}
	defer nl.Close()
	if err := podnet.DeleteVeth(nl, hostName); err != nil {
		return podnetError(err)
	}
	return nil
}

// deletePodInterface frees CNI_IFNAME in the pod's netns, as Cilium's
// DEL does, when the netns still exists, unless it is the pod end of
// another plugin's veth (membrane-cni chained after it: that plugin's
// DEL removes it). With tombstone (the agent deleted the endpoint, so it
// owns the pair's deferred deletion) a veth is set down and renamed to
// its tombstone (ifname.Tombstone): a fraction of a millisecond, where
// deleting it waits for an RCU barrier (~25 ms); the agent's deletion of
// the host end, or the netns's removal, deletes it. Otherwise (the
// agent does not know the attachment, or the deletion is queued) it is
// deleted. Failing is harmless (the netns's removal deletes it, and an
// ADD replaces it), so it is only reported.
func (c *call) deletePodInterface(tombstone bool) {
	if c.args.Netns == "" {
		return
	}
	h, err := netns.GetFromPath(c.args.Netns)
	if err != nil {
		return // the runtime removed the netns: the interface went with it
	}
	defer h.Close()
	nl, err := netlink.NewHandleAt(h, unix.NETLINK_ROUTE)
	if err != nil {
		warnf("DEL %s: netlink in netns %s: %v", c.args.ContainerID, c.args.Netns, err)
		return
	}
	defer nl.Close()
	if c.othersVeth(nl) {
		return
	}
	if tombstone {
		err = podnet.TombstoneVeth(nl, c.args.IfName)
		if err == nil || podnet.IsLinkNotFound(err) {
			return
		}
		warnf("DEL %s: %v; deleting it", c.args.ContainerID, err)
	}
	if err := podnet.DeleteLink(nl, c.args.IfName); err != nil {
		warnf("DEL %s: %v", c.args.ContainerID, err)
	}
}

// othersVeth reports whether CNI_IFNAME (looked up through nl, in the
// pod's netns) is a veth whose host end (in the plugin's netns, the
// host's) exists under a name other than membrane's for the attachment
// or its tombstone.
func (c *call) othersVeth(nl *netlink.Handle) bool {
	link, err := nl.LinkByName(c.args.IfName)
	if err != nil || link.Type() != "veth" || link.Attrs().ParentIndex == 0 {
		return false
	}
	host, err := netlink.LinkByIndex(link.Attrs().ParentIndex)
	if err != nil || host.Type() != "veth" || host.Attrs().ParentIndex != link.Attrs().Index {
		return false
	}
	ours, _ := VethNames(c.args.ContainerID, c.args.IfName)
	// The agent renamed its host end to the tombstone before answering.
	return host.Attrs().Name != ours && !ifname.IsTombstone(host.Attrs().Name)
}

// queue persists the deletion for the agent. Returns CNI error 11 when
// the queue is full, so the runtime retries later.
func (c *call) queue() error {
	hostName, _ := VethNames(c.args.ContainerID, c.args.IfName)
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
