package index

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	memdb "github.com/hashicorp/go-memdb"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// Table names.
const (
	TableEndpoints  = "endpoints"
	TableIdentities = "identities"
	TableIPAM       = "ipam"
	// TableIdentityLeases has one row per (identity, holder) reference.
	TableIdentityLeases = "identity-leases"
)

// Index names of the endpoints table.
const (
	// IndexID ("id") is the primary key: GET/DELETE /v1/endpoint/<n>.
	IndexID = "id"
	// IndexContainerID serves container-id:<id> and cni-attachment-id
	// references and the CNI DEL batch delete. Not unique: a container may
	// have several attachments (the endpoint manager keeps each (container
	// ID, interface) to one endpoint).
	IndexContainerID = "container-id"
	// IndexIPv4 and IndexIPv6 serve "which endpoint has this IP" (duplicate
	// check on PUT, refusing DELETE /v1/ipam of an IP in use).
	IndexIPv4 = "ipv4"
	IndexIPv6 = "ipv6"
	// IndexPod serves pod-name:<ns>/<pod> references and the namespace and
	// pod filters of GET /v1/endpoint (prefix "ns/").
	IndexPod = "pod"
	// IndexIdentity serves the identity filter and "which endpoints use
	// identity N" (policy recomputation, identity GC checks).
	IndexIdentity = "identity"
	// There is no state index: the state filter and the status counts
	// scan the primary key (a state is not selective: most endpoints are
	// ready), and every row would cost a radix leaf rewritten on each
	// state change (heap per endpoint is a target).
)

// Identity is a row of the identities table.
type Identity struct {
	ID     identity.NumericIdentity
	Labels labels.Labels
	Key    string // Labels.Key(), the unique label-set key
	// RefCount is the number of local references (endpoint actors on
	// this node); 0 for an identity known only from the cluster store.
	RefCount int
	// Cluster marks an identity the cluster-wide store holds (set only
	// when the agent runs with an identity backend).
	Cluster bool
}

// IP is a row of the ipam table.
type IP struct {
	IP     netip.Addr
	Family string // "ipv4" or "ipv6"
	Owner  string // as given to POST /v1/ipam, e.g. "default/web-0"
	// Endpoint is the endpoint that claimed the IP, 0 while unclaimed.
	Endpoint endpoint.ID
	// Holder is the PID ID of the endpoint actor holding the lease ("" if none).
	Holder string
	// Kept marks an address a delete with NoIPRelease left reserved for
	// its owner: it never expires; it ends with the owner's release or
	// becomes an ordinary claim again.
	Kept bool
}

// IdentityLease is a row of the identity-leases table: Holder (the PID ID
// of an endpoint actor) holds one reference on identity ID.
type IdentityLease struct {
	ID     identity.NumericIdentity
	Holder string
}

// Schema returns the go-memdb schema of the index.
func Schema() *memdb.DBSchema {
	return &memdb.DBSchema{Tables: map[string]*memdb.TableSchema{
		TableEndpoints:      endpointsTable(),
		TableIdentities:     identitiesTable(),
		TableIPAM:           ipamTable(),
		TableIdentityLeases: leasesTable(),
		TablePolicies:       policiesTable(),
		TablePolicyRevision: policyRevisionTable(),
		TablePolicyServices: policyServicesTable(),
		TableIPCache:        ipcacheTable(),
		TableServices:       servicesTable(),
		TableNodes:          nodesTable(),
	}}
}

