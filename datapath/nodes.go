package datapath

import (
	"context"
	"net/netip"
)

// RemoteNode is another node of the cluster as the datapath needs it: its
// underlay addresses (where its pods' traffic is routed or tunnelled to) and
// its pod CIDRs.
type RemoteNode struct {
	Name     string
	Addrs    []netip.Addr   // underlay (node) addresses, one per family at most
	PodCIDRs []netip.Prefix // the node's pod ranges
}

// NodeRouter is implemented by datapaths that connect this node's pods to
// other nodes' pods (routes in native-routing mode, a tunnel device in
// tunnel mode). SyncNodes makes the datapath match the full desired set of
// remote nodes: nodes missing from it lose their routes. It is idempotent
// and runs in the worker pool (it blocks on netlink).
type NodeRouter interface {
	SyncNodes(ctx context.Context, nodes []RemoteNode) error
}
