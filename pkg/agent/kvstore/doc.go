// Package kvstore is Membrane's kvstore mode: a real etcd, reached with
// go.etcd.io/etcd/client/v3, holds what the nodes of a cluster share.
//
//   - Client (client.go): the connection (endpoints, TLS), this node's
//     lease kept alive (granted again, and everything under it written
//     again, when it is lost), and the store's health for /v1/status.
//   - IdentityBackend (identity.go, identity_gc.go, watch.go): the
//     identity.ClusterBackend on etcd. One transaction per new label set,
//     references per node under the node's lease, a two-phase garbage
//     collection of unreferenced identities.
//   - Publisher (publish.go): this node and its local endpoints, written
//     under the lease from the agent's index, woken by its event hub.
//   - Mirror (mirror.go): every other node and its endpoints, watched and
//     handed to the agent through the RemoteSink and NodeSink interfaces.
//     An endpoint record is believed only as a claim of the node its key
//     names, inside that node's record's pod CIDRs, with one of its
//     addresses and a non-reserved identity; refused records are counted
//     (MirrorStats.Refused) and checked again when their node changes.
//     etcd holds no per-node authority: any agent with the etcd client
//     certificate can write any node's keys, node records included.
//
// The key layout is keys.go (and ARCHITECTURE.md). Watches re-list with
// mark-and-sweep after a compaction. Nothing here runs inside an actor:
// every etcd call happens on this package's goroutines.
//
// How it works (ARCHITECTURE.md has the map):
//
// `pkg/agent/kvstore` — kvstore mode (Config.Kvstore non-nil, `--kvstore
// etcd`) on go.etcd.io/etcd/client/v3: `client.go` the connection (TLS),
// the node lease kept alive (a lost lease is granted again and its keys
// written again through `OnLease` callbacks) and the health of /v1/status;
// `identity*.go` the etcd `identity.ClusterBackend` (allocation,
// references, the watched cache of used numbers, the GC); `publish.go`
// this node and its endpoints, from the index, woken by the event hub;
// `mirror.go` the other nodes' endpoints and nodes, fed to the agent
// through the `RemoteSink`/`NodeSink` interfaces it declares; `watch.go`
// the list-then-watch with re-list after compaction; `keys.go` the key
// layout. `pkg/agent/kvstore.go` wires it into the agent. Its tests embed
// etcd through `test/etcdtest` (embed server on loopback, TLS
// certificates, restart on the same data directory, a TCP proxy that cuts
// one client off).
//
// Kvstore keys (under `membrane/`, `pkg/agent/kvstore/keys.go`):
// `state/identities/v1/id/<N>` = labels key, `.../labels/<labels>` = N
// (created together only if both are absent, deleted together),
// `.../refs/<H>/<node>` under the node's lease (H: 128 bits of the label
// set's SHA-256), `.../gc/<H>` a GC mark; `state/nodes/v1/<node>` and
// `state/endpoints/v1/<node>/<id>` (JSON) under the node's lease. An
// allocation is one transaction: create labels/, id/ and the reference if
// labels/ and id/ are absent, else, if labels/ exists, add the reference
// and read the number (the loser of a race pays nothing more). The number
// is drawn at random among those a watched cache believes free; a taken
// one costs a retry. No locks anywhere. GC is two-phase and every step a
// guarded transaction: mark an identity with no reference; sweep it once
// this node has seen the mark for the grace period and there is still no
// reference and the same mark; adding a reference deletes the mark, so a
// referenced identity is never removed. Watches list, then watch from the
// listed revision; a compaction or a broken watch re-lists and the
// consumer replaces what it knew (mark-and-sweep). Nothing in kvstore runs
// inside an actor.
package kvstore
