package restore

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzDecode: ep.json from disk never panics the agent; what decodes is
// an endpoint with a non-zero ID that survives a round trip through the
// on-disk form unchanged; what does not decode is ErrCorrupt or
// ErrUnknownVersion (Scan quarantines on those).
func FuzzDecode(f *testing.F) {
	good, err := json.MarshalIndent(FromEndpoint(benchEndpoint(f, 42)), "", "  ")
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range [][]byte{good, good[:len(good)/2], []byte(`{"version": 99}`), []byte(`{}`),
		[]byte(`{"version":1,"endpoint":{"id":1,"labels":["k8s:a=b"],"ipv4":"10.0.0.1","ipv6":"fd00::1"}}`)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ep, err := Decode(data)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrUnknownVersion) {
				t.Fatalf("error %v is neither ErrCorrupt nor ErrUnknownVersion", err)
			}
			return
		}
		if ep.ID == 0 {
			t.Fatal("decoded endpoint 0")
		}
		again, err := json.Marshal(FromEndpoint(ep))
		if err != nil {
			t.Fatal(err)
		}
		ep2, err := Decode(again)
		if err != nil {
			t.Fatalf("re-decoding %s: %v", again, err)
		}
		if a, b := FromEndpoint(ep), FromEndpoint(ep2); !recordsEqual(a, b) {
			t.Fatalf("round trip changed the record:\n%+v\n%+v", a, b)
		}
	})
}

func recordsEqual(a, b Record) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// TestDecodeInterfaceNames: a record whose interface names the API would
// refuse (the host's eth0, a path) is corrupt, so restore quarantines it
// instead of writing sysctls of or deleting that link.
func TestDecodeInterfaceNames(t *testing.T) {
	for _, tc := range []struct{ field, value string }{
		{"interface-name", "eth0"}, {"interface-name", "../all"}, {"interface-name", "lxc_other"},
		{"container-interface-name", ".."}, {"container-interface-name", "eth0123456789abc"},
	} {
		data := []byte(`{"version":1,"endpoint":{"id":1,"labels":["k8s:a=b"],"` + tc.field + `":"` + tc.value + `"}}`)
		if _, err := Decode(data); !errors.Is(err, ErrCorrupt) {
			t.Errorf("Decode with %s %q = %v, want ErrCorrupt", tc.field, tc.value, err)
		}
	}
	ok := []byte(`{"version":1,"endpoint":{"id":1,"labels":["k8s:a=b"],"interface-name":"lxc0123456789ab","container-interface-name":"eth0"}}`)
	if _, err := Decode(ok); err != nil {
		t.Fatalf("Decode of valid names: %v", err)
	}
	// A chained endpoint's host interface is another plugin's: any kernel
	// name, and only with chained.
	chained := []byte(`{"version":1,"endpoint":{"id":1,"labels":["k8s:a=b"],"interface-name":"veth1a2b3c4d","chained":true}}`)
	ep, err := Decode(chained)
	if err != nil || !ep.Chained || ep.IfName != "veth1a2b3c4d" {
		t.Fatalf("Decode of a chained endpoint = %+v, %v", ep, err)
	}
	if rec := FromEndpoint(ep); !rec.Endpoint.Chained {
		t.Errorf("FromEndpoint of a chained endpoint lost chained")
	}
	for _, bad := range []string{
		`{"version":1,"endpoint":{"id":1,"labels":["k8s:a=b"],"interface-name":"veth1a2b3c4d"}}`,
		`{"version":1,"endpoint":{"id":1,"labels":["k8s:a=b"],"interface-name":"../all","chained":true}}`,
	} {
		if _, err := Decode([]byte(bad)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("Decode(%s) = %v, want ErrCorrupt", bad, err)
		}
	}
}
