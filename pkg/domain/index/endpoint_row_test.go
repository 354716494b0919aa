package index

import (
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// rowOf returns the endpoints-table row of id in a new read transaction.
func rowOf(t *testing.T, ix *Index, id endpoint.ID) *endpointRow {
	t.Helper()
	o, err := ix.ReadTxn().First(TableEndpoints, IndexID, id)
	if err != nil || o == nil {
		t.Fatalf("row of endpoint %d: %v, %v", id, o, err)
	}
	return o.(*endpointRow)
}

// TestEndpointRecordSwap: a change of non-indexed fields replaces the
// record in the row (no new row); a reader sees the new record at once,
// through every index and filter.
func TestEndpointRecordSwap(t *testing.T) {
	ix := newIndex(t)
	ep := &endpoint.Endpoint{ID: 4, ContainerID: "c4", Namespace: "ns", PodName: "p4", Identity: 300,
		State: endpoint.StateReady, IPv4: netip.MustParseAddr("10.0.0.4")}
	insert(t, ix, TableEndpoints, ep)
	before := rowOf(t, ix, 4)
	next := ep.Clone()
	next.State, next.DesiredRevision = endpoint.StateRegenerating, 7
	insert(t, ix, TableEndpoints, next)
	if rowOf(t, ix, 4) != before {
		t.Errorf("a state change inserted a new row")
	}
	lookups := map[string]func() (*endpoint.Endpoint, bool){
		"id":           func() (*endpoint.Endpoint, bool) { return ix.Endpoint(4) },
		"container-id": func() (*endpoint.Endpoint, bool) { return ix.EndpointByContainerID("c4") },
		"pod":          func() (*endpoint.Endpoint, bool) { return ix.EndpointByPod("ns", "p4") },
		"ip":           func() (*endpoint.Endpoint, bool) { return ix.EndpointByIP(netip.MustParseAddr("10.0.0.4")) },
	}
	for name, lookup := range lookups {
		if got, ok := lookup(); !ok || got != next {
			t.Errorf("lookup by %s = %+v, %v; want the new record", name, got, ok)
		}
	}
	if got := ids(ix.Endpoints(EndpointFilter{State: endpoint.StateRegenerating})); len(got) != 1 {
		t.Errorf("state filter = %v, want [4]", got)
	}
	if got := ids(ix.Endpoints(EndpointFilter{State: endpoint.StateReady})); len(got) != 0 {
		t.Errorf("old state still listed: %v", got)
	}
}

// TestEndpointIdentityHint: a new endpoint is keyed under the identity
// its labels already have, so resolving that identity swaps the record;
// until then the identity filter does not list it.
func TestEndpointIdentityHint(t *testing.T) {
	ix := newIndex(t)
	web := mustLabels(t, "k8s:app=web")
	insert(t, ix, TableIdentities, &Identity{ID: 300, Labels: web, Key: web.Key(), RefCount: 1})
	ep := &endpoint.Endpoint{ID: 5, Labels: web, State: endpoint.StateWaitingForIdentity}
	insert(t, ix, TableEndpoints, ep)
	if got := ids(ix.Endpoints(EndpointFilter{Identity: 300})); len(got) != 0 {
		t.Errorf("identity filter lists an endpoint that does not hold the identity yet: %v", got)
	}
	before := rowOf(t, ix, 5)
	next := ep.Clone()
	next.Identity, next.State = 300, endpoint.StateReady
	insert(t, ix, TableEndpoints, next)
	if rowOf(t, ix, 5) != before {
		t.Errorf("resolving the expected identity inserted a new row")
	}
	if got := ids(ix.Endpoints(EndpointFilter{Identity: 300})); len(got) != 1 || got[0] != 5 {
		t.Errorf("identity filter = %v, want [5]", got)
	}
	// Another identity than expected: a new row, under that identity.
	other := next.Clone()
	other.Identity = 301
	insert(t, ix, TableEndpoints, other)
	if rowOf(t, ix, 5) == before {
		t.Errorf("an identity change kept the row")
	}
	if got := ids(ix.Endpoints(EndpointFilter{Identity: 301})); len(got) != 1 {
		t.Errorf("identity filter 301 = %v, want [5]", got)
	}
	if got := ids(ix.Endpoints(EndpointFilter{Identity: 300})); len(got) != 0 {
		t.Errorf("identity filter 300 = %v, want none", got)
	}
}

// TestEndpointDeleteByID: deleting needs only the ID.
func TestEndpointDeleteByID(t *testing.T) {
	ix := newIndex(t)
	insert(t, ix, TableEndpoints, &endpoint.Endpoint{ID: 6, ContainerID: "c6", State: endpoint.StateReady})
	txn := ix.WriteTxn()
	if err := Delete(txn, TableEndpoints, &endpoint.Endpoint{ID: 6}); err != nil {
		t.Fatalf("Delete = %v", err)
	}
	txn.Commit()
	if _, ok := ix.EndpointByContainerID("c6"); ok {
		t.Errorf("deleted endpoint still found by container id")
	}
}

// TestIPAndIdentitySwap: an address's claim and an identity's reference
// count change in their rows; lookups see the new records; deleting needs
// only the primary key.
func TestIPAndIdentitySwap(t *testing.T) {
	ix := newIndex(t)
	ip := netip.MustParseAddr("10.0.0.7")
	web := mustLabels(t, "k8s:app=web")
	insert(t, ix, TableIPAM, &IP{IP: ip, Family: "ipv4", Owner: "ns/p"})
	insert(t, ix, TableIdentities, &Identity{ID: 300, Labels: web, Key: web.Key(), RefCount: 1})
	rowIP := func() any { o, _ := ix.ReadTxn().First(TableIPAM, IndexID, ip); return o }
	rowID := func() any {
		o, _ := ix.ReadTxn().First(TableIdentities, IndexID, identity.NumericIdentity(300))
		return o
	}
	ipBefore, idBefore := rowIP(), rowID()
	insert(t, ix, TableIPAM, &IP{IP: ip, Family: "ipv4", Owner: "ns/p", Endpoint: 7, Holder: "ep-7"})
	insert(t, ix, TableIdentities, &Identity{ID: 300, Labels: web, Key: web.Key(), RefCount: 2})
	if rowIP() != ipBefore {
		t.Errorf("a claim inserted a new row")
	}
	if rowID() == idBefore {
		t.Errorf("a reference count change swapped the record: it must stay consistent with the leases in a snapshot")
	}
	if got, ok := ix.IP(ip); !ok || got.Endpoint != 7 {
		t.Errorf("IP(%s) = %+v, %v; want claimed by 7", ip, got, ok)
	}
	if got, ok := ix.IdentityByLabels(web); !ok || got.RefCount != 2 {
		t.Errorf("IdentityByLabels = %+v, %v; want refcount 2", got, ok)
	}
	txn := ix.WriteTxn()
	if err := Delete(txn, TableIPAM, &IP{IP: ip}); err != nil {
		t.Fatalf("Delete ip = %v", err)
	}
	if err := Delete(txn, TableIdentities, &Identity{ID: 300}); err != nil {
		t.Fatalf("Delete identity = %v", err)
	}
	txn.Commit()
	if _, ok := ix.IP(ip); ok {
		t.Errorf("deleted address still found")
	}
	if _, ok := ix.IdentityByLabels(web); ok {
		t.Errorf("deleted identity still found by labels")
	}
}
