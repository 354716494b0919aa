package cni

import (
	"context"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/membrane-cni/membrane/pkg/clients/cni/skel"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// cmdStatus answers whether the plugin can serve ADD: the agent answers
// and serves a pool, and each of its pools (an ADD takes an address of
// every family) has a free address. Otherwise error 50 (the kernel state
// of running pods does not depend on the agent, so never 51).
func cmdStatus(args *skel.CmdArgs) error {
	c, err := newCall(args)
	if err != nil {
		return err
	}
	defer c.client.close()
	ctx, cancel := context.WithTimeout(context.Background(), c.conf.timeout)
	defer cancel()
	st, err := c.client.status(ctx)
	if err != nil {
		return newError(types.ErrPluginNotAvailable, "agent cannot serve ADD: %v", err)
	}
	if st.IPAM == nil || (st.IPAM.IPv4 == nil && st.IPAM.IPv6 == nil) {
		return newError(types.ErrPluginNotAvailable, "agent has no address pool")
	}
	for _, pool := range []*models.IPAMFamilyStatus{st.IPAM.IPv4, st.IPAM.IPv6} {
		if pool != nil && pool.Free <= 0 {
			return newError(types.ErrPluginNotAvailable, "agent's pool %s has no free address", pool.Cidr)
		}
	}
	return nil
}

// cmdGC asks the agent to remove every endpoint of this plugin whose
// attachment is not in cni.dev/valid-attachments (with its address and
// host veth).
func cmdGC(args *skel.CmdArgs) error {
	c, err := newCall(args)
	if err != nil {
		return err
	}
	defer c.client.close()
	valid := make([]models.GCAttachment, 0, len(c.conf.ValidAttachments))
	for _, a := range c.conf.ValidAttachments {
		valid = append(valid, models.GCAttachment{ContainerID: a.ContainerID, IfName: a.IfName})
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.conf.timeout)
	defer cancel()
	err = retryStarting(ctx, func() error { return c.client.gc(ctx, valid) })
	if unreachable(err) {
		return newError(types.ErrTryAgainLater, "gc: agent unreachable: %v", err)
	}
	if err != nil {
		return agentError("gc", err)
	}
	return nil
}
