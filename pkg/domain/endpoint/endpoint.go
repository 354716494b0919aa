package endpoint

import (
	"net/netip"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
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

// Model converts the record to its API form. ident may be nil.
func (e *Endpoint) Model(ident *models.Identity) *models.Endpoint {
	m := &models.Endpoint{
		ID:                     int64(e.ID),
		State:                  string(e.State),
		ContainerID:            e.ContainerID,
		ContainerName:          e.ContainerName,
		ContainerInterfaceName: e.ContainerInterfaceName,
		K8sNamespace:           e.Namespace,
		K8sPodName:             e.PodName,
		K8sUID:                 e.PodUID,
		Labels:                 e.Labels.Strings(),
		Identity:               ident,
		InterfaceName:          e.IfName,
		InterfaceIndex:         int64(e.IfIndex),
		Mac:                    e.MAC,
		HostMac:                e.HostMAC,
		Netns:                  e.Netns,
		PolicyRevision:         e.RealizedRevision,
		Regenerations:          e.Regenerations,
		LastError:              e.LastError,
		Created:                e.Created,
		StateChanged:           e.StateChanged,
	}
	if m.Labels == nil {
		m.Labels = []string{}
	}
	if e.IPv4.IsValid() || e.IPv6.IsValid() {
		m.Addressing = &models.AddressPair{}
		if e.IPv4.IsValid() {
			m.Addressing.IPv4 = e.IPv4.String()
		}
		if e.IPv6.IsValid() {
			m.Addressing.IPv6 = e.IPv6.String()
		}
	}
	if ident == nil && e.Identity != identity.IdentityUnknown {
		m.Identity = &models.Identity{ID: int64(e.Identity)}
	}
	return m
}
