package actors_test

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// checkReady checks a ready endpoint's record against its index row, the
// identity table and the ipam table.
func checkReady(tb testing.TB, h *harness, ep *endpoint.Endpoint) {
	tb.Helper()
	if ep.State != endpoint.StateReady {
		tb.Errorf("endpoint %d state %q, want ready", ep.ID, ep.State)
	}
	if ep.Identity < identity.MinLocalIdentity {
		tb.Errorf("endpoint %d identity %d, want >= %d", ep.ID, ep.Identity, identity.MinLocalIdentity)
	}
	if ep.RealizedRevision < 1 || ep.Regenerations < 1 {
		tb.Errorf("endpoint %d realized revision %d after %d regenerations, want >= 1", ep.ID, ep.RealizedRevision, ep.Regenerations)
	}
	row, ok := h.indexed(ep.ID)
	if !ok {
		tb.Fatalf("endpoint %d has no index row", ep.ID)
	}
	if row.State != ep.State || row.Identity != ep.Identity || row.RealizedRevision != ep.RealizedRevision ||
		row.ContainerID != ep.ContainerID || row.IPv4 != ep.IPv4 || row.IPv6 != ep.IPv6 || !row.Labels.Equal(ep.Labels) {
		tb.Errorf("index row %+v does not match the answer %+v", row, ep)
	}
	if rev, ok := h.fake.Realized(ep.ID); !ok || rev != ep.RealizedRevision {
		tb.Errorf("fake datapath realised revision %d (%v), want %d", rev, ok, ep.RealizedRevision)
	}
	// The identity and ipam rows are written by other actors; their answers
	// to the endpoint do not wait for the commit (see
	// TestAnswersAfterIndexCommit), so wait for them here.
	testutil.Eventually(tb, fmt.Sprintf("identity row %d of endpoint %d", ep.Identity, ep.ID), func() bool {
		id, ok := h.ix.Identity(ep.Identity)
		return ok && id.Labels.Equal(ep.Labels) && id.RefCount >= 1
	})
	for _, ip := range []netip.Addr{ep.IPv4, ep.IPv6} {
		if !ip.IsValid() {
			continue
		}
		testutil.Eventually(tb, fmt.Sprintf("ipam row of %s claimed by endpoint %d", ip, ep.ID), func() bool {
			r, ok := h.ix.IP(ip)
			return ok && r.Endpoint == ep.ID && r.Holder != ""
		})
	}
}

func TestCreateSync(t *testing.T) {
	h := startSystem(t, nil)
	v4 := h.mustAllocate(t, ipam.IPv4, "ns/web-0")
	v6 := h.mustAllocate(t, ipam.IPv6, "ns/web-0")
	tests := []struct {
		name string
		spec func() *endpoint.Endpoint
	}{
		{"no addresses", func() *endpoint.Endpoint { return podSpec(t, "c-none", "ns", "none") }},
		{"dual stack", func() *endpoint.Endpoint {
			s := podSpec(t, "c-web", "ns", "web-0", "k8s:app=web", "k8s:tier=fe")
			s.IPv4, s.IPv6 = v4, v6
			return s
		}},
		{"unallocated address is claimed", func() *endpoint.Endpoint {
			s := podSpec(t, "c-static", "ns", "static")
			s.IPv4 = netip.MustParseAddr("10.200.0.200")
			return s
		}},
		{"explicit id", func() *endpoint.Endpoint {
			s := podSpec(t, "c-explicit", "ns", "explicit")
			s.ID = 4242
			return s
		}},
		{"no pod", func() *endpoint.Endpoint {
			s := podSpec(t, "c-nopod", "", "", "container:role=x")
			s.IPv6 = netip.MustParseAddr("fd00:200::99")
			return s
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := tt.spec()
			ep := h.mustCreate(t, spec)
			if spec.ID != 0 && ep.ID != spec.ID {
				t.Errorf("created endpoint %d, asked for %d", ep.ID, spec.ID)
			}
			if ep.ID == 0 {
				t.Fatalf("created endpoint has ID 0")
			}
			checkReady(t, h, ep)
		})
	}
	// Owners of addresses the endpoint claimed without an allocation.
	if r, ok := h.ix.IP(netip.MustParseAddr("10.200.0.200")); !ok || r.Owner != "ns/static" {
		t.Errorf("claimed static address row %+v, %v; want owner ns/static", r, ok)
	}
	if r, ok := h.ix.IP(netip.MustParseAddr("fd00:200::99")); !ok || r.Owner == "" {
		t.Errorf("claimed address of a pod-less endpoint row %+v, %v; want an owner", r, ok)
	}
}

