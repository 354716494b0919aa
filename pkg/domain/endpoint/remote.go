package endpoint

import (
	"net/netip"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// Remote is an endpoint that runs on another node, as the ipcache needs
// it: its addresses, its cluster-wide identity, and the node that hosts
// it (the tunnel endpoint in tunnel mode).
type Remote struct {
	IPs      []netip.Addr
	Identity identity.NumericIdentity
	// Node is the hosting node's name (for logs and status only).
	Node string
	// NodeIP is the hosting node's address; invalid when unknown.
	NodeIP netip.Addr
}
