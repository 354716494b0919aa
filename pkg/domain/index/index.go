package index

import (
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"

	memdb "github.com/hashicorp/go-memdb"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// Index wraps the go-memdb database. It is safe for concurrent use: writers
// are serialised by go-memdb, readers see consistent snapshots.
type Index struct {
	db *memdb.MemDB
	// ipcacheLens are the prefix lengths the ipcache table holds, as
	// its writer last said (SetIPCacheLengths); nil: not known.
	ipcacheLens atomic.Pointer[IPCacheLengths]
}

// New creates an empty index.
func New() (*Index, error) {
	db, err := memdb.NewMemDB(Schema())
	if err != nil {
		return nil, fmt.Errorf("create index: %w", err)
	}
	return &Index{db: db}, nil
}

// WriteTxn opens a write transaction. Only the table's single writer calls
// it; the usual form is `txn := ix.WriteTxn(); defer txn.Abort(); ...; txn.Commit()`.
func (ix *Index) WriteTxn() *memdb.Txn { return ix.db.Txn(true) }

// ReadTxn opens a read transaction on a consistent snapshot.
func (ix *Index) ReadTxn() *memdb.Txn { return ix.db.Txn(false) }

// EndpointFilter selects endpoints; zero fields match everything.
type EndpointFilter struct {
	Namespace string
	PodName   string // requires Namespace
	State     endpoint.State
	Identity  identity.NumericIdentity
	// Labels must all be present on the endpoint (labels.Labels.Matches).
	Labels labels.Labels
	// Selector must match the endpoint's labels (key=v, key!=v, key, !key).
	Selector labels.Selector
	// IP is an IPv4 or IPv6 address the endpoint uses.
	IP netip.Addr
}

// Endpoint returns the endpoint with the given ID.
func (ix *Index) Endpoint(id endpoint.ID) (*endpoint.Endpoint, bool) {
	return firstEndpoint(ix.ReadTxn(), IndexID, id)
}

// EndpointByContainerID returns the endpoint of a container (of several
// attachments, the one with the lowest ID).
func (ix *Index) EndpointByContainerID(cid string) (*endpoint.Endpoint, bool) {
	if cid == "" {
		return nil, false
	}
	return firstEndpoint(ix.ReadTxn(), IndexContainerID, containerKey(cid))
}

// EndpointsByContainerID returns every endpoint of a container, by ID.
func (ix *Index) EndpointsByContainerID(cid string) []*endpoint.Endpoint {
	if cid == "" {
		return nil
	}
	var out []*endpoint.Endpoint
	it, err := ix.ReadTxn().Get(TableEndpoints, IndexContainerID, containerKey(cid))
	if err != nil {
		return nil
	}
	for o := it.Next(); o != nil; o = it.Next() {
		out = append(out, recOf[endpointKey, endpoint.Endpoint](o))
	}
	return out
}

// EndpointByAttachment returns the endpoint of a CNI attachment: the
// container's endpoint whose container interface is ifName.
func (ix *Index) EndpointByAttachment(cid, ifName string) (*endpoint.Endpoint, bool) {
	for _, ep := range ix.EndpointsByContainerID(cid) {
		if ep.ContainerInterfaceName == ifName {
			return ep, true
		}
	}
	return nil, false
}

// EndpointByPod returns the first endpoint of a pod.
func (ix *Index) EndpointByPod(namespace, pod string) (*endpoint.Endpoint, bool) {
	return firstEndpoint(ix.ReadTxn(), IndexPod, podKey(namespace, pod))
}

// EndpointByIP returns the endpoint using an address.
func (ix *Index) EndpointByIP(ip netip.Addr) (*endpoint.Endpoint, bool) {
	ip = ip.Unmap()
	idx := IndexIPv4
	if ip.Is6() {
		idx = IndexIPv6
	}
	return firstEndpoint(ix.ReadTxn(), idx, ip)
}

// Resolve finds the endpoint a parsed API reference names.
func (ix *Index) Resolve(ref endpoint.Ref) (*endpoint.Endpoint, bool) {
	switch ref.Kind {
	case endpoint.RefContainerID:
		return ix.EndpointByContainerID(ref.ContainerID)
	case endpoint.RefAttachment:
		return ix.EndpointByAttachment(ref.ContainerID, ref.IfName)
	case endpoint.RefPodName:
		return ix.EndpointByPod(ref.Namespace, ref.PodName)
	default:
		return ix.Endpoint(ref.ID)
	}
}

// Endpoints lists the endpoints matching f, by ID, using the most selective
// index available for the filter.
func (ix *Index) Endpoints(f EndpointFilter) []*endpoint.Endpoint {
	txn := ix.ReadTxn()
	var (
		it  memdb.ResultIterator
		err error
	)
	switch {
	case f.IP.IsValid():
		ep, ok := ix.EndpointByIP(f.IP)
		if !ok || !matches(ep, f) {
			return nil
		}
		return []*endpoint.Endpoint{ep}
	case f.Namespace != "" && f.PodName != "":
		it, err = txn.Get(TableEndpoints, IndexPod, f.Namespace+"/"+f.PodName+"/")
	case f.Namespace != "":
		it, err = txn.Get(TableEndpoints, IndexPod+"_prefix", f.Namespace+"/")
	case f.Identity != identity.IdentityUnknown:
		it, err = txn.Get(TableEndpoints, IndexIdentity, f.Identity)
	default: // a state filter too: matches checks it
		it, err = txn.Get(TableEndpoints, IndexID)
	}
	if err != nil {
		return nil // only possible with a schema bug; covered by tests
	}
	var out []*endpoint.Endpoint
	for o := it.Next(); o != nil; o = it.Next() {
		ep := endpointOf(o)
		if matches(ep, f) {
			out = append(out, ep)
		}
	}
	sortByID(out)
	return out
}

func matches(ep *endpoint.Endpoint, f EndpointFilter) bool {
	switch {
	case f.Namespace != "" && ep.Namespace != f.Namespace:
		return false
	case f.PodName != "" && ep.PodName != f.PodName:
		return false
	case f.State != endpoint.StateNone && ep.State != f.State:
		return false
	case f.Identity != identity.IdentityUnknown && ep.Identity != f.Identity:
		return false
	case len(f.Labels) > 0 && !ep.Labels.Matches(f.Labels):
		return false
	case len(f.Selector) > 0 && !f.Selector.Matches(ep.Labels):
		return false
	case f.IP.IsValid() && ep.IPv4 != f.IP.Unmap() && ep.IPv6 != f.IP.Unmap():
		return false
	}
	return true
}

func sortByID(eps []*endpoint.Endpoint) {
	// pdqsort is linear on already sorted input (the primary index) and
	// O(n log n) for the pod index, whose order is by name.
	slices.SortFunc(eps, func(a, b *endpoint.Endpoint) int { return int(a.ID) - int(b.ID) })
}

// CountEndpoints returns the number of endpoints and how many are in each state.
func (ix *Index) CountEndpoints() (total int, byState map[endpoint.State]int) {
	byState = make(map[endpoint.State]int)
	it, err := ix.ReadTxn().Get(TableEndpoints, IndexID)
	if err != nil {
		return 0, byState
	}
	for o := it.Next(); o != nil; o = it.Next() {
		total++
		byState[endpointOf(o).State]++
	}
	return total, byState
}

// Identity returns an identity row.
func (ix *Index) Identity(id identity.NumericIdentity) (*Identity, bool) {
	return firstRec[identityKey, Identity](ix.ReadTxn(), TableIdentities, IndexID, id)
}

// IdentityByLabels returns the identity row of a label set.
func (ix *Index) IdentityByLabels(ls labels.Labels) (*Identity, bool) {
	return firstRec[identityKey, Identity](ix.ReadTxn(), TableIdentities, "labels", ls.Key())
}

// Identities lists every identity row by ID.
func (ix *Index) Identities() []*Identity {
	return IdentitiesIn(ix.ReadTxn())
}

// IP returns the ipam row of an address.
func (ix *Index) IP(ip netip.Addr) (*IP, bool) {
	return firstRec[netip.Addr, IP](ix.ReadTxn(), TableIPAM, IndexID, ip.Unmap())
}

// IPs lists the allocated addresses of a family ("ipv4"/"ipv6"; "" for all), by IP.
func (ix *Index) IPs(family string) []*IP {
	rows := IPsIn(ix.ReadTxn())
	if family == "" {
		return rows
	}
	out := rows[:0]
	for _, r := range rows {
		if r.Family == family {
			out = append(out, r)
		}
	}
	return out
}

// IPsByOwner lists the addresses allocated to an owner (a scan).
func (ix *Index) IPsByOwner(owner string) []*IP {
	var out []*IP
	for _, r := range ix.IPs("") {
		if r.Owner == owner {
			out = append(out, r)
		}
	}
	return out
}

func firstEndpoint(txn *memdb.Txn, idx string, arg any) (*endpoint.Endpoint, bool) {
	return firstRec[endpointKey, endpoint.Endpoint](txn, TableEndpoints, idx, arg)
}

func first[T any](txn *memdb.Txn, table, idx string, arg any) (T, bool) {
	var zero T
	o, err := txn.First(table, idx, arg)
	if err != nil || o == nil {
		return zero, false
	}
	return o.(T), true
}

func all[T any](txn *memdb.Txn, table, idx string, args ...any) []T {
	it, err := txn.Get(table, idx, args...)
	if err != nil {
		return nil
	}
	var out []T
	for o := it.Next(); o != nil; o = it.Next() {
		out = append(out, o.(T))
	}
	return out
}

// IdentityLeases lists every identity lease.
func (ix *Index) IdentityLeases() []*IdentityLease {
	return all[*IdentityLease](ix.ReadTxn(), TableIdentityLeases, IndexID)
}
