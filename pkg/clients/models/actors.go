package models

import "time"

// Actor is one actor's published snapshot (GET /v1/actors).
type Actor struct {
	// Path is the actor's PID ID, e.g. "agent/endpoints/ep-12".
	Path string `json:"path"`
	// Kind is agent, datapath, ipam, identity, endpoints or endpoint.
	Kind string `json:"kind"`
	// State is the endpoint's lifecycle state, or "running".
	State      string     `json:"state"`
	StateSince *time.Time `json:"state-since,omitempty"`
	// Operation is what the actor waits for or handles; empty when idle.
	Operation      string     `json:"operation,omitempty"`
	OperationSince *time.Time `json:"operation-since,omitempty"`
	// BusySeconds is how long the actor has been in its operation (or, for
	// an endpoint that is not ready, in its state); 0 when idle.
	BusySeconds  float64 `json:"busy-seconds,omitempty"`
	MailboxDepth int64   `json:"mailbox-depth"`
	Processed    int64   `json:"processed"`
	Restarts     int64   `json:"restarts"`
	LastError    string  `json:"last-error,omitempty"`
	// Endpoint is set for endpoint actors.
	Endpoint *ActorEndpoint `json:"endpoint,omitempty"`
	// L7Proxy is set for the L7 proxy's row (kind "l7-proxy", path
	// "agent/l7-proxy"): a process the agent supervises, not an actor.
	L7Proxy *L7ProxyStatus `json:"l7-proxy,omitempty"`
	// Reconciler is set for the actors that write the kernel through a
	// reconciler (ipcache, nodes, services): what they have not written.
	Reconciler *ActorReconciler `json:"reconciler,omitempty"`
}

// ActorReconciler is what an actor's reconciler has not yet written to
// the datapath.
type ActorReconciler struct {
	// Pending counts the keys (prefixes, frontends) not yet written as
	// desired: due, being written or failed.
	Pending int `json:"pending"`
	// Failed counts the keys whose last write failed; they are retried
	// with backoff.
	Failed int `json:"failed"`
	// Failures counts the consecutive failed writes (a node sync's
	// included); LastError is the last one's error. A success resets both.
	Failures  int    `json:"failures"`
	LastError string `json:"last-error,omitempty"`
}

// ActorEndpoint is what an endpoint actor adds to its snapshot.
type ActorEndpoint struct {
	ID               int64  `json:"id"`
	DesiredRevision  uint64 `json:"desired-revision"`
	RealizedRevision uint64 `json:"realized-revision"`
	// RegenerationsRun, Coalesced and Failed count since the actor (this
	// incarnation) started.
	RegenerationsRun       uint64 `json:"regenerations-run"`
	RegenerationsCoalesced uint64 `json:"regenerations-coalesced"`
	RegenerationsFailed    uint64 `json:"regenerations-failed"`
	// LastRegeneration is when the last successful regeneration ended;
	// LastPhasesMs its duration by phase in milliseconds.
	LastRegeneration *time.Time         `json:"last-regeneration,omitempty"`
	LastPhasesMs     map[string]float64 `json:"last-phases-ms,omitempty"`
}
