package endpoint

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// ErrInvalidRemote is returned for a remote endpoint that cannot enter
// the ipcache (no address, an invalid address, no identity).
var ErrInvalidRemote = errors.New("invalid remote endpoint")

// Remote is an endpoint that runs on another node, as the ipcache needs
// it: its addresses, its cluster-wide identity, and the node that hosts
// it (the tunnel endpoint in tunnel mode). Sources of remote endpoints
// (the Kubernetes endpoint objects, the kvstore) hand these to the agent
// through System.UpsertRemoteEndpoints and friends.
type Remote struct {
	IPs      []netip.Addr
	Identity identity.NumericIdentity
	// Node is the hosting node's name (for logs and status only).
	Node string
	// NodeIP is the hosting node's address; invalid when unknown.
	NodeIP netip.Addr
}

// Validate returns ErrInvalidRemote (wrapped, naming the field) unless r
// has at least one valid address and a known identity.
func (r *Remote) Validate() error {
	if len(r.IPs) == 0 {
		return fmt.Errorf("%w: no addresses", ErrInvalidRemote)
	}
	for _, ip := range r.IPs {
		if !ip.IsValid() || ip.IsUnspecified() {
			return fmt.Errorf("%w: address %q", ErrInvalidRemote, ip)
		}
	}
	if r.Identity == identity.IdentityUnknown {
		return fmt.Errorf("%w: %s has no identity", ErrInvalidRemote, r.IPs[0])
	}
	return nil
}
