package index

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// benchEndpoints fills an index with n endpoints shaped like the
// simulator's (pod names, container IDs, IPv4 from a /16, 64 identities).
func benchEndpoints(b *testing.B, n int) (*Index, []*endpoint.Endpoint) {
	b.Helper()
	ix := newIndex(b)
	eps := make([]*endpoint.Endpoint, n)
	for i := range eps {
		eps[i] = &endpoint.Endpoint{
			ID:          endpoint.ID(i + 1),
			ContainerID: fmt.Sprintf("%064x", uint64(i)*0x9e3779b97f4a7c15),
			Namespace:   "default", PodName: fmt.Sprintf("pod-%d", i),
			IPv4:     netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}),
			Identity: identity.NumericIdentity(256 + i%64),
			State:    endpoint.StateReady,
		}
	}
	insert(b, ix, TableEndpoints, eps...)
	return ix, eps
}

// BenchmarkEndpointUpdate measures rewriting rows of a 10,000-endpoint
// table, in transactions of 1 and of 16 rows: a change of state (no
// indexed field changes: the record is replaced in its row) and a change
// of identity (an indexed field: a new row in every index). These are the
// index writes an endpoint's lifecycle pays
// (go test -run XXX -bench EndpointUpdate -benchmem ./pkg/index).
func BenchmarkEndpointUpdate(b *testing.B) {
	change := map[string]func(e *endpoint.Endpoint, i int){
		"state":    func(e *endpoint.Endpoint, _ int) { e.State = endpoint.StateRegenerating },
		"identity": func(e *endpoint.Endpoint, i int) { e.Identity = identity.NumericIdentity(1000 + i%64) },
	}
	for _, name := range []string{"state", "identity"} {
		for _, batch := range []int{1, 16} {
			benchEndpointUpdate(b, name, change[name], batch)
		}
	}
}

func benchEndpointUpdate(b *testing.B, name string, change func(*endpoint.Endpoint, int), batch int) {
	b.Run(fmt.Sprintf("%s/rows-per-txn=%d", name, batch), func(b *testing.B) {
		ix, eps := benchEndpoints(b, 10000)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i += batch {
			txn := ix.WriteTxn()
			for k := range batch {
				e := eps[(i+k)*7919%len(eps)].Clone()
				change(e, i+k)
				if err := Insert(txn, TableEndpoints, e); err != nil {
					b.Fatal(err)
				}
			}
			txn.Commit()
		}
	})
}

// BenchmarkLifecycleRows measures the index writes an endpoint lifecycle
// cannot avoid at 10,000 endpoints: its endpoint row and its address row
// inserted and deleted, each in its own transaction (the endpoint manager
// and IPAM commit separately).
func BenchmarkLifecycleRows(b *testing.B) {
	ix, eps := benchEndpoints(b, 10000)
	ips := make([]any, len(eps))
	for i, e := range eps {
		ips[i] = &IP{IP: e.IPv4, Family: "ipv4", Owner: e.Namespace + "/" + e.PodName}
	}
	insert(b, ix, TableIPAM, ips...)
	write := func(table string, obj any, del bool) {
		txn := ix.WriteTxn()
		var err error
		if del {
			err = Delete(txn, table, obj)
		} else {
			err = Insert(txn, table, obj)
		}
		if err != nil {
			b.Fatal(err)
		}
		txn.Commit()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		k := i * 7919 % len(eps)
		for _, del := range []bool{true, false} {
			write(TableEndpoints, eps[k], del)
			write(TableIPAM, ips[k], del)
		}
	}
}
