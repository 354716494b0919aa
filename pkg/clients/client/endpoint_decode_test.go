package client

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// checkDecode decodes data both ways: when the hand decoder accepts,
// encoding/json must accept and agree; when wantHand is set, the hand
// decoder must accept.
func checkDecode(tb testing.TB, data []byte, wantHand bool) {
	tb.Helper()
	checkHand(tb, data, wantHand, decodeEndpoint)
}

func checkHand[T any](tb testing.TB, data []byte, wantHand bool, decode func([]byte, *T) bool) {
	tb.Helper()
	var hand, std, zero T
	ok := decode(data, &hand)
	err := json.Unmarshal(data, &std)
	switch {
	case wantHand && !ok:
		tb.Fatalf("hand decoder refused %s", data)
	case !ok:
		if !reflect.DeepEqual(hand, zero) {
			tb.Fatalf("hand decoder refused %s but changed its output", data)
		}
	case err != nil:
		tb.Fatalf("hand decoder accepted %s; encoding/json: %v", data, err)
	case !reflect.DeepEqual(hand, std):
		tb.Fatalf("%s:\nhand decoder  %+v\nencoding/json %+v", data, hand, std)
	}
}

// requireAllSet fails if a field of v (a struct, through pointers) is
// zero: a field added to the models must be set in the test's full value,
// so that the hand decoder is checked on it.
func requireAllSet(tb testing.TB, v reflect.Value, path string) {
	tb.Helper()
	for v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	for i := range v.NumField() {
		f, name := v.Field(i), path+"."+v.Type().Field(i).Name
		if f.IsZero() {
			tb.Fatalf("%s is zero in the test's full value: set it (and decode it by hand)", name)
		}
		if f.Kind() == reflect.Pointer && f.Elem().Kind() == reflect.Struct {
			requireAllSet(tb, f, name)
		}
	}
}

func TestDecodeEndpoint(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 9, 1, 2, 345678900, time.UTC)
	fullEp := &models.Endpoint{ID: 65535, State: "ready", ContainerID: "c-1", ContainerName: "n",
		ContainerInterfaceName: "eth0", K8sNamespace: "ns", K8sPodName: "pod", K8sUID: "uid",
		Labels:     []string{"k8s:app=web", "k8s:tier=front"},
		Identity:   &models.Identity{ID: 256, Labels: []string{"k8s:app=web"}, RefCount: 3, Reserved: true, Scope: "cluster"},
		Addressing: &models.AddressPair{IPv4: "10.0.0.1", IPv6: "fd00::1"}, InterfaceName: "lxc1", InterfaceIndex: 42,
		Mac: "00:11:22:33:44:55", HostMac: "aa:bb:cc:dd:ee:ff", Netns: "/run/netns/x", PolicyRevision: 1<<64 - 1,
		Regenerations: 7, LastError: "boom", Created: t0, StateChanged: t0.In(time.FixedZone("z", -5*3600-30*60)), Chained: true,
		PolicyAuditMode: true}
	requireAllSet(t, reflect.ValueOf(fullEp), "Endpoint")
	full, err := json.Marshal(fullEp)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		data     string
		wantHand bool
	}{
		{"full", string(full) + "\n", true},
		{"empty object", `{}`, true},
		{"spaced", " {\n\t\"id\" : -7 ,\r\n \"labels\" : [ ] , \"identity\" : { } , \"addressing\":{}}\n ", true},
		{"min int", `{"id":-9223372036854775808}`, true},
		{"reserved false", `{"identity":{"id":1,"reserved":false,"labels":["reserved:host"]}}`, true},
		// Left to encoding/json (which decodes or refuses them).
		{"escaped string", `{"state":"a\"b"}`, false},
		{"non-ASCII", `{"state":"é"}`, false},
		{"unknown key", `{"bogus":1,"id":1}`, false},
		{"other case key", `{"ID":1}`, false},
		{"duplicate key", `{"id":1,"id":2}`, false},
		{"null labels", `{"labels":null}`, false},
		{"null identity", `{"identity":null}`, false},
		{"float id", `{"id":1.5}`, false},
		{"exponent id", `{"id":1e3}`, false},
		{"leading zero", `{"id":01}`, false},
		{"overflow", `{"id":9223372036854775808}`, false},
		{"negative revision", `{"policy-revision":-1}`, false},
		{"bad time", `{"created":"yesterday"}`, false},
		{"trailing data", `{"id":1} x`, false},
		{"second value", `{"id":1}{}`, false},
		{"truncated", `{"id":1,`, false},
		{"missing comma", `{"id":1 "state":"x"}`, false},
		{"trailing comma", `{"id":1,}`, false},
		{"array", `[]`, false},
		{"empty", ``, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkDecode(t, []byte(tt.data), tt.wantHand) })
	}
}

