package index

import (
	"net/netip"

	memdb "github.com/hashicorp/go-memdb"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// Table names of the policy and ipcache actors.
const (
	// TablePolicies holds the imported policies (written by the policy
	// actor, which rebuilds its repository from it after a restart).
	TablePolicies = "policies"
	// TablePolicyRevision holds one row: the repository revision.
	TablePolicyRevision = "policy-revision"
	// TablePolicyServices holds the Kubernetes Services the toServices
	// rules follow (written by the policy actor, which sets them in its
	// repository again after a restart).
	TablePolicyServices = "policy-services"
	// TableIPCache holds prefix -> identity (written by the ipcache actor).
	TableIPCache = "ipcache"
)

// PolicyServiceRow is a row of the policy-services table: a Service as
// the service watcher gave it to the policy actor.
type PolicyServiceRow struct {
	Key             string // "namespace/name"
	Namespace, Name string
	Service         *policy.Service
}

// PolicyRow is a row of the policies table.
type PolicyRow struct {
	Key    string // "namespace/name"
	Policy *policy.Policy
	// Revision is the repository revision that imported it.
	Revision uint64
	// Selected is what its service and entity selectors select now
	// (policy.Repository.Selections), rewritten when a Service changes.
	Selected []policy.Selection
}

// PolicyRevision is the single row of the policy-revision table.
type PolicyRevision struct {
	Revision uint64
}

// IPCache sources, highest priority first: what this node knows
// first-hand (its endpoints, its reserved host addresses) always wins
// over other nodes' claims, which win over policy CIDRs and FQDN-learned
// addresses (the ipcache actor's sourceRank).
const (
	SourceEndpoint = "endpoint"
	SourceReserved = "reserved"
	// SourceKubeAPIServer is an address of the API server's own
	// EndpointSlice (identity kube-apiserver), SourceNode another node's
	// address from the node registry (identity remote-node): below this
	// node's own entries, above other nodes' endpoint claims.
	SourceKubeAPIServer = "kube-apiserver"
	SourceNode          = "node"
	// SourceRemote is an endpoint on another node, claimed per origin
	// (IPCacheClaim.Origin: "k8s", "kvstore", ...).
	SourceRemote     = "remote"
	SourceCIDRPolicy = "cidr-policy"
)

// IPCacheClaim is one source's wish for a prefix.
type IPCacheClaim struct {
	Source   string
	Identity identity.NumericIdentity
	Endpoint endpoint.ID // SourceEndpoint only
	// Origin and NodeIP are SourceRemote's: who reported the remote
	// endpoint, and the node that hosts it (invalid: unknown).
	Origin string
	NodeIP netip.Addr
	// NamedPorts are a remote endpoint's named ports (SourceRemote only).
	NamedPorts policy.NamedPorts
}

// IPCacheEntry is a row of the ipcache table: the effective identity of
// a prefix (that of the highest-priority claim) and every claim.
type IPCacheEntry struct {
	Prefix   netip.Prefix
	Identity identity.NumericIdentity
	Source   string
	// TunnelEndpoint is the node address of the winning claim when it is
	// a remote endpoint's (invalid otherwise): where tunnel mode sends
	// traffic for Prefix.
	TunnelEndpoint netip.Addr
	Claims         []IPCacheClaim
}

func policiesTable() *memdb.TableSchema {
	return &memdb.TableSchema{Name: TablePolicies, Indexes: map[string]*memdb.IndexSchema{
		// GET /v1/policy and the policy actor's rebuild scan it all.
		IndexID: {Name: IndexID, Unique: true, Indexer: stringIndex(func(o any) string { return o.(*PolicyRow).Key })},
	}}
}

func policyServicesTable() *memdb.TableSchema {
	return &memdb.TableSchema{Name: TablePolicyServices, Indexes: map[string]*memdb.IndexSchema{
		IndexID: {Name: IndexID, Unique: true, Indexer: stringIndex(func(o any) string { return o.(*PolicyServiceRow).Key })},
	}}
}

func policyRevisionTable() *memdb.TableSchema {
	return &memdb.TableSchema{Name: TablePolicyRevision, Indexes: map[string]*memdb.IndexSchema{
		IndexID: {Name: IndexID, Unique: true, Indexer: uint32Index(func(any) uint32 { return 0 })},
	}}
}

func ipcacheTable() *memdb.TableSchema {
	return &memdb.TableSchema{Name: TableIPCache, Indexes: map[string]*memdb.IndexSchema{
		// GET /v1/ipcache and the ipcache actor's rebuild scan it all.
		IndexID: {Name: IndexID, Unique: true, Indexer: prefixIndex(func(o any) netip.Prefix { return o.(*IPCacheEntry).Prefix })},
	}}
}

func prefixIndex(fn func(any) netip.Prefix) *funcIndex {
	enc := func(p netip.Prefix) []byte {
		b, _ := p.Addr().Unmap().MarshalBinary()
		return nibbles(append(b, byte(p.Bits())))
	}
	return &funcIndex{
		key: func(o any) ([]byte, bool) { return enc(fn(o)), true },
		args: func(a any) ([]byte, error) {
			p, ok := a.(netip.Prefix)
			if !ok {
				return nil, errWantPrefix(a)
			}
			return enc(p), nil
		},
	}
}

// Policies lists the imported policies by key.
func (ix *Index) Policies() []*PolicyRow {
	return all[*PolicyRow](ix.ReadTxn(), TablePolicies, IndexID)
}

// PolicyServices lists the Services the policy actor follows, by key.
func (ix *Index) PolicyServices() []*PolicyServiceRow {
	return all[*PolicyServiceRow](ix.ReadTxn(), TablePolicyServices, IndexID)
}

// PolicyRevisionNow returns the policy repository revision (0 before any import).
func (ix *Index) PolicyRevisionNow() uint64 {
	r, ok := first[*PolicyRevision](ix.ReadTxn(), TablePolicyRevision, IndexID, uint32(0))
	if !ok {
		return 0
	}
	return r.Revision
}

// IPCache lists the ipcache by prefix.
func (ix *Index) IPCache() []*IPCacheEntry {
	return all[*IPCacheEntry](ix.ReadTxn(), TableIPCache, IndexID)
}

// IPCacheEntryOf returns the ipcache row of exactly p.
func (ix *Index) IPCacheEntryOf(p netip.Prefix) (*IPCacheEntry, bool) {
	return first[*IPCacheEntry](ix.ReadTxn(), TableIPCache, IndexID, p)
}

// IPCacheLookup returns the identity of addr as the datapath's ipcache
// resolves it (longest prefix match; false: none, the world identity).
// It looks up only the prefix lengths the ipcache holds
// (SetIPCacheLengths) when its writer says which they are.
func (ix *Index) IPCacheLookup(addr netip.Addr) (identity.NumericIdentity, bool) {
	addr = addr.Unmap()
	txn := ix.ReadTxn()
	lens := ix.ipcacheLens.Load()
	fam := 0
	if addr.Is6() {
		fam = 1
	}
	for bits := addr.BitLen(); bits >= 0; bits-- {
		if lens != nil && !lens.Has(fam, bits) {
			continue
		}
		p, _ := addr.Prefix(bits)
		if e, ok := first[*IPCacheEntry](txn, TableIPCache, IndexID, p); ok {
			return e.Identity, true
		}
	}
	return 0, false
}

// IPCacheLengths is the set of prefix lengths an ipcache holds, by
// family (0 IPv4, 1 IPv6).
type IPCacheLengths [2][3]uint64

// Has reports whether the set holds length bits of family fam.
func (l *IPCacheLengths) Has(fam, bits int) bool { return l[fam][bits/64]&(1<<(bits%64)) != 0 }

// Set adds length bits of family fam.
func (l *IPCacheLengths) Set(fam, bits int) { l[fam][bits/64] |= 1 << (bits % 64) }

// SetIPCacheLengths tells IPCacheLookup which prefix lengths the table
// holds (nil: unknown, every length is looked up). The ipcache table's
// writer calls it before its rows of a new length are committed and
// after the last row of a length is gone from its own state, so a lookup
// skips no row it could otherwise have seen but one being deleted.
func (ix *Index) SetIPCacheLengths(l *IPCacheLengths) { ix.ipcacheLens.Store(l) }

// IPCacheLengthsNow returns what SetIPCacheLengths last stored (nil:
// nothing); not to be modified.
func (ix *Index) IPCacheLengthsNow() *IPCacheLengths { return ix.ipcacheLens.Load() }
