package cni

import (
	"testing"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// TestParseAllocation: the plugin takes every family the agent answered,
// IPv4 first, and refuses an answer without an address or with an
// address or gateway of the wrong family, returning what parsed (for
// release).
func TestParseAllocation(t *testing.T) {
	v4 := &models.IPAMAddressResponse{IP: "10.0.0.2", Gateway: "10.0.0.1"}
	v6 := &models.IPAMAddressResponse{IP: "fd00::2", Gateway: "fd00::1"}
	tests := []struct {
		name    string
		res     models.IPAMResponse
		want    []string // addresses returned
		wantErr bool
	}{
		{"dual-stack", models.IPAMResponse{IPv4: v4, IPv6: v6}, []string{"10.0.0.2", "fd00::2"}, false},
		{"ipv4 only", models.IPAMResponse{IPv4: v4}, []string{"10.0.0.2"}, false},
		{"ipv6 only", models.IPAMResponse{IPv6: v6}, []string{"fd00::2"}, false},
		{"nothing", models.IPAMResponse{}, nil, true},
		{"ipv6 in the ipv4 slot", models.IPAMResponse{IPv4: v6}, nil, true},
		{"ipv4 gateway for ipv6", models.IPAMResponse{IPv4: v4, IPv6: &models.IPAMAddressResponse{IP: "fd00::2", Gateway: "10.0.0.1"}}, []string{"10.0.0.2", "fd00::2"}, true},
		{"bad ipv6", models.IPAMResponse{IPv4: v4, IPv6: &models.IPAMAddressResponse{IP: "fd00::zz", Gateway: "fd00::1"}}, []string{"10.0.0.2"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addrs, err := parseAllocation(&tt.res)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			var got []string
			for _, a := range addrs {
				got = append(got, a.ip.String())
				if !tt.wantErr && a.gateway.Is4() != a.ip.Is4() {
					t.Fatalf("address %s with gateway %s", a.ip, a.gateway)
				}
			}
			if len(got) != len(tt.want) {
				t.Fatalf("addresses %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("addresses %v, want %v", got, tt.want)
				}
			}
		})
	}
}
