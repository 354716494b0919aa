package api

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

func checkIPAMJSON(tb testing.TB, r *models.IPAMResponse) {
	tb.Helper()
	got := string(appendIPAMResponse(nil, r)) + "\n"
	if want := encoderJSON(tb, r); got != want {
		tb.Fatalf("hand encoder\n%s\njson.Encoder\n%s", got, want)
	}
}

func TestIPAMJSON(t *testing.T) {
	full := &models.IPAMResponse{
		Address: &models.AddressPair{IPv4: "10.0.0.2", IPv6: "fd00::2"},
		HostAddressing: &models.NodeAddressing{
			IPv4: &models.NodeAddressingElement{Enabled: true, IP: "10.0.0.1", AllocRange: "10.0.0.0/16"},
			IPv6: &models.NodeAddressingElement{Enabled: true, IP: "fd00::1", AllocRange: "fd00::/64"}},
		IPv4: &models.IPAMAddressResponse{IP: "10.0.0.2", Gateway: "10.0.0.1", Cidrs: []string{"10.0.0.0/16"}, Owner: "ns/<pod>&"},
		IPv6: &models.IPAMAddressResponse{IP: "fd00::2", Gateway: "fd00::1", Cidrs: []string{"fd00::/64", "x"}, Owner: "\xff\u2028"},
	}
	requireAllSetDeep(t, reflect.ValueOf(full), "IPAMResponse")
	tests := []struct {
		name string
		r    *models.IPAMResponse
	}{
		{"nil", nil},
		{"zero", &models.IPAMResponse{}},
		{"full", full},
		{"empty parts", &models.IPAMResponse{Address: &models.AddressPair{}, HostAddressing: &models.NodeAddressing{},
			IPv4: &models.IPAMAddressResponse{}}},
		{"ipv6 only", &models.IPAMResponse{Address: &models.AddressPair{IPv6: "fd00::2"},
			HostAddressing: &models.NodeAddressing{IPv6: &models.NodeAddressingElement{}}, IPv6: full.IPv6}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkIPAMJSON(t, tt.r) })
	}
}

// requireAllSetDeep is requireAllSet through pointers to structs.
func requireAllSetDeep(tb testing.TB, v reflect.Value, name string) {
	tb.Helper()
	requireAllSet(tb, v, name)
	v = v.Elem()
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.Pointer && f.Elem().Kind() == reflect.Struct {
			requireAllSetDeep(tb, f, name+"."+v.Type().Field(i).Name)
		}
	}
}

// FuzzIPAMJSON compares both encoders on arbitrary strings.
func FuzzIPAMJSON(f *testing.F) {
	f.Add("10.0.0.2", "ns/pod", "10.0.0.0/16", true)
	f.Fuzz(func(t *testing.T, ip, owner, cidr string, enabled bool) {
		r := &models.IPAMResponse{Address: &models.AddressPair{IPv4: ip, IPv6: owner},
			HostAddressing: &models.NodeAddressing{IPv6: &models.NodeAddressingElement{Enabled: enabled, IP: ip, AllocRange: cidr}},
			IPv4:           &models.IPAMAddressResponse{IP: ip, Gateway: owner, Cidrs: []string{cidr, owner}, Owner: owner}}
		var buf bytes.Buffer
		if err := json.NewEncoder(&buf).Encode(r); err != nil {
			t.Fatal(err)
		}
		if got := string(appendIPAMResponse(nil, r)) + "\n"; got != buf.String() {
			t.Fatalf("hand encoder\n%q\njson.Encoder\n%q", got, buf.String())
		}
	})
}
