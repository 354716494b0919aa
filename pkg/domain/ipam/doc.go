// Package ipam owns IP address bookkeeping: which addresses of a node's pod
// CIDRs are handed out, and to whom.
//
// A Range is a bitmap allocator over one CIDR (one bit per address, plus a
// map from address offset to owner for the allocated ones). It reserves the
// network address and the gateway (the first address after it) in both
// families, and the broadcast address in IPv4; these are never handed out.
// AllocateNext picks a free address with a Strategy: Sequential keeps a
// rotating cursor like CNI's host-local plugin, so a just-released address is
// not reused at once; Random starts the search at a random offset. Allocate
// claims one given address, which is how allocations are restored after a
// restart. A Pool groups at most one Range per Family.
//
// Nothing here is safe for concurrent use. A Range and a Pool are plain data
// structures meant to be owned by a single actor, which serialises access by
// construction; the package has no mutexes and does no I/O.
package ipam
