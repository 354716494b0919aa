// Package index is Membrane's queryable in-memory index, built on
// github.com/hashicorp/go-memdb. It holds three tables:
//
//   - endpoints: one *endpoint.Endpoint per live endpoint; written only by
//     the endpoint manager actor, in batches.
//   - identities: one *Identity per allocated security identity; written
//     only by the identity actor.
//   - ipam: one *IP per allocated address; written only by the IPAM actor.
//
// Every table has exactly one writer, so a writer never races itself and a
// restarted actor rebuilds its state from its table. Readers (HTTP handlers,
// membranectl, the simulator's invariant checks) open read transactions
// directly and never go through a mailbox. Records are immutable once
// written: copy, change, write. Writers go through Insert and Delete: the
// endpoints and ipam tables keep a row per key and swap its record when no
// indexed field changes (see swapRow).
package index
