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
package kvstore
