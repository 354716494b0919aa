package datapath

import (
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
