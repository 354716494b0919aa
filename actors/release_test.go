package actors_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// refCount is the identity's reference count in the index, 0 when the
// identity is gone.
func (h *harness) refCount(id identity.NumericIdentity) int {
	row, ok := h.ix.Identity(id)
	if !ok {
		return 0
	}
	return int(row.RefCount)
}

// TestIdentityReferencesAfterDeleteCycles counts an identity's references
// while endpoints with one label set are created and deleted, with and
// without NoIdentityRelease: a long-lived endpoint keeps exactly one
// reference, each cycle adds one and takes it back, so the count never
// grows and the identity goes with its last endpoint.
func TestIdentityReferencesAfterDeleteCycles(t *testing.T) {
	for _, noRelease := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoIdentityRelease=%v", noRelease), func(t *testing.T) {
			h := startSystem(t, nil)
			opts := endpoint.DeleteOptions{NoIdentityRelease: noRelease}
			stay := h.mustCreate(t, podSpec(t, "c-stay", "ns", "stay", "k8s:app=cycle"))
			id := stay.Identity
			if n := h.refCount(id); n != 1 {
				t.Fatalf("references after the first endpoint: %d, want 1", n)
			}
			for i := range 5 {
				ep := h.mustCreate(t, podSpec(t, fmt.Sprintf("c-%d", i), "ns", fmt.Sprintf("p-%d", i), "k8s:app=cycle"))
				if ep.Identity != id {
					t.Fatalf("cycle %d: identity %d, want %d", i, ep.Identity, id)
				}
				if n := h.refCount(id); n != 2 {
					t.Fatalf("cycle %d: references while two endpoints live: %d, want 2", i, n)
				}
				if _, err := h.remove(t, ep.ID, opts); err != nil {
					t.Fatalf("cycle %d: delete: %v", i, err)
				}
				if n, leases := h.refCount(id), h.leasesOf(id); n != 1 || len(leases) != 1 {
					t.Fatalf("cycle %d: after the delete %d references and leases %v, want 1 (the remaining endpoint's)", i, n, leases)
				}
			}
			if _, err := h.remove(t, stay.ID, opts); err != nil {
				t.Fatalf("delete of the last endpoint: %v", err)
			}
			if n, leases := h.refCount(id), h.leasesOf(id); n != 0 || len(leases) != 0 {
				t.Fatalf("after the last delete %d references and leases %v, want the identity gone", n, leases)
			}
		})
	}
}

// TestIdentityReleaseOnlyOwnReference: a release by a holder that took no
// reference (as a restored endpoint deleted before it re-acquired its
// identity) leaves the count alone.
func TestIdentityReleaseOnlyOwnReference(t *testing.T) {
	h := startSystem(t, nil)
	ep := h.mustCreate(t, podSpec(t, "c-own", "ns", "own", "k8s:app=own"))
	own := h.endpointPID(t, ep.ID)
	stranger := actor.NewPID(own.Address, own.Id+"-never-acquired") // holds nothing
	r := askAs[*messages.IdentityReleased](t, h, h.sys.PIDForTest("identity"), &messages.IdentityRelease{ID: ep.Identity, Holder: stranger})
	if r.Err != nil || r.Released {
		t.Fatalf("release by a holder without a reference = %+v, want nothing released", r)
	}
	if n := h.refCount(ep.Identity); n != 1 {
		t.Fatalf("references %d after a stranger's release, want 1", n)
	}
}

// TestNoIPReleaseKeepsAddressForOwner: an address kept by a delete with
// NoIPRelease stays reserved for its owner through expiry sweeps that
// release a younger unclaimed address, until the owner releases it.
func TestNoIPReleaseKeepsAddressForOwner(t *testing.T) {
	h := startSystem(t, func(c *actors.Config) { c.IPAM.Expiry = 4 * time.Millisecond })
	const owner = "ns/kept"
	kept := h.mustAllocate(t, ipam.IPv4, owner)
	spec := podSpec(t, "c-kept", "ns", "kept")
	spec.IPv4 = kept
	ep := h.mustCreate(t, spec)
	if _, err := h.remove(t, ep.ID, endpoint.DeleteOptions{NoIPRelease: true}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	// An address allocated after the delete and never claimed: once a
	// sweep released it, that sweep also saw the kept address, which
	// became unclaimed earlier.
	young := h.mustAllocate(t, ipam.IPv4, "ns/young")
	testutil.Eventually(t, "the unclaimed address expired", func() bool { _, ok := h.ix.IP(young); return !ok })
	row, ok := h.ix.IP(kept)
	if !ok || row.Owner != owner || row.Endpoint != 0 || !row.Kept {
		t.Fatalf("kept address after a sweep: %+v (present %v), want it reserved for %s", row, ok, owner)
	}
	// Claimable again by its owner's next endpoint, then released normally.
	again := podSpec(t, "c-kept-2", "ns", "kept")
	again.IPv4 = kept
	re := h.mustCreate(t, again)
	if row, _ := h.ix.IP(kept); row == nil || row.Kept || row.Endpoint != re.ID {
		t.Fatalf("re-claimed address %+v, want claimed by %d and no longer kept", row, re.ID)
	}
	if _, err := h.remove(t, re.ID, endpoint.DeleteOptions{}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, ok := h.ix.IP(kept); ok {
		t.Fatalf("address still allocated after a delete that releases it")
	}
}
