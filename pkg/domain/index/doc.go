// Package index is Membrane's queryable in-memory index, built on
// github.com/hashicorp/go-memdb. Its tables (see Schema) are endpoints,
// identities, identity-leases, ipam, ipcache, policies and
// policy-revision.
//
// Every table has exactly one owner actor (the endpoint manager writes
// endpoints, IPAM ipam, identity identities and identity-leases, and so
// on), so an owner never races itself and a restarted owner rebuilds its
// state from its tables. The owners' changes are committed by the actor
// system's single index writer. Readers (HTTP handlers, membranectl, the
// simulator's invariant checks) open read transactions directly and never
// go through a mailbox. Records are immutable once written: copy, change,
// write. Writers go through Insert and Delete: the endpoints and ipam
// tables keep a row per key and swap its record when no indexed field
// changes (see swapRow).
//
// The index has no watches: go-memdb runs on the patched radix tree in
// third_party/go-immutable-radix, whose watch channels are all nil (they
// never fire). Readers learn of changes from the actors' answers and
// events, not by watching.
package index
