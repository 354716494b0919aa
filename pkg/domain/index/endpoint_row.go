package index

import (
	"net/netip"
	"sync/atomic"

	memdb "github.com/hashicorp/go-memdb"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// swapRow is a row of the endpoints, ipam and identities tables (the
// last never swapped, see Insert). key holds
// the fields the table indexes and never changes; rec is the current
// record.
//
// Rows change several times in their life, and most changes (an
// endpoint's state or revision, an address's claim, an identity's
// reference count) leave every indexed field as it is. go-memdb rewrites
// a row in every index (a path of radix nodes), so such a change only
// replaces rec: the radix trees stay as they are. A
// change to an indexed field (an endpoint's identity, say) inserts a new
// row.
//
// Records stay immutable (copy, change, store). What a read transaction
// no longer isolates is a record's non-indexed fields: a reader sees the
// record current when it reads the row, which is what every reader wants
// (none relies on a state, a claim or a count being from one snapshot).
type swapRow[K comparable, T any] struct {
	key K
	rec atomic.Pointer[T]
}

type (
	endpointRow = swapRow[endpointKey, endpoint.Endpoint]
	ipRow       = swapRow[netip.Addr, IP]
	identityRow = swapRow[identityKey, Identity]
)

// endpointKey is what the endpoints table indexes (the strings share the
// record's bytes).
type endpointKey struct {
	id                 endpoint.ID
	identity           identity.NumericIdentity
	stated             bool // State != StateNone: a row needs a state
	ipv4, ipv6         netip.Addr
	containerID        string
	namespace, podName string
}

// identityKey is what the identities table indexes.
type identityKey struct {
	id     identity.NumericIdentity
	labels string // Identity.Key
}

// keyOf returns the row key of ep. An endpoint whose identity is not
// resolved yet (a new one) is keyed under the identity its labels have in
// the identities table, if any: resolving it, the usual outcome, then
// changes no indexed field and costs no radix write. Readers filter on
// the record, so an endpoint is never listed under an identity it does
// not hold.
func keyOf(txn *memdb.Txn, ep *endpoint.Endpoint) endpointKey {
	k := endpointKey{
		id: ep.ID, identity: ep.Identity, stated: ep.State != endpoint.StateNone,
		ipv4: ep.IPv4, ipv6: ep.IPv6, containerID: ep.ContainerID,
		namespace: ep.Namespace, podName: ep.PodName,
	}
	if k.identity == identity.IdentityUnknown && len(ep.Labels) > 0 {
		if o, err := txn.First(TableIdentities, "labels", ep.Labels.Key()); err == nil && o != nil {
			k.identity = o.(*identityRow).key.id
		}
	}
	return k
}

// recOf returns the current record of a swap row.
func recOf[K comparable, T any](o any) *T { return o.(*swapRow[K, T]).rec.Load() }

func endpointOf(o any) *endpoint.Endpoint { return recOf[endpointKey, endpoint.Endpoint](o) }

// swapInsert replaces the record of the row whose primary key is id when
// its key is unchanged, else inserts a new row.
func swapInsert[K comparable, T any](txn *memdb.Txn, table string, id any, key K, rec *T) error {
	if o, err := txn.First(table, IndexID, id); err == nil && o != nil {
		if r := o.(*swapRow[K, T]); r.key == key {
			r.rec.Store(rec)
			return nil
		}
	}
	r := &swapRow[K, T]{key: key}
	r.rec.Store(rec)
	return txn.Insert(table, r)
}

// Insert writes obj into table within txn. For the endpoints, ipam and
// identities tables obj is the record (*endpoint.Endpoint, *IP,
// *Identity; see swapRow); for the others the row itself.
func Insert(txn *memdb.Txn, table string, obj any) error {
	switch o := obj.(type) {
	case *endpoint.Endpoint:
		if table == TableEndpoints {
			return swapInsert(txn, table, o.ID, keyOf(txn, o), o)
		}
	case *IP:
		if table == TableIPAM {
			ip := o.IP.Unmap()
			return swapInsert(txn, table, ip, ip, o)
		}
	case *Identity:
		if table == TableIdentities {
			// Never swapped: a reference count must agree with the
			// identity-leases table in every snapshot (the simulator's
			// invariant reads both in one transaction).
			r := &identityRow{key: identityKey{id: o.ID, labels: o.Key}}
			r.rec.Store(o)
			return txn.Insert(table, r)
		}
	}
	return txn.Insert(table, obj)
}

// Delete removes obj from table within txn. For the endpoints, ipam and
// identities tables obj is a record, of which only the primary key
// counts (ID, IP, ID).
func Delete(txn *memdb.Txn, table string, obj any) error {
	switch o := obj.(type) {
	case *endpoint.Endpoint:
		if table == TableEndpoints {
			return txn.Delete(table, &endpointRow{key: endpointKey{id: o.ID}})
		}
	case *IP:
		if table == TableIPAM {
			return txn.Delete(table, &ipRow{key: o.IP.Unmap()})
		}
	case *Identity:
		if table == TableIdentities {
			return txn.Delete(table, &identityRow{key: identityKey{id: o.ID}})
		}
	}
	return txn.Delete(table, obj)
}

// EndpointsIn lists the endpoints of a read transaction, by ID (for
// readers that read several tables in one transaction).
func EndpointsIn(txn *memdb.Txn) []*endpoint.Endpoint {
	return recs[endpointKey, endpoint.Endpoint](txn, TableEndpoints, IndexID)
}

// IPsIn lists the ipam rows of a read transaction, by IP.
func IPsIn(txn *memdb.Txn) []*IP { return recs[netip.Addr, IP](txn, TableIPAM, IndexID) }

// IdentitiesIn lists the identities of a read transaction, by ID.
func IdentitiesIn(txn *memdb.Txn) []*Identity {
	return recs[identityKey, Identity](txn, TableIdentities, IndexID)
}

// firstRec returns the record of the first row of table matching arg.
func firstRec[K comparable, T any](txn *memdb.Txn, table, idx string, arg any) (*T, bool) {
	o, err := txn.First(table, idx, arg)
	if err != nil || o == nil {
		return nil, false
	}
	return recOf[K, T](o), true
}

// recs lists the records of every row of table, in idx order.
func recs[K comparable, T any](txn *memdb.Txn, table, idx string) []*T {
	it, err := txn.Get(table, idx)
	if err != nil {
		return nil
	}
	var out []*T
	for o := it.Next(); o != nil; o = it.Next() {
		out = append(out, recOf[K, T](o))
	}
	return out
}
