package actors_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
)

// lockedWindow is how long a test holds the index's write lock waiting to
// see whether an actor answers before it could have committed. A correct
// actor never answers inside the window, however long; a wrong one
// answers within microseconds. Only a missed detection depends on it.
const lockedWindow = 300 * time.Millisecond

// dummyHolder spawns an actor that ignores everything, to stand in for an
// endpoint actor as a lease holder.
func dummyHolder(tb testing.TB, h *harness) *actor.PID {
	tb.Helper()
	pid := h.sys.Actors.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	tb.Cleanup(func() { h.sys.Actors.Root.Stop(pid) })
	return pid
}

// TestAnswersAfterIndexCommit: every actor that writes the index answers a
// change only after the write transaction containing it committed, so the
// caller reads its own write (the batcher's contract). The test holds the
// index's write lock: an answer that arrives meanwhile preceded its commit.
func TestAnswersAfterIndexCommit(t *testing.T) {
	h := startSystem(t, nil)
	holder := dummyHolder(t, h)
	ip := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	claim := func(t *testing.T, id endpoint.ID, addr netip.Addr) {
		t.Helper()
		r := askAs[*messages.IPAMResult](t, h, h.sys.PIDForTest("ipam"), &messages.IPAMClaim{Endpoint: id, IPs: []netip.Addr{addr}, Owner: "ns/c", Holder: holder})
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	acquire := func(t *testing.T, ls string) *messages.IdentityAcquired {
		t.Helper()
		r := askAs[*messages.IdentityAcquired](t, h, h.sys.PIDForTest("identity"), &messages.IdentityAcquire{Labels: mustLabels(t, ls), Holder: holder})
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		return r
	}

	tests := []struct {
		name  string
		pid   *actor.PID
		setup func(t *testing.T) any         // returns the message to send
		check func(t *testing.T, answer any) // the change is in the index
	}{
		{
			name:  "ipam allocate",
			pid:   h.sys.PIDForTest("ipam"),
			setup: func(*testing.T) any { return &messages.IPAMAllocate{Family: ipam.IPv4, Owner: "ns/a"} },
			check: func(t *testing.T, a any) {
				if _, ok := h.ix.IP(a.(*messages.IPAMAllocated).IPv4); !ok {
					t.Errorf("allocated address not in the index")
				}
			},
		},
		{
			name:  "ipam allocate ip",
			pid:   h.sys.PIDForTest("ipam"),
			setup: func(*testing.T) any { return &messages.IPAMAllocateIP{IP: ip("10.200.0.100"), Owner: "ns/a"} },
			check: func(t *testing.T, _ any) {
				if _, ok := h.ix.IP(ip("10.200.0.100")); !ok {
					t.Errorf("allocated address not in the index")
				}
			},
		},
		{
			name: "ipam release",
			pid:  h.sys.PIDForTest("ipam"),
			setup: func(t *testing.T) any {
				askAs[*messages.IPAMAllocated](t, h, h.sys.PIDForTest("ipam"), &messages.IPAMAllocateIP{IP: ip("10.200.0.101"), Owner: "ns/a"})
				return &messages.IPAMRelease{IP: ip("10.200.0.101")}
			},
			check: func(t *testing.T, _ any) {
				if _, ok := h.ix.IP(ip("10.200.0.101")); ok {
					t.Errorf("released address still in the index")
				}
			},
		},
		{
			name: "ipam claim",
			pid:  h.sys.PIDForTest("ipam"),
			setup: func(t *testing.T) any {
				return &messages.IPAMClaim{Endpoint: 9, IPs: []netip.Addr{ip("10.200.0.102")}, Owner: "ns/c", Holder: holder}
			},
			check: func(t *testing.T, _ any) {
				if r, ok := h.ix.IP(ip("10.200.0.102")); !ok || r.Endpoint != 9 {
					t.Errorf("claim not in the index: %+v", r)
				}
			},
		},
		{
			name: "ipam unclaim",
			pid:  h.sys.PIDForTest("ipam"),
			setup: func(t *testing.T) any {
				claim(t, 10, ip("10.200.0.103"))
				return &messages.IPAMUnclaim{Endpoint: 10, IPs: []netip.Addr{ip("10.200.0.103")}, Release: true}
			},
			check: func(t *testing.T, _ any) {
				if _, ok := h.ix.IP(ip("10.200.0.103")); ok {
					t.Errorf("unclaimed and released address still in the index")
				}
			},
		},
		{
			name: "identity acquire",
			pid:  h.sys.PIDForTest("identity"),
			setup: func(t *testing.T) any {
				return &messages.IdentityAcquire{Labels: mustLabels(t, "k8s:commit=a"), Holder: holder}
			},
			check: func(t *testing.T, a any) {
				if _, ok := h.ix.Identity(a.(*messages.IdentityAcquired).Identity.ID); !ok {
					t.Errorf("acquired identity not in the index")
				}
			},
		},
		{
			name: "identity release",
			pid:  h.sys.PIDForTest("identity"),
			setup: func(t *testing.T) any {
				r := acquire(t, "k8s:commit=b")
				return &messages.IdentityRelease{ID: r.Identity.ID, Holder: holder}
			},
			check: func(t *testing.T, _ any) {
				if _, ok := h.ix.IdentityByLabels(mustLabels(t, "k8s:commit=b")); ok {
					t.Errorf("released identity still in the index")
				}
			},
		},
		{
			name:  "endpoint create",
			pid:   h.sys.PIDForTest("endpoints"),
			setup: func(t *testing.T) any { return &messages.CreateEndpoint{Spec: podSpec(t, "c-commit", "ns", "commit")} },
			check: func(t *testing.T, a any) {
				if _, ok := h.indexed(a.(*messages.EndpointResult).Endpoint.ID); !ok {
					t.Errorf("created endpoint not in the index")
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := tt.setup(t)
			txn := h.ix.WriteTxn() // blocks every index writer
			f := h.future(tt.pid, msg)
			answers := make(chan any, 1)
			go func() {
				res, err := f.Result()
				if err != nil {
					res = err
				}
				answers <- res
			}()
			var answer any
			early := false
			select {
			case answer = <-answers:
				early = true
			case <-time.After(lockedWindow):
			}
			txn.Abort()
			if !early {
				answer = <-answers // f times out after waitTimeout
			}
			if err, ok := answer.(error); ok {
				t.Fatalf("no answer: %v", err)
			}
			if early {
				t.Errorf("%T answered while the index write lock was held: the answer precedes its commit, "+
					"so the caller may not read its own write", msg)
			}
			if !early { // an early answer's write may still be on its way
				tt.check(t, answer)
			}
		})
	}
}
