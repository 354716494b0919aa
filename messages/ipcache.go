package messages

import (
	"net/netip"

	"github.com/membrane-cni/membrane/pkg/endpoint"
	"github.com/membrane-cni/membrane/pkg/identity"
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
