package api

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/membrane-cni/membrane/pkg/models"
)

// encoderJSON is what writeJSON wrote before the hand encoder.
func encoderJSON(tb testing.TB, v any) string {
	tb.Helper()
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(v); err != nil {
		tb.Fatal(err)
	}
	return buf.String()
}

func fullEndpoint() *models.Endpoint {
	t0 := time.Date(2026, 11, 23, 9, 1, 2, 345678900, time.UTC)
	return &models.Endpoint{ID: 65535, State: "ready", ContainerID: "c-1", ContainerName: "name", ContainerInterfaceName: "eth0",
		K8sNamespace: "ns", K8sPodName: "pod", K8sUID: "uid-1", Labels: []string{"k8s:app=web", "k8s:tier=front"},
		Identity:   &models.Identity{ID: 256, Labels: []string{"k8s:app=web"}, RefCount: 3, Reserved: true},
		Addressing: &models.AddressPair{IPv4: "10.0.0.1", IPv6: "fd00::1"}, InterfaceName: "lxc1234", InterfaceIndex: 42,
		Mac: "00:11:22:33:44:55", HostMac: "aa:bb:cc:dd:ee:ff", Netns: "/var/run/netns/x", PolicyRevision: 1 << 63,
		Regenerations: 7, LastError: "realize: <&> \"quoted\" \\ \n\t\r\b\f\x01\x7f ü \u2028\u2029 \xff\xfe end",
		Created: t0, StateChanged: t0.In(time.FixedZone("odd", -(5*3600 + 30*60 + 15)))}
}

// requireAllSet fails if a field of v (a struct, through pointers) is
// zero: a field added to the models must be set in the test's full value,
// so that the comparison with encoding/json covers it.
func requireAllSet(tb testing.TB, v reflect.Value, path string) {
	tb.Helper()
	for v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	for i := range v.NumField() {
		f, name := v.Field(i), path+"."+v.Type().Field(i).Name
		if f.IsZero() {
			tb.Fatalf("%s is zero in the test's full value: set it (and encode it by hand)", name)
		}
		if f.Kind() == reflect.Pointer && f.Elem().Kind() == reflect.Struct {
			requireAllSet(tb, f, name)
		}
	}
}

// TestEndpointJSON checks the hand encoder against json.Encoder, and
// that it hands the times encoding/json refuses back to it.
func TestEndpointJSON(t *testing.T) {
	full := fullEndpoint()
	requireAllSet(t, reflect.ValueOf(full), "Endpoint")
	only6 := *full
	only6.Addressing = &models.AddressPair{IPv6: "fd00::2"}
	noAddr := *full
	noAddr.Addressing = &models.AddressPair{}
	nilLabels := &models.Endpoint{State: "waiting-for-identity", Identity: &models.Identity{ID: 5}}
	tests := []struct {
		name string
		v    any
	}{
		{"zero", &models.Endpoint{}},
		{"full", full},
		{"only ipv6", &only6},
		{"empty addressing", &noAddr},
		{"nil labels", nilLabels},
		{"list", []*models.Endpoint{full, nil, {}, nilLabels}},
		{"empty list", []*models.Endpoint{}},
		{"nil list", []*models.Endpoint(nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []byte
			var ok bool
			switch v := tt.v.(type) {
			case *models.Endpoint:
				got, ok = appendEndpointJSON(nil, v)
			case []*models.Endpoint:
				got, ok = appendEndpointsJSON(nil, v)
			}
			if want := encoderJSON(t, tt.v); !ok || string(got) != want {
				t.Fatalf("hand encoder (ok %v)\n%s\njson.Encoder\n%s", ok, got, want)
			}
		})
	}
	for _, bad := range []time.Time{
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("far", 24*3600)),
		time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("far", -24*3600-60)),
	} {
		m := fullEndpoint()
		m.StateChanged = bad
		if _, ok := appendEndpointJSON(nil, m); ok {
			t.Errorf("time %v: hand encoder took a time encoding/json refuses", bad)
		}
		if _, err := json.Marshal(m); err == nil {
			t.Errorf("time %v: encoding/json accepts it; the hand encoder need not refuse it", bad)
		}
	}
}

