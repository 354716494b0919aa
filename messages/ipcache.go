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

// IPCacheRemote tells the ipcache actor about endpoints on other nodes
// reported by Origin: Upserts set (or replace) Origin's claims on their
// addresses, Deletes drop Origin's claims. A full replacement arrives as
// a run of messages sharing Replace (non-zero): the first has First, the
// last has Last, and the last drops every claim of Origin that no message
// of the run (nor an upsert meanwhile) set. The front door bounds each
// message's size. Reply: *IPCacheRemoteResult, after the index commit.
type IPCacheRemote struct {
	Origin  string
	Upserts []endpoint.Remote
	Deletes []netip.Addr
	Replace uint64
	First   bool
	Last    bool
}

// IPCacheRemoteResult answers IPCacheRemote. Err is set when a
// replacement run was interrupted (a newer run of the same origin began,
// or the actor restarted); the caller repeats it.
type IPCacheRemoteResult struct {
	Err error
}

// IPCacheReservedSet tells the ipcache actor the full set of addresses
// of one reserved source (index.SourceNode: the other nodes' addresses,
// identity remote-node; index.SourceKubeAPIServer: the API server's,
// identity kube-apiserver): the source's claims are exactly Addrs
// afterwards. No reply.
type IPCacheReservedSet struct {
	Source string
	Addrs  []netip.Addr
	// Identities gives an address of Addrs its own identity instead of
	// the source's (index.SourceNode with per-node identities:
	// actors.Config.NodeSelectorLabels).
	Identities map[netip.Addr]identity.NumericIdentity
}