func TestCreateAsync(t *testing.T) {
	h := startSystem(t, nil)
	ep, err := h.create(t, podSpec(t, "c-async", "ns", "async"), false)
	if err != nil {
		t.Fatal(err)
	}
	if ep.ID == 0 || ep.State != endpoint.StateWaitingForIdentity {
		t.Fatalf("non-sync create answered %+v, want an ID in waiting-for-identity", ep)
	}
	// The answer comes after the index commit.
	if _, ok := h.indexed(ep.ID); !ok {
		t.Fatalf("endpoint %d not in the index after the answer", ep.ID)
	}
	ready := h.waitState(t, ep.ID, endpoint.StateReady)
	checkReady(t, h, ready)
}

func TestCreateDuplicates(t *testing.T) {
	h := startSystem(t, nil)
	ip := h.mustAllocate(t, ipam.IPv4, "ns/dup")
	first := podSpec(t, "c-dup", "ns", "dup")
	first.ID, first.IPv4 = 100, ip
	h.mustCreate(t, first)

	tests := []struct {
		name string
		spec func() *endpoint.Endpoint
	}{
		{"container id", func() *endpoint.Endpoint { return podSpec(t, "c-dup", "ns", "other") }},
		{"explicit id", func() *endpoint.Endpoint {
			s := podSpec(t, "c-other", "ns", "other")
			s.ID = 100
			return s
		}},
		{"address", func() *endpoint.Endpoint {
			s := podSpec(t, "c-other2", "ns", "other2")
			s.IPv4 = ip
			return s
		}},
	}
	for _, tt := range tests {
		for _, sync := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s sync=%v", tt.name, sync), func(t *testing.T) {
				_, err := h.create(t, tt.spec(), sync)
				if !errors.Is(err, actors.ErrEndpointExists) {
					t.Fatalf("create = %v, want ErrEndpointExists", err)
				}
			})
		}
	}
	if total, _ := h.ix.CountEndpoints(); total != 1 {
		t.Fatalf("index holds %d endpoints after refused duplicates, want 1", total)
	}
}

func TestDelete(t *testing.T) {
	h := startSystem(t, nil)
	tests := []struct {
		name string
		opts endpoint.DeleteOptions
	}{
		{"default", endpoint.DeleteOptions{}},
		{"no ip release", endpoint.DeleteOptions{NoIPRelease: true}},
		{"no identity release", endpoint.DeleteOptions{NoIdentityRelease: true}},
		{"no release at all", endpoint.DeleteOptions{NoIPRelease: true, NoIdentityRelease: true}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := fmt.Sprintf("del-%d", i)
			owner := "ns/" + pod
			v4 := h.mustAllocate(t, ipam.IPv4, owner)
			spec := podSpec(t, "c-"+pod, "ns", pod)
			spec.IPv4 = v4
			ep := h.mustCreate(t, spec)
			_, _, removesBefore := h.fakeStats()

			gone, err := h.remove(t, ep.ID, tt.opts)
			if err != nil {
				t.Fatalf("delete: %v", err)
			}
			if gone == nil || gone.State != endpoint.StateDisconnected {
				t.Fatalf("delete answered %+v, want state disconnected", gone)
			}
			if gone.Deleting != tt.opts {
				t.Errorf("delete answered options %+v, want %+v", gone.Deleting, tt.opts)
			}
			// The row leaves the index before the answer.
			if _, ok := h.indexed(ep.ID); ok {
				t.Fatalf("endpoint %d still in the index after the delete answer", ep.ID)
			}
			if _, ok := h.ix.EndpointByContainerID(spec.ContainerID); ok {
				t.Fatalf("container %s still indexed", spec.ContainerID)
			}
			if _, ok := h.fake.Realized(ep.ID); ok {
				t.Errorf("datapath of endpoint %d not removed", ep.ID)
			}
			if _, _, removes := h.fakeStats(); removes != removesBefore+1 {
				t.Errorf("fake removes %d -> %d, want one more", removesBefore, removes)
			}

			if tt.opts.NoIPRelease {
				testutil.Eventually(t, "address unclaimed but kept", func() bool {
					r, ok := h.ix.IP(v4)
					return ok && r.Endpoint == 0 && r.Holder == "" && r.Owner == owner && r.Kept
				})
			} else {
				testutil.Eventually(t, "address released", func() bool { _, ok := h.ix.IP(v4); return !ok })
			}
			// The endpoint's own reference ends with or without
			// NoIdentityRelease (TestIdentityReferencesAfterDeleteCycles).
			testutil.Eventually(t, "identity freed", func() bool {
				_, ok := h.ix.Identity(ep.Identity)
				return !ok && len(h.leasesOf(ep.Identity)) == 0
			})
			h.waitGone(t, ep.ID)

			// The ID, container and address can be used again.
			again := podSpec(t, spec.ContainerID, "ns", pod)
			again.ID, again.IPv4 = ep.ID, v4
			re := h.mustCreate(t, again)
			checkReady(t, h, re)
			if _, err := h.remove(t, re.ID, endpoint.DeleteOptions{}); err != nil {
				t.Fatalf("second delete: %v", err)
			}
		})
	}
}

