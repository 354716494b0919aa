package index

import (
	"net/netip"
	"sync/atomic"

	memdb "github.com/hashicorp/go-memdb"

	"github.com/membrane-cni/membrane/pkg/endpoint"
	"github.com/membrane-cni/membrane/pkg/identity"
)

// endpointRow is a row of the endpoints table. key holds the fields the
// table indexes and never changes; rec is the endpoint's current record.
//
// An endpoint's record changes five or six times in its life, and most
// changes (a state transition, a new revision, a policy) leave every
// indexed field as it is. go-memdb rewrites a row in every index (a path
// of radix nodes, each with a new watch channel, per index: ~30 KB and
// ~50 µs per row at 10,000 endpoints), so such a change only replaces
// rec: the row, and with it the radix trees, stay as they are. A change
// to an indexed field (an identity, an address) inserts a new row.
//
// Records stay immutable (copy, change, store). What a read transaction
// no longer isolates is a record's non-indexed fields: a reader sees the
// record current when it reads the row, which is what every reader wants
// (no reader relies on a state or a revision being from one snapshot).
type endpointRow struct {
	key endpointKey
	rec atomic.Pointer[endpoint.Endpoint]
}

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

func keyOf(ep *endpoint.Endpoint) endpointKey {
	return endpointKey{
		id: ep.ID, identity: ep.Identity, stated: ep.State != endpoint.StateNone,
		ipv4: ep.IPv4, ipv6: ep.IPv6, containerID: ep.ContainerID,
		namespace: ep.Namespace, podName: ep.PodName,
	}
}

func newEndpointRow(ep *endpoint.Endpoint) *endpointRow {
	r := &endpointRow{key: keyOf(ep)}
	r.rec.Store(ep)
	return r
}

// endpointOf returns the current record of an endpoints-table row.
func endpointOf(o any) *endpoint.Endpoint { return o.(*endpointRow).rec.Load() }

// Insert writes obj into table within txn: for the endpoints table obj is
// an *endpoint.Endpoint (see endpointRow), for the others the row itself.
func Insert(txn *memdb.Txn, table string, obj any) error {
	ep, ok := obj.(*endpoint.Endpoint)
	if !ok || table != TableEndpoints {
		return txn.Insert(table, obj)
	}
	if o, err := txn.First(TableEndpoints, IndexID, ep.ID); err == nil && o != nil {
		if r := o.(*endpointRow); r.key == keyOf(ep) {
			r.rec.Store(ep)
			return nil
		}
	}
	return txn.Insert(TableEndpoints, newEndpointRow(ep))
}

// Delete removes obj from table within txn: for the endpoints table obj
// is an *endpoint.Endpoint, of which only the ID counts.
func Delete(txn *memdb.Txn, table string, obj any) error {
	if ep, ok := obj.(*endpoint.Endpoint); ok && table == TableEndpoints {
		return txn.Delete(TableEndpoints, &endpointRow{key: endpointKey{id: ep.ID}})
	}
	return txn.Delete(table, obj)
}

// EndpointsIn lists the endpoints of a read transaction, by ID (for
// readers that read several tables in one transaction).
func EndpointsIn(txn *memdb.Txn) []*endpoint.Endpoint {
	it, err := txn.Get(TableEndpoints, IndexID)
	if err != nil {
		return nil
	}
	var out []*endpoint.Endpoint
	for o := it.Next(); o != nil; o = it.Next() {
		out = append(out, endpointOf(o))
	}
	return out
}
