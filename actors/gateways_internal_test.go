package actors

import (
	"net/netip"
	"slices"
	"testing"
)

// TestConfigGateways: the ranges' gateways, then the host's addresses
// without duplicates, without those inside a pod range, IPv4-mapped ones
// as IPv4.
func TestConfigGateways(t *testing.T) {
	a := netip.MustParseAddr
	tests := []struct {
		name string
		host []netip.Addr
		want []netip.Addr
	}{
		{"ranges only", nil, []netip.Addr{a("10.1.0.1"), a("fd00:1::1")}},
		{"host addresses", []netip.Addr{a("192.0.2.10"), a("2001:db8::10")},
			[]netip.Addr{a("10.1.0.1"), a("fd00:1::1"), a("192.0.2.10"), a("2001:db8::10")}},
		{"duplicates, pod-range and mapped", []netip.Addr{a("10.1.0.1"), a("10.1.0.7"), a("::ffff:192.0.2.10"), a("192.0.2.10"), a("fd00:1::9")},
			[]netip.Addr{a("10.1.0.1"), a("fd00:1::1"), a("192.0.2.10")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{IPAM: IPAMConfig{IPv4: netip.MustParsePrefix("10.1.0.0/24"), IPv6: netip.MustParsePrefix("fd00:1::/120")}, HostAddrs: tc.host}
			if got := c.gateways(); !slices.Equal(got, tc.want) {
				t.Errorf("gateways() = %v, want %v", got, tc.want)
			}
		})
	}
}
