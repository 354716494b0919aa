package messages

import (
	"net/netip"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// IPCacheEndpoint tells the ipcache actor an endpoint's addresses and
// identity (sent when the identity is resolved or changes); with
// Deleted, the endpoint's entries go. No reply.
type IPCacheEndpoint struct {
	Endpoint endpoint.ID
	IPs      []netip.Addr
	Identity identity.NumericIdentity
	Deleted  bool
}

// IPCacheCIDRs tells the ipcache actor the policy CIDR prefixes to add
// (with their local identities) and remove. No reply.
type IPCacheCIDRs struct {
	Upserts map[netip.Prefix]identity.NumericIdentity
	Deletes []netip.Prefix
}

// IPCachePrune tells the ipcache actor to make the datapath's ipcache
// hold exactly its entries, deleting what a previous agent left for
// endpoints deleted while no agent ran. Sent by the agent once restore
// has re-created every endpoint (whose claims then precede it in the
// actor's mailbox). No reply.
type IPCachePrune struct{}

// IPCacheHostAddr tells the ipcache actor that the host netns gained
// (or, with Deleted, lost) an address: the host identity's while the
// host has it. Addresses inside the pod ranges are ignored (gateways and
// endpoints claim those). No reply.
type IPCacheHostAddr struct {
	Addr    netip.Addr
	Deleted bool
}
