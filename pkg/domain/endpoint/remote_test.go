package endpoint_test

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

func TestRemoteCheckOwner(t *testing.T) {
	n2 := &endpoint.OwnerNode{Name: "n2", Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("2001:db8::2")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.9.2.0/24"), netip.MustParsePrefix("fd00:9:2::/64")}}
	ok := endpoint.Remote{IPs: []netip.Addr{netip.MustParseAddr("10.9.2.5"), netip.MustParseAddr("fd00:9:2::5")}, Identity: 1000,
		Node: "n2", NodeIP: netip.MustParseAddr("192.0.2.2")}
	for _, tc := range []struct {
		name   string
		mod    func(*endpoint.Remote)
		owner  string
		node   *endpoint.OwnerNode
		reason string // "": accepted
	}{
		{"accepted", nil, "n2", n2, ""},
		{"no node ip", func(r *endpoint.Remote) { r.NodeIP = netip.Addr{} }, "n2", n2, ""},
		{"mapped addresses", func(r *endpoint.Remote) {
			r.IPs = []netip.Addr{netip.MustParseAddr("::ffff:10.9.2.5")}
			r.NodeIP = netip.MustParseAddr("::ffff:192.0.2.2")
		}, "n2", n2, ""},
		{"unnamed record", func(r *endpoint.Remote) { r.Node = "" }, "n2", n2, ""},
		{"host identity", func(r *endpoint.Remote) { r.Identity = identity.ReservedHost }, "n2", n2, endpoint.RefusedReserved},
		{"unused reserved number", func(r *endpoint.Remote) { r.Identity = 255 }, "n2", n2, endpoint.RefusedReserved},
		{"no owner", nil, "", n2, endpoint.RefusedNoOwner},
		{"owner and node disagree", nil, "n3", &endpoint.OwnerNode{Name: "n3"}, endpoint.RefusedNoOwner},
		{"unknown node", nil, "n2", nil, endpoint.RefusedUnknownNode},
		{"address outside", func(r *endpoint.Remote) { r.IPs = append(r.IPs, netip.MustParseAddr("10.9.3.5")) }, "n2", n2, endpoint.RefusedOutsideNode},
		{"node without cidrs", nil, "n2", &endpoint.OwnerNode{Name: "n2", Addrs: n2.Addrs}, endpoint.RefusedOutsideNode},
		{"foreign node ip", func(r *endpoint.Remote) { r.NodeIP = netip.MustParseAddr("192.0.2.3") }, "n2", n2, endpoint.RefusedNodeIP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ok
			r.IPs = append([]netip.Addr(nil), ok.IPs...)
			if tc.mod != nil {
				tc.mod(&r)
			}
			err := r.CheckOwner(tc.owner, tc.node)
			var re *endpoint.RefusedError
			switch {
			case tc.reason == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.reason != "" && (!errors.As(err, &re) || re.Reason != tc.reason):
				t.Fatalf("CheckOwner = %v; want reason %s", err, tc.reason)
			}
		})
	}
}

// TestCheckHealthIPs: a node's health endpoint addresses are believed
// inside its own pod CIDRs only, never in this node's ranges, one per
// family.
func TestCheckHealthIPs(t *testing.T) {
	n2 := &endpoint.OwnerNode{Name: "n2", Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.2")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.9.2.0/24"), netip.MustParsePrefix("fd00:9:2::/64")}}
	local := []netip.Prefix{netip.MustParsePrefix("10.9.1.0/24")}
	a := netip.MustParseAddr
	for _, tc := range []struct {
		name    string
		node    *endpoint.OwnerNode
		ips     []netip.Addr
		ok      []netip.Addr
		refused []netip.Addr
	}{
		{"both families", n2, []netip.Addr{a("10.9.2.7"), a("fd00:9:2::7")}, []netip.Addr{a("10.9.2.7"), a("fd00:9:2::7")}, nil},
		{"mapped", n2, []netip.Addr{a("::ffff:10.9.2.7")}, []netip.Addr{a("10.9.2.7")}, nil},
		{"another node's pod", n2, []netip.Addr{a("10.9.3.7")}, nil, []netip.Addr{a("10.9.3.7")}},
		{"its own node address", n2, []netip.Addr{a("192.0.2.2")}, nil, []netip.Addr{a("192.0.2.2")}},
		{"this node's pod", &endpoint.OwnerNode{Name: "n2", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}},
			[]netip.Addr{a("10.9.1.5")}, nil, []netip.Addr{a("10.9.1.5")}},
		{"node without cidrs", &endpoint.OwnerNode{Name: "n2"}, []netip.Addr{a("10.9.2.7")}, nil, []netip.Addr{a("10.9.2.7")}},
		{"two of one family", n2, []netip.Addr{a("10.9.2.7"), a("10.9.2.8")}, []netip.Addr{a("10.9.2.7")}, []netip.Addr{a("10.9.2.8")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, refused := endpoint.CheckHealthIPs(tc.node, tc.ips, local)
			if !slices.Equal(ok, tc.ok) {
				t.Errorf("accepted %v, want %v", ok, tc.ok)
			}
			if len(refused) != len(tc.refused) {
				t.Errorf("refused %v, want %v", refused, tc.refused)
			}
			for _, ip := range tc.refused {
				if r := refused[ip]; r == nil || r.Reason != endpoint.RefusedHealthOutsideNode {
					t.Errorf("%s: refusal %v, want %s", ip, r, endpoint.RefusedHealthOutsideNode)
				}
			}
		})
	}
}
