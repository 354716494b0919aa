package sim

import (
	"net/netip"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// TestConvTrackerPhases: a sampled endpoint's per-phase clock: each phase
// is timed from the creation's answer at each other node, and the last
// node's time per phase goes to the endpoint's histograms once it
// arrived everywhere; a stamp with another identity (the address's
// previous endpoint) is not its, and an address outside the sample is
// not clocked.
func TestConvTrackerPhases(t *testing.T) {
	tr := newConvTracker(3, 0)
	ip, other := netip.MustParseAddr("10.0.0.4"), netip.MustParseAddr("10.0.0.5")
	if !sampled(ip) || sampled(other) {
		t.Fatal("sample: want 10.0.0.4 in, 10.0.0.5 out")
	}
	t0 := time.Now().Add(-time.Second)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	rem := func(id identity.NumericIdentity, ips ...netip.Addr) []endpoint.Remote {
		var out []endpoint.Remote
		for _, a := range ips {
			out = append(out, endpoint.Remote{IPs: []netip.Addr{a}, Identity: id})
		}
		return out
	}
	tr.creating(ip)
	tr.creating(other)
	n0, n1, n2 := nodeTrace{tr, 0}, nodeTrace{tr, 1}, nodeTrace{tr, 2}
	n0.Published(rem(300, ip, other), at(3), at(10))
	tr.created(0, ip, 300, t0)
	tr.created(0, other, 300, t0)
	tr.seen(ip, 300, at(20))
	n1.Received(rem(301, ip), at(5), at(6)) // the previous endpoint's identity: not this one's
	n1.Received(rem(300, ip, other), at(30), at(31))
	n1.Taken(rem(300, ip, other), at(40))
	n2.Received(rem(300, ip), at(100), at(101))
	n2.Taken(rem(300, ip), at(200))
	tr.observe(1, rem(300, ip, other))
	r, _ := tr.report()
	if got := r.Phases.Pair["received"]; got.Count != 1 || got.Max != 30 {
		t.Fatalf("after node 1: received at each node %+v, want one pair at 30 ms", got)
	}
	if got := r.Phases.Last["received"]; got.Count != 0 {
		t.Fatalf("after node 1: the last node's time before the endpoint arrived everywhere: %+v", got)
	}
	tr.observe(2, rem(300, ip))
	r, _ = tr.report()
	want := map[string]float64{"writing": 3, "published": 10, "seen": 20, "received": 100, "queued": 101, "taken": 200}
	for name, ms := range want {
		if got := r.Phases.Last[name]; got.Count != 1 || got.Max != ms {
			t.Errorf("%s at the last node: %+v, want one endpoint at %g ms", name, got, ms)
		}
		if got := r.Phases.Pair[name]; got.Count != 2 {
			t.Errorf("%s at each node: %d pairs, want 2", name, got.Count)
		}
	}
	if got := r.Phases.Last["applied"]; got.Count != 1 || got.Max < 1000 {
		t.Errorf("applied at the last node: %+v, want one endpoint after 1 s", got)
	}
	if got := r.Phases.SteadyLast["applied"]; got.Count != 1 {
		t.Errorf("after the ramp-up (no workers to wait for): %+v, want one endpoint", got)
	}
}
