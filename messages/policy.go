package messages

import (
	"net/netip"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// PolicyImport asks the policy actor to add or replace policies (all of
// them, in one revision). Reply: *PolicyResult after the index commit.
type PolicyImport struct {
	Policies []*policy.Policy
}

// PolicyDelete asks the policy actor to delete the policy Name
// ("namespace/name") or every policy whose metadata labels include
// Labels. Reply: *PolicyResult (Err wraps policy.ErrNotFound when Name
// matched nothing).
type PolicyDelete struct {
	Name   string
	Labels map[string]string
}

// PolicyResult answers PolicyImport and PolicyDelete.
type PolicyResult struct {
	Revision uint64
	Names    []string // imported, "namespace/name"
	Deleted  int
	Err      error
}

// ComputePolicy asks the policy actor for the policy of an identity, on
// behalf of endpoint Endpoint (which it then notifies when that policy
// changes). Reply: *PolicyComputed.
type ComputePolicy struct {
	Endpoint endpoint.ID
	Identity identity.NumericIdentity
	// NamedPorts are the endpoint's named ports: its ingress rules on
	// named ports resolve against them, and other endpoints' egress
	// rules on named ports reach it on them.
	NamedPorts policy.NamedPorts
}

// PolicyComputed answers ComputePolicy. Policy is shared and immutable;
// nil enforces nothing.
type PolicyComputed struct {
	Policy   *policy.MapState
	Revision uint64
}

// IdentityChanged tells the policy actor that the identity actor bound
// (Deleted false) or released an identity. No reply.
type IdentityChanged struct {
	ID      identity.NumericIdentity
	Labels  labels.Labels
	Deleted bool
}

// EndpointPolicyGone tells the policy actor that an endpoint no longer
// uses policy (deleted). No reply.
type EndpointPolicyGone struct {
	Endpoint endpoint.ID
}

// RegeneratePolicy is sent by the policy actor to the endpoint manager,
// which forwards it to endpoint ID's actor: the policy of its identity
// changed at Revision. It requests a policy-only regeneration (coalesced
// like every regeneration; no state write). No reply, unless Wait (the
// front door's LearnFQDN): then *EndpointResult once a regeneration that
// started after the request ended. Join (LearnFQDN) requests nothing:
// it is answered once the regeneration owed or running ends (which
// started after every request the endpoint had before this one: the
// policy actor's, sent before it answered the learn), at once when none
// is.
type RegeneratePolicy struct {
	ID       endpoint.ID
	Revision uint64
	Wait     bool
	Join     bool
}

// PolicyRemotePorts tells the policy actor, from the ipcache actor, the
// named ports of remote endpoints: Set records each owner's (an owner
// with no ports is forgotten). No reply.
type PolicyRemotePorts struct {
	Set []policy.EndpointPortsChange
}

// PolicyHostLabels tells the policy actor that the node's labels (its
// Node object's) changed: the host identity's labels, which host
// policies select by, are read again from the system's holder
// (actors.System.SetHostLabels). No reply.
type PolicyHostLabels struct{}

// PolicyHostSafePeers tells the policy actor the API server's addresses
// and TCP ports (its EndpointSlice, default/kubernetes), which the host
// firewall's safety net passes (datapath.HostPolicyDatapath
// SetHostSafePeers). No reply.
type PolicyHostSafePeers struct {
	Peers []netip.AddrPort
}

// PolicyServiceSet tells the policy actor a Kubernetes Service the
// toServices rules resolve against (Service nil: deleted). No reply.
type PolicyServiceSet struct {
	Namespace, Name string
	Service         *policy.Service
}
