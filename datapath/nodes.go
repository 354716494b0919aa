package datapath

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// RemoteNode is another node of the cluster as the datapath needs it: its
// underlay addresses (where its pods' traffic is routed or tunnelled to) and
// its pod CIDRs.
type RemoteNode struct {
	Name     string
	Addrs    []netip.Addr   // underlay (node) addresses, one per family at most
	PodCIDRs []netip.Prefix // the node's pod ranges
	// Labels are the node's labels (its Node object's; per-node
	// identities, actors.Config.NodeSelectorLabels). Routing ignores them.
	Labels map[string]string
	// HealthIPs are the addresses of the node's health endpoint as the
	// node published them (at most one per family). They enter the
	// ipcache with the identity health only inside the node's own pod
	// CIDRs (the nodes actor refuses the others). Routing ignores them.
	HealthIPs []netip.Addr
}

// NodeRouter is implemented by datapaths that connect this node's pods to
// other nodes' pods (routes in native-routing mode, a tunnel device in
// tunnel mode). SyncNodes makes the datapath match the full desired set of
// remote nodes: nodes missing from it lose their routes. It is idempotent
// and runs in the worker pool (it blocks on netlink).
type NodeRouter interface {
	SyncNodes(ctx context.Context, nodes []RemoteNode) error
}

// ErrInvalidNode is wrapped by ValidateNodes' errors.
var ErrInvalidNode = errors.New("invalid remote node")

// maxNodes bounds one source's node set.
const maxNodes = 5000

// ValidateNodes checks one source's full set: unique non-empty names
// (at most 253 bytes, no '/' or spaces), at most one address per family,
// every address a valid unicast one, pod CIDRs masked, and no pod CIDR
// overlapping another's (of this node or another). A node without
// addresses or pod CIDRs (a Kubernetes node before its podCIDR is
// assigned) is valid: there is nothing to route to it yet.
func ValidateNodes(nodes []RemoteNode) error {
	if err := CheckNodes(nodes); err != nil {
		return err
	}
	if a, b, ok := FirstOverlap(nodes); ok {
		return fmt.Errorf("node %q: pod CIDR %s overlaps node %q's %s: %w", a.Node, a.Prefix, b.Node, b.Prefix, ErrInvalidNode)
	}
	return nil
}

// CheckNodes is ValidateNodes without the overlap check: every node's
// fields and unique names. (Overlaps between otherwise valid nodes are a
// conflict the nodes actor resolves, not malformed input.)
func CheckNodes(nodes []RemoteNode) error {
	if len(nodes) > maxNodes {
		return fmt.Errorf("%d nodes: at most %d: %w", len(nodes), maxNodes, ErrInvalidNode)
	}
	names := make(map[string]bool, len(nodes))
	for i, n := range nodes {
		if err := validateNode(n); err != nil {
			return fmt.Errorf("node %d (%q): %w", i, n.Name, err)
		}
		if names[n.Name] {
			return fmt.Errorf("node %q listed twice: %w", n.Name, ErrInvalidNode)
		}
		names[n.Name] = true
	}
	return nil
}

// NodeCIDR is one pod CIDR of a node.
type NodeCIDR struct {
	Node   string
	Prefix netip.Prefix
}

// FirstOverlap finds two overlapping pod CIDRs among nodes' (of one node
// or of two), in O(n log n): the CIDRs sorted by first address, each is
// compared with the one reaching furthest among those before it.
func FirstOverlap(nodes []RemoteNode) (a, b NodeCIDR, ok bool) {
	var all []NodeCIDR
	for _, n := range nodes {
		for _, p := range n.PodCIDRs {
			all = append(all, NodeCIDR{n.Name, p.Masked()})
		}
	}
	slices.SortFunc(all, func(x, y NodeCIDR) int {
		if c := x.Prefix.Addr().Compare(y.Prefix.Addr()); c != 0 {
			return c
		}
		return x.Prefix.Bits() - y.Prefix.Bits()
	})
	var reach NodeCIDR // the CIDR ending furthest so far (same family)
	for _, c := range all {
		if reach.Prefix.IsValid() && reach.Prefix.Addr().BitLen() == c.Prefix.Addr().BitLen() &&
			c.Prefix.Addr().Compare(lastAddr(reach.Prefix)) <= 0 {
			return reach, c, true
		}
		if !reach.Prefix.IsValid() || reach.Prefix.Addr().BitLen() != c.Prefix.Addr().BitLen() ||
			lastAddr(c.Prefix).Compare(lastAddr(reach.Prefix)) > 0 {
			reach = c
		}
	}
	return NodeCIDR{}, NodeCIDR{}, false
}

// lastAddr is the last address of p (masked).
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func validateNode(n RemoteNode) error {
	if n.Name == "" || len(n.Name) > 253 || strings.ContainsAny(n.Name, "/ \t\n") {
		return fmt.Errorf("name: want 1-253 bytes without '/' or spaces: %w", ErrInvalidNode)
	}
	if len(n.Addrs) > 2 {
		return fmt.Errorf("addresses: want at most 2 (one per family), got %d: %w", len(n.Addrs), ErrInvalidNode)
	}
	fams := map[bool]bool{}
	for _, a := range n.Addrs {
		if !a.IsValid() || a.Zone() != "" || !a.Unmap().IsGlobalUnicast() && !a.Unmap().IsPrivate() {
			return fmt.Errorf("address %s: want a unicast address: %w", a, ErrInvalidNode)
		}
		if fams[a.Unmap().Is4()] {
			return fmt.Errorf("two addresses of one family: %w", ErrInvalidNode)
		}
		fams[a.Unmap().Is4()] = true
	}
	if len(n.HealthIPs) > 2 {
		return fmt.Errorf("health addresses: want at most 2 (one per family), got %d: %w", len(n.HealthIPs), ErrInvalidNode)
	}
	for _, a := range n.HealthIPs {
		if !a.IsValid() || a.Zone() != "" || a.IsUnspecified() {
			return fmt.Errorf("health address %s: want a unicast address: %w", a, ErrInvalidNode)
		}
	}
	if len(n.PodCIDRs) > 4 {
		return fmt.Errorf("pod CIDRs: want at most 4, got %d: %w", len(n.PodCIDRs), ErrInvalidNode)
	}
	for _, p := range n.PodCIDRs {
		if !p.IsValid() || p != p.Masked() || p.Addr().Is4In6() {
			return fmt.Errorf("pod CIDR %s: want a masked prefix: %w", p, ErrInvalidNode)
		}
	}
	return nil
}

// PodCIDROverlap returns the first pod CIDR of nodes that overlaps one of
// local (this node's own pod ranges), with its node's name.
func PodCIDROverlap(nodes []RemoteNode, local []netip.Prefix) (string, netip.Prefix, bool) {
	for _, n := range nodes {
		for _, p := range n.PodCIDRs {
			for _, l := range local {
				if l.IsValid() && p.Overlaps(l) {
					return n.Name, p, true
				}
			}
		}
	}
	return "", netip.Prefix{}, false
}

// coverPrefixes is the smallest list of the prefixes in ps that covers
// them all (prefixes inside another are dropped, duplicates too), masked
// and sorted: IPv4 before IPv6, then by address and length.
func coverPrefixes(ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if !p.IsValid() {
			continue
		}
		p = p.Masked()
		covered := false
		for _, q := range ps {
			q = q.Masked()
			if q.IsValid() && q != p && q.Bits() < p.Bits() && q.Contains(p.Addr()) {
				covered = true
				break
			}
		}
		if !covered && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return out
}