// TestEndpointJSONRandom compares both encoders on random strings and
// times (every ASCII byte, invalid UTF-8, multi-byte runes).
func TestEndpointJSONRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "Z", "0", " ", "\"", "\\", "<", ">", "&", "/", "\x00", "\x1f", "\x7f", "\n", "\t",
		"é", "€", "😀", "\u2028", "\u2029", "\xff", "\xe2\x82", "\xed\xa0\x80", "\ufffd"}
	str := func() string {
		var sb strings.Builder
		for range rng.IntN(8) {
			if rng.IntN(4) == 0 {
				sb.WriteByte(byte(rng.IntN(128)))
			} else {
				sb.WriteString(alphabet[rng.IntN(len(alphabet))])
			}
		}
		return sb.String()
	}
	tm := func() time.Time {
		return time.Unix(rng.Int64N(1<<35)-1<<34, rng.Int64N(1e9)).In(time.FixedZone("z", rng.IntN(2*86399)-86399))
	}
	for i := range 2000 {
		m := &models.Endpoint{ID: rng.Int64() - 1<<62, State: str(), ContainerID: str(), K8sNamespace: str(), K8sPodName: str(),
			LastError: str(), Netns: str(), InterfaceIndex: rng.Int64N(3) - 1, PolicyRevision: rng.Uint64(),
			Created: tm(), StateChanged: tm()}
		if rng.IntN(2) == 0 {
			m.Labels = []string{str(), str()}
		}
		if rng.IntN(2) == 0 {
			m.Identity = &models.Identity{ID: rng.Int64N(1 << 20), Labels: []string{str()}, RefCount: rng.IntN(3), Reserved: rng.IntN(2) == 0}
		}
		if rng.IntN(2) == 0 {
			m.Addressing = &models.AddressPair{IPv4: str(), IPv6: str()}
		}
		got, ok := appendEndpointJSON(nil, m)
		if want := encoderJSON(t, m); !ok || string(got) != want {
			t.Fatalf("case %d: hand encoder (ok %v)\n%q\njson.Encoder\n%q", i, ok, got, want)
		}
	}
}

// FuzzEndpointJSON compares both encoders on arbitrary strings and times.
func FuzzEndpointJSON(f *testing.F) {
	f.Add("ready", "k8s:app=<web>", "\xff\u2028\x01", int64(1700000000), int64(123), 3600)
	f.Add("", "", "", int64(0), int64(0), 0)
	f.Fuzz(func(t *testing.T, state, label, lastErr string, sec, nsec int64, off int) {
		when := time.Unix(sec, nsec).In(time.FixedZone("f", off%(30*3600)))
		m := &models.Endpoint{State: state, Labels: []string{label}, LastError: lastErr, ContainerID: label,
			Identity: &models.Identity{ID: sec, Labels: []string{lastErr}}, Addressing: &models.AddressPair{IPv6: state},
			Created: when, StateChanged: when}
		got, ok := appendEndpointJSON(nil, m)
		var buf bytes.Buffer
		err := json.NewEncoder(&buf).Encode(m)
		switch {
		case err != nil && ok:
			t.Fatalf("hand encoder took what encoding/json refuses (%v)", err)
		case err == nil && !ok:
			t.Fatalf("hand encoder refused what encoding/json encodes: %s", buf.Bytes())
		case ok && !bytes.Equal(got, buf.Bytes()):
			t.Fatalf("hand encoder\n%q\njson.Encoder\n%q", got, buf.Bytes())
		}
		if ok && !utf8.Valid(got) {
			t.Fatalf("hand encoder wrote invalid UTF-8: %q", got)
		}
	})
}

// BenchmarkEndpointJSON compares the hand encoder with json.Encoder on a
// typical endpoint answer and on a list of 1,000.
func BenchmarkEndpointJSON(b *testing.B) {
	t0 := time.Date(2026, 11, 23, 9, 1, 2, 345678900, time.UTC)
	one := &models.Endpoint{ID: 1234, State: "ready", ContainerID: "sim-123456", ContainerInterfaceName: "eth0",
		K8sNamespace: "ns-3", K8sPodName: "pod-123456", Labels: []string{"k8s:app=web", "k8s:tier=front"},
		Identity:   &models.Identity{ID: 300, Labels: []string{"k8s:app=web", "k8s:tier=front"}, RefCount: 12},
		Addressing: &models.AddressPair{IPv4: "10.1.2.3"}, PolicyRevision: 3, Regenerations: 2, Created: t0, StateChanged: t0}
	list := make([]*models.Endpoint, 1000)
	for i := range list {
		list[i] = one
	}
	for _, tc := range []struct {
		name string
		v    any
	}{{"one", one}, {"list-1000", list}} {
		b.Run(tc.name+"/hand", func(b *testing.B) {
			b.ReportAllocs()
			var buf []byte
			for b.Loop() {
				switch v := tc.v.(type) {
				case *models.Endpoint:
					buf, _ = appendEndpointJSON(buf[:0], v)
				case []*models.Endpoint:
					buf, _ = appendEndpointsJSON(buf[:0], v)
				}
			}
		})
		b.Run(tc.name+"/encoding-json", func(b *testing.B) {
			b.ReportAllocs()
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			for b.Loop() {
				buf.Reset()
				if err := enc.Encode(tc.v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