func endpointsTable() *memdb.TableSchema {
	key := func(o any) *endpointKey { return &o.(*endpointRow).key }
	return &memdb.TableSchema{Name: TableEndpoints, Indexes: map[string]*memdb.IndexSchema{
		IndexID: {Name: IndexID, Unique: true, Indexer: uint16Index(func(o any) uint16 { return uint16(key(o).id) })},
		IndexContainerID: {Name: IndexContainerID, AllowMissing: true,
			Indexer: stringIndex(func(o any) string { return containerKey(key(o).containerID) })},
		IndexIPv4: {Name: IndexIPv4, Unique: true, AllowMissing: true,
			Indexer: addrIndex(func(o any) netip.Addr { return key(o).ipv4 })},
		IndexIPv6: {Name: IndexIPv6, Unique: true, AllowMissing: true,
			Indexer: addrIndex(func(o any) netip.Addr { return key(o).ipv6 })},
		IndexPod: {Name: IndexPod, AllowMissing: true,
			Indexer: stringIndex(func(o any) string { return podKey(key(o).namespace, key(o).podName) })},
		// Its key is missing for a row without a state, so such a row is
		// refused (the manager always sets one before inserting).
		IndexIdentity: {Name: IndexIdentity, Indexer: withKeyIf(uint32Index(func(o any) uint32 { return uint32(key(o).identity) }),
			func(o any) bool { return key(o).stated })},
	}}
}

// podKey is "ns/pod/" so that a prefix "ns/" selects a namespace without
// matching "ns2/..." and the exact key of a pod never prefixes another pod's.
// containerKey is the container-id index key: the ID and a '/' (which no
// container ID holds), so a lookup of "abc" does not match "abcd".
func containerKey(cid string) string {
	if cid == "" {
		return ""
	}
	return cid + "/"
}

func podKey(namespace, pod string) string {
	if namespace == "" && pod == "" {
		return ""
	}
	return namespace + "/" + pod + "/"
}

func identitiesTable() *memdb.TableSchema {
	key := func(o any) *identityKey { return &o.(*identityRow).key }
	return &memdb.TableSchema{Name: TableIdentities, Indexes: map[string]*memdb.IndexSchema{
		IndexID: {Name: IndexID, Unique: true, Indexer: uint32Index(func(o any) uint32 { return uint32(key(o).id) })},
		// "labels" serves lookups by label set (GET /v1/identity?labels=...).
		"labels": {Name: "labels", Unique: true, Indexer: stringIndex(func(o any) string { return key(o).labels })},
	}}
}

func ipamTable() *memdb.TableSchema {
	return &memdb.TableSchema{Name: TableIPAM, Indexes: map[string]*memdb.IndexSchema{
		// The primary key alone: every secondary index costs each live
		// address a radix leaf (heap per endpoint is a target). IPv4 keys
		// are 4 bytes and IPv6 keys 16, so a family is a key-length scan.
		IndexID: {Name: IndexID, Unique: true, Indexer: addrIndex(func(o any) netip.Addr { return o.(*ipRow).key })},
	}}
}

func leasesTable() *memdb.TableSchema {
	row := func(o any) *IdentityLease { return o.(*IdentityLease) }
	return &memdb.TableSchema{Name: TableIdentityLeases, Indexes: map[string]*memdb.IndexSchema{
		// Read only by the identity actor's rebuild, which scans them all.
		IndexID: {Name: IndexID, Unique: true, Indexer: stringIndex(func(o any) string { return leaseKey(row(o).ID, row(o).Holder) })},
	}}
}

// leaseKey is the primary key of an identity lease.
func leaseKey(id identity.NumericIdentity, holder string) string {
	return fmt.Sprintf("%d|%s", id, holder)
}

// LeaseKey returns the primary key to look up or delete an identity lease.
func LeaseKey(id identity.NumericIdentity, holder string) string { return leaseKey(id, holder) }

// funcIndex is a memdb.SingleIndexer over a key function; it avoids
// reflection and lets fields of non-string types (netip.Addr) be indexed.
type funcIndex struct {
	key  func(obj any) ([]byte, bool)
	args func(arg any) ([]byte, error)
}

var (
	_ memdb.SingleIndexer = (*funcIndex)(nil)
	_ memdb.PrefixIndexer = (*funcIndex)(nil)
)

