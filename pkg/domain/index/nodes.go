package index

import (
	"net/netip"

	memdb "github.com/hashicorp/go-memdb"
)

// TableNodes holds the remote nodes each source reported (written by the
// nodes actor): one row per (source, node name).
const TableNodes = "nodes"

// Node is a row of the nodes table: node Name as Source ("k8s",
// "kvstore", "file", ...) reported it. Active says whether this row is
// the one the datapath gets for Name (several sources may report one
// node; the source first by name wins).
type Node struct {
	Source   string
	Name     string
	Addrs    []netip.Addr
	PodCIDRs []netip.Prefix
	// Labels are the node's labels (per-node identities); never mutated.
	Labels map[string]string
	// HealthIPs are the node's health endpoint addresses the nodes actor
	// accepted (inside the node's pod CIDRs); never mutated.
	HealthIPs []netip.Addr
	Active    bool
}

// Key is the row's primary key, "source/name".
func (n *Node) Key() string { return n.Source + "/" + n.Name }

func nodesTable() *memdb.TableSchema {
	return &memdb.TableSchema{Name: TableNodes, Indexes: map[string]*memdb.IndexSchema{
		// GET /v1/nodes and the nodes actor's rebuild scan it all.
		IndexID: {Name: IndexID, Unique: true, Indexer: stringIndex(func(o any) string { return o.(*Node).Key() })},
	}}
}

// Nodes lists the remote nodes by source, then name.
func (ix *Index) Nodes() []*Node {
	return all[*Node](ix.ReadTxn(), TableNodes, IndexID)
}