func TestUnknownEndpoint(t *testing.T) {
	h := startSystem(t, nil)
	tests := []struct {
		name string
		msg  any
	}{
		{"delete", &messages.DeleteEndpoint{ID: 999}},
		{"regenerate", &messages.Regenerate{ID: 999}},
		{"patch labels", &messages.PatchLabels{ID: 999, Add: mustLabels(t, "k8s:a=b")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.endpointCall(t, tt.msg)
			if !errors.Is(err, actors.ErrEndpointNotFound) {
				t.Fatalf("answer %v, want ErrEndpointNotFound", err)
			}
		})
	}
}

// TestRecreateRightAfterDelete re-creates an endpoint with the same
// container ID and address as soon as the delete is answered, as a CNI DEL
// followed by an ADD of the same sandbox does.
func TestRecreateRightAfterDelete(t *testing.T) {
	h := startSystem(t, nil)
	ip := h.mustAllocate(t, ipam.IPv4, "ns/again")
	for i := range 50 {
		spec := podSpec(t, "c-again", "ns", "again")
		spec.IPv4 = ip
		ep, err := h.create(t, spec, true)
		if err != nil {
			t.Fatalf("round %d: create: %v", i, err)
		}
		if _, err := h.remove(t, ep.ID, endpoint.DeleteOptions{NoIPRelease: true}); err != nil {
			t.Fatalf("round %d: delete: %v", i, err)
		}
	}
}

// TestIDReuse: a freed ID is not handed out again right away (the cursor
// moves on), but can be asked for explicitly once the endpoint is gone.
func TestIDReuse(t *testing.T) {
	h := startSystem(t, nil)
	a := h.mustCreate(t, podSpec(t, "c-a", "ns", "a"))
	if _, err := h.remove(t, a.ID, endpoint.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitGone(t, a.ID)
	b := h.mustCreate(t, podSpec(t, "c-b", "ns", "b"))
	if b.ID == a.ID {
		t.Errorf("freed ID %d handed out again immediately", a.ID)
	}
	again := podSpec(t, "c-c", "ns", "c")
	again.ID = a.ID
	c := h.mustCreate(t, again)
	if c.ID != a.ID {
		t.Fatalf("explicit ID %d gave %d", a.ID, c.ID)
	}
}

func (h *harness) fakeStats() (live int, realizes, removes uint64) { return h.fake.Stats() }

// leasesOf returns the identity-lease rows of an identity.
func (h *harness) leasesOf(id identity.NumericIdentity) []string {
	var out []string
	for _, l := range h.ix.IdentityLeases() {
		if l.ID == id {
			out = append(out, l.Holder)
		}
	}
	return out
}

// TestEndpointsShareIdentityLabels: endpoints created with equal label
// sets (each its own copy) end up sharing the identity's slice, and still
// report their labels unchanged.
func TestEndpointsShareIdentityLabels(t *testing.T) {
	h := startSystem(t, nil)
	a := h.mustCreate(t, &endpoint.Endpoint{ContainerID: "share-a", Labels: mustLabels(t, "k8s:app=share", "k8s:tier=x")})
	b := h.mustCreate(t, &endpoint.Endpoint{ContainerID: "share-b", Labels: mustLabels(t, "k8s:app=share", "k8s:tier=x")})
	ra, _ := h.indexed(a.ID)
	rb, _ := h.indexed(b.ID)
	if ra == nil || rb == nil {
		t.Fatalf("endpoints %d, %d not in the index", a.ID, b.ID)
	}
	want := mustLabels(t, "k8s:app=share", "k8s:tier=x")
	if !ra.Labels.Equal(want) || !rb.Labels.Equal(want) {
		t.Fatalf("labels = %v, %v; want %v", ra.Labels, rb.Labels, want)
	}
	if &ra.Labels[0] != &rb.Labels[0] {
		t.Errorf("endpoints with one label set hold two copies of it")
	}
}