// TestDecodeEndpointRandom decodes encoding/json's output of random
// endpoints, ASCII-only values (what the hand decoder takes).
func TestDecodeEndpointRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	str := func() string {
		const chars = "abcXYZ019 :=/._-"
		var sb strings.Builder
		for range rng.IntN(12) {
			sb.WriteByte(chars[rng.IntN(len(chars))])
		}
		return sb.String()
	}
	for range 2000 {
		m := &models.Endpoint{ID: rng.Int64() - 1<<62, State: str(), ContainerID: str(), K8sNamespace: str(),
			K8sPodName: str(), Netns: str(), InterfaceIndex: rng.Int64N(5), PolicyRevision: rng.Uint64(),
			Regenerations: rng.Uint64N(10), Labels: []string{}, Created: time.Unix(rng.Int64N(1<<33), rng.Int64N(1e9)).UTC(),
			StateChanged: time.Unix(rng.Int64N(1<<33), 0).In(time.FixedZone("z", 3600*(rng.IntN(27)-13)))}
		for range rng.IntN(4) {
			m.Labels = append(m.Labels, str())
		}
		if rng.IntN(2) == 0 {
			m.Identity = &models.Identity{ID: rng.Int64N(1 << 24), Labels: []string{str()}, RefCount: rng.IntN(5), Reserved: rng.IntN(2) == 0}
		}
		if rng.IntN(2) == 0 {
			m.Addressing = &models.AddressPair{IPv4: str()}
		}
		data, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		checkDecode(t, data, true)
	}
}

// FuzzDecodeEndpoint: on any input, the hand decoder either refuses and
// leaves its output alone, or agrees with encoding/json.
func FuzzDecodeEndpoint(f *testing.F) {
	f.Add([]byte(`{"id":3,"state":"ready","labels":["k8s:a=b"],"identity":{"id":256,"labels":["k8s:a=b"],"ref-count":2},` +
		`"addressing":{"ipv4":"10.0.0.1"},"policy-revision":1,"regenerations":2,"created":"2026-11-23T09:01:02.3456789Z",` +
		`"state-changed":"2026-11-23T09:01:02+01:00"}` + "\n"))
	f.Add([]byte(`{"id":-0,"identity":{"reserved":true}}`))
	f.Add([]byte(`{"id":1e2}`))
	f.Fuzz(func(t *testing.T, data []byte) { checkDecode(t, data, false) })
}

// BenchmarkDecodeEndpoint compares the hand decoder with json.Unmarshal
// on a typical endpoint answer.
func BenchmarkDecodeEndpoint(b *testing.B) {
	t0 := time.Date(2026, 11, 23, 9, 1, 2, 345678900, time.UTC)
	data, err := json.Marshal(&models.Endpoint{ID: 1234, State: "ready", ContainerID: "sim-123456", ContainerInterfaceName: "eth0",
		K8sNamespace: "ns-3", K8sPodName: "pod-123456", Labels: []string{"k8s:app=web", "k8s:tier=front"},
		Identity:   &models.Identity{ID: 300, Labels: []string{"k8s:app=web", "k8s:tier=front"}, RefCount: 12},
		Addressing: &models.AddressPair{IPv4: "10.1.2.3"}, PolicyRevision: 3, Regenerations: 2, Created: t0, StateChanged: t0})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var ep models.Endpoint
			if !decodeEndpoint(data, &ep) {
				b.Fatal("refused")
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var ep models.Endpoint
			if err := json.Unmarshal(data, &ep); err != nil {
				b.Fatal(err)
			}
		}
	})
}
