package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
)

func TestFirstOverlap(t *testing.T) {
	node := func(name string, cidrs ...string) RemoteNode {
		n := RemoteNode{Name: name}
		for _, c := range cidrs {
			n.PodCIDRs = append(n.PodCIDRs, netip.MustParsePrefix(c))
		}
		return n
	}
	cases := []struct {
		nodes []RemoteNode
		want  string // "a b" of the pair found, "" none
	}{
		{[]RemoteNode{node("a", "10.1.0.0/24"), node("b", "10.2.0.0/24"), node("c", "fd00::/64", "10.3.0.0/24")}, ""},
		{[]RemoteNode{node("a", "10.0.0.0/8"), node("b", "10.1.0.0/24"), node("c", "10.2.0.0/24")}, "a b"},
		// Contained in a CIDR that is not its sorted neighbour.
		{[]RemoteNode{node("a", "10.0.0.0/15"), node("b", "10.0.1.0/24"), node("c", "10.1.2.0/24")}, "a b"},
		{[]RemoteNode{node("a", "10.0.0.0/16", "10.0.255.0/24")}, "a a"},
		{[]RemoteNode{node("a", "10.1.0.0/24"), node("b", "10.1.0.0/24")}, "a b"},
		// IPv4 and IPv6 never overlap; ::/0 covers every IPv6 one.
		{[]RemoteNode{node("a", "0.0.0.0/0"), node("b", "fd00::/64")}, ""},
		{[]RemoteNode{node("a", "fd00::/64"), node("b", "::/0")}, "b a"},
		{[]RemoteNode{node("a", "10.255.255.0/24"), node("b", "11.0.0.0/24")}, ""},
	}
	for i, c := range cases {
		x, y, ok := FirstOverlap(c.nodes)
		got := ""
		if ok {
			got = fmt.Sprintf("%s %s", x.Node, y.Node)
		}
		if got != c.want {
			t.Errorf("case %d: %q (%v %v), want %q", i, got, x, y, c.want)
		}
	}
}

func TestNodesConfigValidate(t *testing.T) {
	ok := NodesConfig{}.WithDefaults()
	if ok.Routing != RoutingTunnel || ok.TunnelDevice != DefaultTunnelDevice || ok.TunnelPort != 8472 || ok.TunnelMTU != 1450 {
		t.Fatalf("defaults %+v", ok)
	}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := map[string]func(*NodesConfig){
		"routing":            func(c *NodesConfig) { c.Routing = "bgp" },
		"device name":        func(c *NodesConfig) { c.TunnelDevice = "a-very-long-device-name" },
		"port":               func(c *NodesConfig) { c.TunnelPort = 70000 },
		"mtu":                func(c *NodesConfig) { c.TunnelMTU = 500 },
		"masquerade no cidr": func(c *NodesConfig) { c.Masquerade = true },
		"unmasked cidr":      func(c *NodesConfig) { c.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.1/8")} },
	}
	for name, mut := range bad {
		c := ok
		mut(&c)
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
}

func TestValidateNodes(t *testing.T) {
	n := RemoteNode{Name: "b", Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("2001:db8::2")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.2.0.0/24")}}
	n.HealthIPs = []netip.Addr{netip.MustParseAddr("10.2.0.2")} // checked against the CIDRs by the nodes actor, not here
	bare := RemoteNode{Name: "c"}                               // no podCIDR assigned yet: valid, nothing routed
	if err := ValidateNodes([]RemoteNode{n, bare}); err != nil {
		t.Fatal(err)
	}
	bad := map[string]func(*RemoteNode){
		"space in name":   func(n *RemoteNode) { n.Name = "a b" },
		"three addresses": func(n *RemoteNode) { n.Addrs = append(n.Addrs, netip.MustParseAddr("192.0.2.9")) },
		"two IPv4": func(n *RemoteNode) {
			n.Addrs = []netip.Addr{netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3")}
		},
		"loopback":          func(n *RemoteNode) { n.Addrs = []netip.Addr{netip.MustParseAddr("127.0.0.1")} },
		"zone":              func(n *RemoteNode) { n.Addrs = []netip.Addr{netip.MustParseAddr("fe80::1%eth0")} },
		"invalid CIDR":      func(n *RemoteNode) { n.PodCIDRs = []netip.Prefix{{}} },
		"mapped CIDR":       func(n *RemoteNode) { n.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("::ffff:10.2.0.0/120")} },
		"overlap with self": func(n *RemoteNode) { n.PodCIDRs = append(n.PodCIDRs, netip.MustParsePrefix("10.2.0.128/25")) },
		"three health addresses": func(n *RemoteNode) {
			n.HealthIPs = []netip.Addr{netip.MustParseAddr("10.2.0.2"), netip.MustParseAddr("10.2.0.3"), netip.MustParseAddr("10.2.0.4")}
		},
		"unspecified health address": func(n *RemoteNode) { n.HealthIPs = []netip.Addr{netip.IPv4Unspecified()} },
	}
	for name, mut := range bad {
		c := n
		mut(&c)
		if err := ValidateNodes([]RemoteNode{c}); !errors.Is(err, ErrInvalidNode) {
			t.Errorf("%s: %v, want ErrInvalidNode", name, err)
		}
	}
}

// coverPrefixes keeps the prefixes no other covers, once each, sorted:
// the masquerade chain's exclusions (a cluster CIDR swallows the nodes'
// pod CIDRs inside it).
func TestCoverPrefixes(t *testing.T) {
	pp := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	for _, tc := range []struct{ in, want []netip.Prefix }{
		{nil, nil},
		{pp("10.244.1.0/24", "10.244.0.0/16", "10.244.2.0/24", "fd00:10:0:1::/64"), pp("10.244.0.0/16", "fd00:10:0:1::/64")},
		{pp("10.2.0.0/24", "10.1.0.0/24", "10.2.0.0/24"), pp("10.1.0.0/24", "10.2.0.0/24")},
		{pp("fd00::/104", "10.0.0.0/8", "fd00::/64"), pp("10.0.0.0/8", "fd00::/64")},
	} {
		if got := coverPrefixes(tc.in); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("coverPrefixes(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
