package identity

import (
	"strconv"

	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// NumericIdentity is the number a security identity is known by in the
// datapath and in policy.
type NumericIdentity uint32

const (
	// IdentityUnknown is the zero value: no identity resolved yet.
	IdentityUnknown NumericIdentity = 0
	// ReservedHost is the local host (labels reserved:host).
	ReservedHost NumericIdentity = 1
	// ReservedWorld is everything outside the cluster (reserved:world).
	ReservedWorld NumericIdentity = 2
	// ReservedUnmanaged is an endpoint not managed by membrane (reserved:unmanaged).
	ReservedUnmanaged NumericIdentity = 3
	// ReservedHealth is the health-check endpoint (reserved:health).
	ReservedHealth NumericIdentity = 4
	// ReservedInit is an endpoint whose labels are not known yet (reserved:init).
	ReservedInit NumericIdentity = 5
	// ReservedRemoteNode is every other node's address, from the node
	// registry (reserved:remote-node), as in Cilium.
	ReservedRemoteNode NumericIdentity = 6
	// ReservedKubeAPIServer is an address of the API server's own
	// EndpointSlice (default/kubernetes) that is not this node's: labels
	// reserved:kube-apiserver and reserved:remote-node, as in Cilium.
	ReservedKubeAPIServer NumericIdentity = 7
	// ReservedIngress is Cilium's ingress proxy (reserved:ingress, its
	// number 8). Membrane runs no ingress proxy and never gives it to
	// traffic: the `ingress` entity is accepted and selects nothing.
	ReservedIngress NumericIdentity = 8
	// maxReserved is the last reserved identity with labels.
	maxReserved = ReservedIngress
	// MinLocalIdentity is the first identity handed out for label sets.
	// Identities 1 to 255 form the reserved range, of which 1 to 8 are used.
	MinLocalIdentity NumericIdentity = 256
	// MinNodeIdentity is the first per-node identity
	// (--enable-node-selector-labels: other nodes' addresses get an
	// identity per distinct label set of their Node objects, allocated by
	// each agent for itself). Cilium's remote-node scope (0x02 << 24):
	// above the CIDR identities' start (1 << 24) and beyond the 24 bits a
	// VNI or a mark carries, so such an identity never crosses a tunnel.
	MinNodeIdentity NumericIdentity = 0x02000000
	// MaxNodeIdentity is the last per-node identity.
	MaxNodeIdentity NumericIdentity = 0x02ffffff
)

// IsNode reports whether id is a per-node identity.
func IsNode(id NumericIdentity) bool { return id >= MinNodeIdentity && id <= MaxNodeIdentity }

// reservedName returns the label key of a reserved identity, or "" when id
// has none.
func reservedName(id NumericIdentity) string {
	switch id {
	case ReservedHost:
		return "host"
	case ReservedWorld:
		return "world"
	case ReservedUnmanaged:
		return "unmanaged"
	case ReservedHealth:
		return "health"
	case ReservedInit:
		return "init"
	case ReservedRemoteNode:
		return "remote-node"
	case ReservedKubeAPIServer:
		return "kube-apiserver"
	case ReservedIngress:
		return "ingress"
	}
	return ""
}

// reservedByName is the inverse of reservedName.
func reservedByName(name string) (NumericIdentity, bool) {
	for id := ReservedHost; id <= maxReserved; id++ {
		if reservedName(id) == name {
			return id, true
		}
	}
	return IdentityUnknown, false
}

// String returns "unknown" for IdentityUnknown, the name of a reserved
// identity ("host", "world", ...), and the decimal number otherwise.
func (id NumericIdentity) String() string {
	if id == IdentityUnknown {
		return "unknown"
	}
	if name := reservedName(id); name != "" {
		return name
	}
	return strconv.FormatUint(uint64(id), 10)
}

// IsReserved reports whether id lies in the reserved range 1 to 255. Such
// identities are never allocated for label sets nor reference counted.
func (id NumericIdentity) IsReserved() bool {
	return id > IdentityUnknown && id < MinLocalIdentity
}

// ReservedLabels returns the label set of a reserved identity: reserved:host,
// reserved:world, reserved:unmanaged, reserved:health, reserved:init,
// reserved:remote-node, or for ReservedKubeAPIServer reserved:kube-apiserver
// with reserved:remote-node (Cilium's). It returns false for any other
// identity, including unused reserved numbers.
func ReservedLabels(id NumericIdentity) (labels.Labels, bool) {
	name := reservedName(id)
	if name == "" {
		return nil, false
	}
	if id == ReservedKubeAPIServer {
		return labels.Labels{{Source: labels.SourceReserved, Key: name}, {Source: labels.SourceReserved, Key: "remote-node"}}, true
	}
	return labels.Labels{{Source: labels.SourceReserved, Key: name}}, true
}

// LookupReserved returns the reserved identity for a label set that consists
// of exactly one reserved:* label with an empty value, e.g. {reserved:health}
// gives ReservedHealth, or is ReservedKubeAPIServer's.
func LookupReserved(ls labels.Labels) (NumericIdentity, bool) {
	if want, _ := ReservedLabels(ReservedKubeAPIServer); ls.Equal(want) {
		return ReservedKubeAPIServer, true
	}
	if len(ls) != 1 || ls[0].Source != labels.SourceReserved || ls[0].Value != "" {
		return IdentityUnknown, false
	}
	id, ok := reservedByName(ls[0].Key)
	if id == ReservedKubeAPIServer {
		return IdentityUnknown, false // its labels are two
	}
	return id, ok
}

// reservedIdentity returns the Identity of reserved id, which must have
// labels. Reserved identities are not reference counted: RefCount is 0.
func reservedIdentity(id NumericIdentity) Identity {
	ls, _ := ReservedLabels(id)
	return Identity{ID: id, Labels: ls}
}

// Identity is a numeric identity bound to its label set. Labels is shared
// with the allocator and must not be modified.
type Identity struct {
	ID       NumericIdentity
	Labels   labels.Labels
	RefCount int
}
