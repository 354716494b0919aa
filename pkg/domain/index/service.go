package index

import (
	memdb "github.com/hashicorp/go-memdb"

	"github.com/membrane-cni/membrane/pkg/domain/service"
)

// TableServices holds the service table (written by the services actor):
// one row per frontend.
const TableServices = "services"

// Service states: what the datapath holds of a row.
const (
	// ServicePending: written to the index, not yet to the datapath.
	ServicePending = "pending"
	// ServiceRealized: the datapath's maps hold the row.
	ServiceRealized = "realized"
	// ServiceFailed: the last datapath write failed; it is retried.
	ServiceFailed = "failed"
)

// ServiceRow is a row of the services table. Rows are immutable once
// written.
type ServiceRow struct {
	Service service.Service
	// Source is the feeder that owns the frontend ("k8s", "api", ...).
	Source string
	// ID is the datapath's service number (the backend slots' key).
	ID    uint32
	State string
	Error string
}

func servicesTable() *memdb.TableSchema {
	return &memdb.TableSchema{Name: TableServices, Indexes: map[string]*memdb.IndexSchema{
		// GET /v1/service and the services actor's rebuild scan it all.
		IndexID: {Name: IndexID, Unique: true, Indexer: stringIndex(func(o any) string { return ServiceKey(o.(*ServiceRow).Service.Frontend) })},
	}}
}

// ServiceKey is a frontend's primary key in the services table.
func ServiceKey(f service.Frontend) string { return f.String() }

// Services lists the service table by frontend key.
func (ix *Index) Services() []*ServiceRow {
	return all[*ServiceRow](ix.ReadTxn(), TableServices, IndexID)
}

// Service returns the row of frontend f.
func (ix *Index) Service(f service.Frontend) (*ServiceRow, bool) {
	return first[*ServiceRow](ix.ReadTxn(), TableServices, IndexID, ServiceKey(f))
}
