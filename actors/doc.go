// Package actors holds Membrane's actor system (github.com/asynkron/protoactor-go),
// one file per actor:
//
//	agent (root supervisor, agent.go)
//	├── datapath   bounded worker pool for blocking kernel/disk work (datapath.go)
//	├── ipam       bitmap allocators, owner and lease holder per IP (ipam.go)
//	├── ipcache    IP/prefix -> identity, written to the datapath (ipcache.go)
//	├── policy     policy repository, per-identity policy, policy file (policy.go)
//	├── identity   label set -> numeric identity, refcounted (identity.go)
//	├── endpoints  endpoint manager: IDs, supervision, index rows (endpointmanager.go)
//	│   └── ep-<id>  one actor per endpoint (endpoint*.go)
//	└── gc         orphan garbage collector (gc.go)
//
// Code outside this package drives the agent only through System's typed
// methods (frontdoor.go); messages/ is private to it.
//
// Actors never block: no netlink, BPF, disk call or wait inside a
// Receive. An actor that needs an answer (from another actor, the pool or
// the state store) uses its requester (request.go) and continues when the
// answer arrives as a message. Actors keep their state unexported; what a
// restarted actor needs is rebuilt from the index (pkg/domain/index),
// the table each actor is the single writer of.
package actors
