package sim

import (
	"net/netip"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// TestConvTracker: an endpoint is timed at each other node when that
// node's ipcache takes it with its identity (not another identity), and
// everywhere once all have; a pair is given up when the endpoint is
// deleted or a node goes down first, and the endpoint then has no
// everywhere time; the steady histograms start once every worker is full.
func TestConvTracker(t *testing.T) {
	tr := newConvTracker(3, 1)
	ip1, ip2, ip3 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	t0 := time.Now().Add(-time.Second)
	tr.created(0, ip1, 300, t0)
	tr.observe(1, []endpoint.Remote{{IPs: []netip.Addr{ip1}, Identity: 301}}) // wrong identity: not there yet
	tr.observe(1, []endpoint.Remote{{IPs: []netip.Addr{ip1}, Identity: 300}})
	tr.observe(0, []endpoint.Remote{{IPs: []netip.Addr{ip1}, Identity: 300}}) // its own node: not waited for
	r, _ := tr.report()
	if r.ToNode.Count != 1 || r.Everywhere.Count != 0 || r.Pending != 1 {
		t.Fatalf("after node 1: %+v %+v pending %d", r.ToNode, r.Everywhere, r.Pending)
	}
	tr.observe(2, []endpoint.Remote{{IPs: []netip.Addr{ip1}, Identity: 300}})
	r, p99 := tr.report()
	if r.ToNode.Count != 2 || r.Everywhere.Count != 1 || r.Pending != 0 || r.Everywhere.Max < 1000 || p99[0] != 0 || p99[1] == 0 {
		t.Fatalf("after node 2: %+v %+v pending %d, per node %v", r.ToNode, r.Everywhere, r.Pending, p99)
	}
	tr.created(1, ip2, 300, time.Now())
	tr.observe(0, []endpoint.Remote{{IPs: []netip.Addr{ip2}, Identity: 300}})
	tr.deleted(ip2) // node 2 never got it
	tr.workerFull()
	tr.created(2, ip3, 302, time.Now())
	tr.nodeDown(0)
	tr.observe(1, []endpoint.Remote{{IPs: []netip.Addr{ip3}, Identity: 302}})
	ip4 := netip.MustParseAddr("10.0.0.4") // reaches node 1 before its creation is answered
	tr.creating(ip4)
	tr.observe(1, []endpoint.Remote{{IPs: []netip.Addr{ip4}, Identity: 303}})
	tr.created(2, ip4, 303, time.Now())
	r, _ = tr.report()
	if r.ToNode.Count != 5 || r.Everywhere.Count != 1 || r.Abandoned != 3 || r.Pending != 0 || r.SteadyToNode.Count != 2 || r.SteadyEverywhere.Count != 0 {
		t.Fatalf("after a delete and a crash: %+v", r)
	}
}
