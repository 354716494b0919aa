package messages

import (
	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// The messages in this file are sent to the endpoint manager, which
// forwards those naming an endpoint (all but CreateEndpoint and
// EndpointChanged) to that endpoint's actor, keeping the original sender so
// the endpoint actor answers the caller directly.

// CreateEndpoint asks the endpoint manager to create an endpoint from Spec
// (ID 0 lets the manager pick one). Without Sync the reply is sent once the
// endpoint is in the index; with Sync, once its first regeneration
// finished or failed (then the endpoint is removed, without releasing its
// IP, which the caller owns). Reply: *EndpointResult.
type CreateEndpoint struct {
	Spec *endpoint.Endpoint
	Sync bool
}

// DeleteOptions are Cilium's endpoint delete options.
type DeleteOptions = endpoint.DeleteOptions

// DeleteEndpoint deletes an endpoint. Reply: *EndpointResult, sent once the
// endpoint is disconnected and out of the index.
type DeleteEndpoint struct {
	ID      endpoint.ID
	Options DeleteOptions
}

// PatchLabels changes an endpoint's labels, which gives it a new identity
// and a regeneration. With SetPorts it also sets the endpoint's named
// ports (Kubernetes mode, a pod cached only after its ADD). Reply:
// *EndpointResult once the new identity is set.
type PatchLabels struct {
	ID         endpoint.ID
	Add        labels.Labels
	Delete     labels.Labels
	SetPorts   bool
	NamedPorts policy.NamedPorts
	// SetAudit sets the endpoint's policy audit mode to Audit.
	SetAudit, Audit bool
	// Async answers once the endpoint has taken the change: the identity
	// acquisition and the regeneration go on in the endpoint, which
	// retries their failures itself and shows them in its status. Without
	// it the answer waits for the new identity and a durable write (or
	// the regeneration, for ports or audit mode alone).
	Async bool
}

// Regenerate requests a regeneration; requests coalesce (one running, one
// pending). Reply: *EndpointResult once a regeneration that started after
// the request completed (or failed).
type Regenerate struct {
	ID     endpoint.ID
	Reason string
}

// ProxyAck acknowledges that a proxy realised an endpoint's revision,
// or, with Rejected set, that it rejected the configuration the revision
// needs (Rejected is the proxy's reason). No reply.
type ProxyAck struct {
	ID       endpoint.ID
	Revision uint64
	ProxyID  string
	Rejected string
}

// EndpointResult answers the endpoint messages. Endpoint is the snapshot
// after the operation (nil if the endpoint does not exist).
type EndpointResult struct {
	Endpoint *endpoint.Endpoint
	Err      error
}

// Reply is an answer to send to To after the index commit that contains
// the change it reports, so a caller always reads its own writes.
type Reply struct {
	To      *actor.PID
	Message any
}

// EndpointChanged is sent by an endpoint actor to the endpoint manager
// with its new snapshot (Deleted removes it from the index). The manager
// batches these into index write transactions and then sends Replies. No
// reply.
type EndpointChanged struct {
	// From is the sending endpoint actor; the manager ignores changes from
	// an actor that no longer owns the endpoint ID.
	From     *actor.PID
	Endpoint *endpoint.Endpoint
	Deleted  bool
	Replies  []Reply
}

// RestoreEndpoints re-creates endpoints read from the state directory, in
// state restoring. Reply: *RestoreResult once every one of them holds its
// leases again (IP and identity) or failed; regeneration continues after.
type RestoreEndpoints struct {
	Endpoints []*endpoint.Endpoint
}

// RestoreResult answers RestoreEndpoints.
type RestoreResult struct {
	Restored []endpoint.ID
	// Failed maps endpoints that could not be restored to why; they were
	// deleted without releasing their addresses.
	Failed map[endpoint.ID]error
}
