// Package actors holds Membrane's actor system (github.com/asynkron/protoactor-go),
// one file per actor:
//
//	agent (root supervisor, agent.go)
//	├── datapath   bounded worker pool for blocking kernel/disk work (datapath.go)
//	├── ipam       bitmap allocators, owner and lease holder per IP (ipam.go)
//	├── identity   label set -> numeric identity, refcounted (identity.go)
//	└── endpoints  endpoint manager: IDs, supervision, index writer (endpointmanager.go)
//	    └── ep-<id>  one actor per endpoint (endpoint.go, endpoint_regen.go)
//
// Actors never block: there is no netlink, BPF, disk call or Future.Result
// inside a Receive. Blocking work goes to the datapath pool actor and the
// caller continues with ReenterAfter. Actors keep their state unexported;
// what a restarted actor needs is rebuilt from the index (pkg/domain/index), the
// table each actor is the single writer of.
package actors
