package client

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

func TestDecodeIPAM(t *testing.T) {
	fullR := &models.IPAMResponse{
		Address: &models.AddressPair{IPv4: "10.0.0.2", IPv6: "fd00::2"},
		HostAddressing: &models.NodeAddressing{
			IPv4: &models.NodeAddressingElement{Enabled: true, IP: "10.0.0.1", AllocRange: "10.0.0.0/16"},
			IPv6: &models.NodeAddressingElement{Enabled: true, IP: "fd00::1", AllocRange: "fd00::/64"}},
		IPv4: &models.IPAMAddressResponse{IP: "10.0.0.2", Gateway: "10.0.0.1", Cidrs: []string{"10.0.0.0/16"}, Owner: "ns/pod"},
		IPv6: &models.IPAMAddressResponse{IP: "fd00::2", Gateway: "fd00::1", Cidrs: []string{"fd00::/64", "x"}, Owner: "ns/pod"},
	}
	requireAllSet(t, reflect.ValueOf(fullR), "IPAMResponse")
	full, err := json.Marshal(fullR)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		data     string
		wantHand bool
	}{
		{"full", string(full) + "\n", true},
		{"ipv4 only", `{"address":{"ipv4":"10.0.0.2"},"host-addressing":{"ipv4":{"enabled":true,"ip":"10.0.0.1","alloc-range":"10.0.0.0/16"}},` +
			`"ipv4":{"ip":"10.0.0.2","gateway":"10.0.0.1","cidrs":["10.0.0.0/16"]}}`, true},
		{"empty", `{"address":{},"host-addressing":{}}`, true},
		{"disabled family", `{"host-addressing":{"ipv6":{"enabled":false}}}`, true},
		// Left to encoding/json.
		{"null address", `{"address":null}`, false},
		{"null cidrs", `{"ipv4":{"cidrs":null}}`, false},
		{"unknown key", `{"address":{},"extra":1}`, false},
		{"enabled as string", `{"host-addressing":{"ipv4":{"enabled":"yes"}}}`, false},
		{"duplicate", `{"ipv4":{"ip":"a","ip":"b"}}`, false},
		{"truncated", `{"address":{"ipv4":"10.0.0.2"}`, false},
		{"trailing", `{} {}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkHand(t, []byte(tt.data), tt.wantHand, decodeIPAM) })
	}
}

// FuzzDecodeIPAM: on any input, the hand decoder either refuses and
// leaves its output alone, or agrees with encoding/json.
func FuzzDecodeIPAM(f *testing.F) {
	f.Add([]byte(`{"address":{"ipv4":"10.0.0.2"},"host-addressing":{"ipv4":{"enabled":true,"ip":"10.0.0.1","alloc-range":"10.0.0.0/16"}},` +
		`"ipv4":{"ip":"10.0.0.2","gateway":"10.0.0.1","cidrs":["10.0.0.0/16"],"owner":"ns/pod"}}` + "\n"))
	f.Add([]byte(`{"host-addressing":{"ipv6":{"enabled":false}}}`))
	f.Fuzz(func(t *testing.T, data []byte) { checkHand(t, data, false, decodeIPAM) })
}
