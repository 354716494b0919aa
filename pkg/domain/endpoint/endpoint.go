package endpoint

import (
	"net/netip"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/domain/service"
)

// ID is an endpoint ID, 1..65535 (0 means "let the agent pick").
type ID uint16

// MaxID is the largest endpoint ID.
const MaxID = 65535

// Endpoint is an immutable snapshot of one endpoint. The endpoint actor owns
// the live value; it publishes copies to the endpoint manager, which stores
// them in the index. Never mutate an Endpoint read from the index: Clone it.
type Endpoint struct {
	ID                     ID
	ContainerID            string
	ContainerName          string
	ContainerInterfaceName string
	Namespace              string
	PodName                string
	PodUID                 string
	Labels                 labels.Labels
	IPv4                   netip.Addr
	IPv6                   netip.Addr
	IfName                 string
	IfIndex                int
	MAC                    string
	HostMAC                string
	Netns                  string
	// NamedPorts are the ports the pod's containers declare by name;
	// ingress rules on named ports resolve against them.
	NamedPorts policy.NamedPorts
	// PolicyAudit is the endpoint's policy audit mode (Cilium's
	// per-endpoint PolicyAuditMode): what its policy would drop passes
	// and is reported with the verdict audit (drop reason policy-audit).
	PolicyAudit bool
	// Chained says another CNI plugin made the host interface and gave
	// the addresses (CNI chaining, generic veth): the agent attaches its
	// programs to IfName and claims no address in its IPAM; the link,
	// its routes and sysctls stay the other plugin's.
	Chained bool
	// HostPorts are the pod's port mappings the agent translates in BPF
	// (kube-proxy replacement): HostPort services on the node's
	// addresses, whose one backend is this endpoint.
	HostPorts []service.HostPort

	State    State
	Identity identity.NumericIdentity
	// DesiredRevision is bumped by every regeneration request;
	// RealizedRevision is the revision the last completed regeneration built.
	DesiredRevision  uint64
	RealizedRevision uint64
	Regenerations    uint64
	// Policy is the policy the next (or last) regeneration realises,
	// computed by the policy actor for Identity and shared by every
	// endpoint with that identity; nil enforces nothing. It is derived
	// state: never written to disk.
	Policy    *policy.MapState
	LastError string
	// Deleting holds the delete options once State is disconnecting, so a
	// restarted endpoint actor finishes the delete the same way.
	Deleting     DeleteOptions
	Created      time.Time
	StateChanged time.Time
}

// DeleteOptions are Cilium's endpoint delete options.
type DeleteOptions struct {
	// NoIPRelease keeps the endpoint's addresses reserved for their owner
	// (the caller), without expiry, until the owner releases them
	// (DELETE /v1/ipam/{ip}) or an endpoint claims them again.
	NoIPRelease bool
	// NoIdentityRelease is Cilium's flag for a delete that must not drop
	// an identity reference the endpoint did not take itself (a restored
	// endpoint cleaned up before it re-acquired its identity). References
	// are counted per holder, so a delete drops exactly the references
	// the endpoint's actor took, with or without it: the flag never
	// leaks a reference and never drops another endpoint's.
	NoIdentityRelease bool
}

// Clone returns a shallow copy that may be modified; Labels is shared and
// must be replaced, not modified in place.
func (e *Endpoint) Clone() *Endpoint {
	c := *e
	return &c
}

// PodKey returns "namespace/pod", or "" when the pod is not named.
func (e *Endpoint) PodKey() string {
	if e.Namespace == "" && e.PodName == "" {
		return ""
	}
	return e.Namespace + "/" + e.PodName
}
