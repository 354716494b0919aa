package endpoint

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
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
	// NamedPorts are the pod's named container ports (validated by the
	// source): other endpoints' egress rules on named ports reach it on
	// them.
	NamedPorts policy.NamedPorts
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

// Reasons a remote claim is refused: the values of RefusedError.Reason
// and of the refused-claims metric's reason label.
const (
	// RefusedNoOwner: the claim names no owning node (a MembraneEndpoint
	// without the node label, a record whose node disagrees with its key).
	RefusedNoOwner = "no-owner"
	// RefusedUnknownNode: the owning node is not in the node registry.
	RefusedUnknownNode = "unknown-node"
	// RefusedOutsideNode: an address lies outside the node's pod CIDRs.
	RefusedOutsideNode = "outside-node-cidrs"
	// RefusedNodeIP: the node address is not one of the node's.
	RefusedNodeIP = "foreign-node-ip"
	// RefusedReserved: the identity is a reserved one (host, world,
	// health, ...), which only this node assigns.
	RefusedReserved = "reserved-identity"
	// RefusedHealthOutsideNode: a node's health endpoint address lies
	// outside that node's pod CIDRs (or inside this node's own ranges),
	// or is a second address of one family.
	RefusedHealthOutsideNode = "health-outside-node-cidrs"
)

// RefusalLevel is the log level of a refusal: Info for an unknown node
// (the node may just not be seen yet: its claims are held and believed
// when it appears), Warn for the others (a claim that contradicts the
// node registry or takes a reserved identity).
func RefusalLevel(reason string) slog.Level {
	if reason == RefusedUnknownNode {
		return slog.LevelInfo
	}
	return slog.LevelWarn
}

// RefusedError is a remote claim the agent does not believe: Reason is
// one of the Refused* constants, Detail says what disagreed.
type RefusedError struct {
	Reason, Detail string
}

func (e *RefusedError) Error() string { return "remote claim refused: " + e.Reason + ": " + e.Detail }

// OwnerNode is a node as the node registry (Node objects, kvstore node
// records) knows it: what a remote claim of that node is checked against.
type OwnerNode struct {
	Name     string
	Addrs    []netip.Addr
	PodCIDRs []netip.Prefix
}

// CheckOwner returns nil when r may enter the ipcache as a claim of the
// node owner names (nil: the node is not known), else a *RefusedError.
// The trust model: another node (or whoever can write its endpoint
// objects) is believed only about addresses inside its own pod CIDRs, and
// only with a non-reserved identity and one of its own addresses as the
// tunnel endpoint (an unknown node address is allowed: no tunnel then).
func (r *Remote) CheckOwner(owner string, node *OwnerNode) error {
	if r.Identity.IsReserved() {
		return &RefusedError{Reason: RefusedReserved, Detail: fmt.Sprintf("identity %s", r.Identity)}
	}
	if owner == "" || (r.Node != "" && r.Node != owner) {
		return &RefusedError{Reason: RefusedNoOwner, Detail: fmt.Sprintf("owner %q, node %q", owner, r.Node)}
	}
	if node == nil || node.Name != owner {
		return &RefusedError{Reason: RefusedUnknownNode, Detail: fmt.Sprintf("node %q", owner)}
	}
	for _, ip := range r.IPs {
		ip = ip.Unmap()
		if !slices.ContainsFunc(node.PodCIDRs, func(p netip.Prefix) bool { return p.Contains(ip) }) {
			return &RefusedError{Reason: RefusedOutsideNode, Detail: fmt.Sprintf("%s not in node %s's pod CIDRs %v", ip, owner, node.PodCIDRs)}
		}
	}
	if nip := r.NodeIP.Unmap(); nip.IsValid() && !slices.ContainsFunc(node.Addrs, func(a netip.Addr) bool { return a.Unmap() == nip }) {
		return &RefusedError{Reason: RefusedNodeIP, Detail: fmt.Sprintf("node IP %s not one of node %s's addresses %v", nip, owner, node.Addrs)}
	}
	return nil
}

// CheckHealthIPs splits the health endpoint addresses node published into
// those that may enter the ipcache with the reserved identity health and
// the refused ones (each with a *RefusedError, reason
// RefusedHealthOutsideNode). The trust model: a node is believed about its
// health endpoint only inside its own pod CIDRs (the node registry's, not
// anything the node writes), never inside local (this node's own pod
// ranges), and for one address per family; so a node (or whoever writes
// its record or annotation) can give the identity health to at most one
// address per family of its own pods' ranges, never to another node's pod,
// a node address or this node's own.
func CheckHealthIPs(node *OwnerNode, ips []netip.Addr, local []netip.Prefix) (ok []netip.Addr, refused map[netip.Addr]*RefusedError) {
	in := func(ps []netip.Prefix, ip netip.Addr) bool {
		return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(ip) })
	}
	refuse := func(ip netip.Addr, detail string) {
		if refused == nil {
			refused = map[netip.Addr]*RefusedError{}
		}
		refused[ip] = &RefusedError{Reason: RefusedHealthOutsideNode, Detail: detail}
	}
	for _, ip := range ips {
		ip = ip.Unmap()
		switch {
		case !ip.IsValid() || ip.IsUnspecified() || ip.IsMulticast():
			refuse(ip, fmt.Sprintf("health address %q is not a unicast address", ip))
		case !in(node.PodCIDRs, ip):
			refuse(ip, fmt.Sprintf("health address %s not in node %s's pod CIDRs %v", ip, node.Name, node.PodCIDRs))
		case in(local, ip):
			refuse(ip, fmt.Sprintf("health address %s of node %s is in this node's pod ranges %v", ip, node.Name, local))
		case slices.ContainsFunc(ok, func(o netip.Addr) bool { return o.Is4() == ip.Is4() }):
			refuse(ip, fmt.Sprintf("node %s: a second health address of one family, %s", node.Name, ip))
		default:
			ok = append(ok, ip)
		}
	}
	return ok, refused
}
