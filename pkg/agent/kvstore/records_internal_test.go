package kvstore

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// Issue #35: an endpoint record carries the pod's named ports; a record
// whose ports do not validate is refused whole.
func TestDecodeEndpointNamedPorts(t *testing.T) {
	r, err := decodeEndpoint([]byte(`{"ips":["10.1.0.5"],"identity":300,"node":"n2","namedPorts":["http/TCP=8080","dns/UDP=53"]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := hold("n2/1", r, 1).remote().NamedPorts; got.String() != "dns/UDP=53,http/TCP=8080" {
		t.Fatalf("named ports %s", got)
	}
	for _, bad := range []string{`["HTTP=80"]`, `["http=0"]`, `["http/ICMP=1"]`, `["http=80","http=81"]`, `[7]`} {
		if _, err := decodeEndpoint([]byte(`{"ips":["10.1.0.5"],"identity":300,"node":"n2","namedPorts":` + bad + `}`)); err == nil {
			t.Errorf("namedPorts %s: accepted", bad)
		}
	}
	// What the publisher writes decodes back.
	ports := policy.NamedPorts{{Name: "web", Proto: policy.ProtoSCTP, Port: 1}}
	rec := endpointRecord{NamedPorts: []string{ports.String()}}
	if !strings.Contains(rec.NamedPorts[0], "web/SCTP=1") {
		t.Fatalf("record %v", rec.NamedPorts)
	}
}

// recordForms are endpoint records in the publisher's form and in others
// (valid JSON or not), for the direct parser's tests.
func recordForms(t testing.TB) []string {
	var out []string
	for _, r := range []endpointRecord{
		{IPs: []netip.Addr{netip.MustParseAddr("10.1.0.5")}, Identity: 300, Node: "n2"},
		{IPs: []netip.Addr{netip.MustParseAddr("10.1.0.5"), netip.MustParseAddr("fd00::5")}, Identity: 65535, Node: "sim-node-7",
			NodeIP: netip.MustParseAddr("192.0.2.7"), NamedPorts: []string{"dns/UDP=53", "http/TCP=8080"}},
		{IPs: []netip.Addr{netip.MustParseAddr("fe80::1%eth0")}, Identity: 0, Node: ""},
		{IPs: []netip.Addr{netip.MustParseAddr("10.1.0.5")}, Identity: 4294967295, Node: "a\"b\\c\u00e9\x01<>&"},
	} {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(b))
	}
	return append(out,
		`{"ips":["10.1.0.5"],"identity":300,"node":"n2"}`,
		`{"ips":["10.1.0.5"],"identity":300,"node":"n2","nodeIP":""}`,
		`{"ips":[""],"identity":300,"node":"n2"}`,
		`{"ips":[],"identity":300,"node":"n2"}`,
		`{"ips":null,"identity":300,"node":"n2"}`,
		`{"ips":["10.1.0.5","10.1.0.6","10.1.0.7"],"identity":300,"node":"n2"}`,
		`{"ips":["10.1.0.5"],"identity":0300,"node":"n2"}`,
		`{"ips":["10.1.0.5"],"identity":300.0,"node":"n2"}`,
		`{"ips":["10.1.0.5"],"identity":3e2,"node":"n2"}`,
		`{"ips":["10.1.0.5"],"identity":-1,"node":"n2"}`,
		`{"ips":["10.1.0.5"],"identity":4294967296,"node":"n2"}`,
		`{"ips":["10.1.0.5"],"identity":300,"node":"n2"} `,
		`{"ips":["10.1.0.5"],"identity":300,"node":"n2"}x`,
		`{"ips":["10.1.0.5"], "identity":300,"node":"n2"}`,
		`{"IPS":["10.1.0.5"],"identity":300,"node":"n2"}`,
		`{"ips":["10.1.0.5"],"identity":300,"node":"n2","node":"n3"}`,
		`{"ips":["10.1.0.5"],"identity":300,"node":"n\u0032"}`,
		`{"ips":["10.1.0.5"],"identity":300,"node":"n2","extra":1}`,
		`{"ips":["10.1.0.5"],"identity":300,"node":"n2","namedPorts":[]}`,
		`{"ips":["10.1.0.5"],"identity":300,"node":"n2","namedPorts":["http/TCP=80",]}`,
		`{"ips":["10.1.0.x"],"identity":300,"node":"n2"}`,
		`{"ips":["10.1.0.5"],"identity":300,"node":"n2"`,
		`{"ips":["10.1.0.5"],"identity":300,"node":"n`,
		``,
	)
}

// TestParseEndpointRecord: the direct parser returns what json.Unmarshal
// does for every form it takes, takes the publisher's form, and leaves
// everything else to json.Unmarshal.
func TestParseEndpointRecord(t *testing.T) {
	taken := 0
	for _, v := range recordForms(t) {
		if checkParse(t, []byte(v)) {
			taken++
		}
	}
	if taken != 6 {
		t.Errorf("the direct parser took %d forms, want the 6 in the publisher's form", taken)
	}
}

// checkParse checks parseEndpointRecord against json.Unmarshal on v; it
// reports whether the parser took v.
func checkParse(t testing.TB, v []byte) bool {
	got, ok := parseEndpointRecord(v)
	if !ok {
		return false
	}
	var want endpointRecord
	if err := json.Unmarshal(v, &want); err != nil {
		t.Fatalf("%q: parsed as %+v; json.Unmarshal: %v", v, got, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%q: parsed as %+v; json.Unmarshal: %+v", v, got, want)
	}
	return true
}

func FuzzParseEndpointRecord(f *testing.F) {
	for _, v := range recordForms(f) {
		f.Add([]byte(v))
	}
	f.Fuzz(func(t *testing.T, v []byte) { checkParse(t, v) })
}

// TestDecodeEndpointAllocs: a record in the publisher's form decodes
// without encoding/json (which allocates 14 times for this one).
func TestDecodeEndpointAllocs(t *testing.T) {
	v := []byte(`{"ips":["10.1.0.5"],"identity":300,"node":"sim-node-7","nodeIP":"192.0.2.7"}`)
	if n := testing.AllocsPerRun(100, func() {
		if _, err := decodeEndpoint(v); err != nil {
			t.Fatal(err)
		}
	}); n > 5 {
		t.Fatalf("decoding a record allocated %.0f times, want at most 5", n)
	}
}

func BenchmarkDecodeEndpoint(b *testing.B) {
	v := []byte(`{"ips":["10.1.0.5"],"identity":300,"node":"sim-node-7","nodeIP":"192.0.2.7"}`)
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			if _, err := decodeEndpoint(v); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json", func(b *testing.B) {
		for b.Loop() {
			var r endpointRecord
			if err := json.Unmarshal(v, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
}