func (f *funcIndex) FromObject(obj any) (bool, []byte, error) {
	k, ok := f.key(obj)
	return ok, k, nil
}

func (f *funcIndex) FromArgs(args ...any) ([]byte, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("index lookup: want one argument, got %d", len(args))
	}
	return f.args(args[0])
}

func (f *funcIndex) PrefixFromArgs(args ...any) ([]byte, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("index prefix lookup: want one argument, got %d", len(args))
	}
	s, ok := args[0].(string)
	if !ok {
		return nil, fmt.Errorf("index prefix lookup: want a string, got %T", args[0])
	}
	return []byte(s), nil
}

// withKeyIf makes f report no key for objects for which ok is false.
func withKeyIf(f *funcIndex, ok func(any) bool) *funcIndex {
	key := f.key
	f.key = func(o any) ([]byte, bool) {
		if !ok(o) {
			return nil, false
		}
		return key(o)
	}
	return f
}

func stringIndex(fn func(any) string) *funcIndex {
	return &funcIndex{
		key: func(o any) ([]byte, bool) {
			s := fn(o)
			return []byte(s), s != ""
		},
		args: func(a any) ([]byte, error) {
			s, ok := a.(string)
			if !ok {
				return nil, fmt.Errorf("index lookup: want a string, got %T", a)
			}
			return []byte(s), nil
		},
	}
}

func uint16Index(fn func(any) uint16) *funcIndex {
	enc := func(v uint16) []byte { return nibbles(binary.BigEndian.AppendUint16(nil, v)) }
	return &funcIndex{
		key: func(o any) ([]byte, bool) { return enc(fn(o)), true },
		args: func(a any) ([]byte, error) {
			switch v := a.(type) {
			case endpoint.ID:
				return enc(uint16(v)), nil
			case uint16:
				return enc(v), nil
			}
			return nil, fmt.Errorf("index lookup: want an endpoint.ID, got %T", a)
		},
	}
}

func uint32Index(fn func(any) uint32) *funcIndex {
	enc := func(v uint32) []byte { return nibbles(binary.BigEndian.AppendUint32(nil, v)) }
	return &funcIndex{
		key: func(o any) ([]byte, bool) { return enc(fn(o)), true },
		args: func(a any) ([]byte, error) {
			switch v := a.(type) {
			case identity.NumericIdentity:
				return enc(uint32(v)), nil
			case uint32:
				return enc(v), nil
			}
			return nil, fmt.Errorf("index lookup: want an identity.NumericIdentity, got %T", a)
		},
	}
}

// nibbles spreads each byte of a binary key (an ID, an address) over
// two, high nibble first. go-immutable-radix copies every node on a
// write's path, edges included, and an insert appends an edge (doubling
// the copy): with a byte per level a node of a dense key space has up to
// 256 edges (4 KiB to copy, 8 KiB more to append), with a nibble at most
// 16. Keys keep their order. Measured: BenchmarkLifecycleRows.
func nibbles(k []byte) []byte {
	out := make([]byte, 2*len(k))
	for i, c := range k {
		out[2*i], out[2*i+1] = c>>4, c&0x0f
	}
	return out
}

func errWantPrefix(a any) error {
	return fmt.Errorf("index lookup: want a netip.Prefix, got %T", a)
}

func addrIndex(fn func(any) netip.Addr) *funcIndex {
	return &funcIndex{
		key: func(o any) ([]byte, bool) {
			a := fn(o)
			if !a.IsValid() {
				return nil, false
			}
			b, _ := a.Unmap().MarshalBinary()
			return nibbles(b), true
		},
		args: func(a any) ([]byte, error) {
			ip, ok := a.(netip.Addr)
			if !ok || !ip.IsValid() {
				return nil, fmt.Errorf("index lookup: want a valid netip.Addr, got %T %v", a, a)
			}
			b, _ := ip.Unmap().MarshalBinary()
			return nibbles(b), nil
		},
	}
}
