package api

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/domain/service"
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

// requireAllSet fails if a field of the struct v points to is zero: a
// field added to the record must be set in the test's full value, so
// that the comparison with encoding/json covers it.
func requireAllSet(tb testing.TB, v reflect.Value, name string) {
	tb.Helper()
	v = v.Elem()
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			tb.Fatalf("%s.%s is zero in the test's full value: set it (and encode it by hand if the model shows it)",
				name, v.Type().Field(i).Name)
		}
	}
}

// viewModel is identityModel's answer for the identity v shows.
func viewModel(v *identityView) *models.Identity {
	if v == nil {
		return nil
	}
	return &models.Identity{ID: v.id, Labels: v.labels.Strings(), RefCount: v.refCount, Reserved: v.reserved}
}

// checkRecord compares the hand encoder with json.Encoder of the model.
func checkRecord(tb testing.TB, e *endpoint.Endpoint, v *identityView) {
	tb.Helper()
	got, ok := appendEndpointRecord(nil, e, v)
	want := encoderJSON(tb, endpointModel(e, viewModel(v)))
	if !ok || string(got)+"\n" != want {
		tb.Fatalf("hand encoder (ok %v)\n%s\njson.Encoder\n%s", ok, got, want)
	}
}

func fullRecord() (*endpoint.Endpoint, *identityView) {
	t0 := time.Date(2026, 11, 23, 9, 1, 2, 345678900, time.UTC)
	e := &endpoint.Endpoint{ID: 65535, ContainerID: "c-1", ContainerName: "name", ContainerInterfaceName: "eth0",
		Namespace: "ns", PodName: "pod", PodUID: "uid-1",
		Labels: labels.Labels{{Source: "k8s", Key: "app", Value: "web"}, {Source: "k8s", Key: "tier"}},
		IPv4:   netip.MustParseAddr("10.0.0.1"), IPv6: netip.MustParseAddr("fd00::1"), IfName: "lxc1234", IfIndex: 42,
		MAC: "00:11:22:33:44:55", HostMAC: "aa:bb:cc:dd:ee:ff", Netns: "/var/run/netns/x", Chained: true, State: endpoint.StateReady,
		NamedPorts: policy.NamedPorts{{Name: "http", Proto: policy.ProtoTCP, Port: 8080}}, HostPorts: []service.HostPort{{Port: 80, ContainerPort: 8080, Proto: service.TCP}}, PolicyAudit: true,
		Identity: 256, DesiredRevision: 9, RealizedRevision: 1 << 63, Regenerations: 7, Policy: &policy.MapState{},
		LastError: "realize: <&> \"quoted\" \\ \n\t\r\b\f\x01\x7f ü \u2028\u2029 \xff\xfe end",
		Deleting:  endpoint.DeleteOptions{NoIPRelease: true}, Created: t0,
		StateChanged: t0.In(time.FixedZone("odd", -(5*3600 + 30*60 + 15)))}
	return e, &identityView{id: 256, labels: labels.Labels{{Source: "k8s", Key: "a<b", Value: "\xff"}}, refCount: 3, reserved: true}
}

// TestEndpointJSON checks the hand encoder against json.Encoder of the
// record's model, and that it hands the times encoding/json refuses back
// to it.
func TestEndpointJSON(t *testing.T) {
	full, fullIdent := fullRecord()
	requireAllSet(t, reflect.ValueOf(full), "Endpoint")
	requireAllSet(t, reflect.ValueOf(fullIdent), "identityView")
	only6 := *full
	only6.IPv4 = netip.Addr{}
	mapped := *full
	mapped.IPv6 = netip.MustParseAddr("::ffff:10.1.2.3")
	tests := []struct {
		name  string
		e     *endpoint.Endpoint
		ident *identityView
	}{
		{"zero", &endpoint.Endpoint{}, nil},
		{"full", full, fullIdent},
		{"no identity", full, nil},
		{"identity not found", full, &identityView{id: 77}},
		{"only ipv6", &only6, fullIdent},
		{"4in6", &mapped, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkRecord(t, tt.e, tt.ident) })
	}
	for _, bad := range []time.Time{
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("far", 24*3600)),
		time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("far", -24*3600-60)),
	} {
		e, _ := fullRecord()
		e.StateChanged = bad
		if _, ok := appendEndpointRecord(nil, e, nil); ok {
			t.Errorf("time %v: hand encoder took a time encoding/json refuses", bad)
		}
		if _, err := json.Marshal(endpointModel(e, nil)); err == nil {
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
	lbls := func() labels.Labels {
		var ls labels.Labels
		for range rng.IntN(3) {
			ls = append(ls, labels.Label{Source: str(), Key: str(), Value: str()})
		}
		return ls
	}
	tm := func() time.Time {
		return time.Unix(rng.Int64N(1<<35)-1<<34, rng.Int64N(1e9)).In(time.FixedZone("z", rng.IntN(2*86399)-86399))
	}
	for range 2000 {
		e := &endpoint.Endpoint{ID: endpoint.ID(rng.IntN(1 << 16)), State: endpoint.State(str()), ContainerID: str(),
			Namespace: str(), PodName: str(), LastError: str(), Netns: str(), Chained: rng.IntN(2) == 0, IfIndex: rng.IntN(3) - 1,
			Labels: lbls(), Identity: identity.NumericIdentity(rng.IntN(3)), RealizedRevision: rng.Uint64(),
			Created: tm(), StateChanged: tm()}
		if rng.IntN(2) == 0 {
			e.IPv4 = netip.AddrFrom4([4]byte{10, byte(rng.IntN(256)), 0, 1})
		}
		if rng.IntN(2) == 0 {
			e.IPv6 = netip.AddrFrom16([16]byte{0xfd, 15: byte(rng.IntN(256))})
		}
		var v *identityView
		if rng.IntN(2) == 0 {
			v = &identityView{id: rng.Int64N(1 << 20), labels: lbls(), refCount: rng.IntN(3), reserved: rng.IntN(2) == 0}
		}
		checkRecord(t, e, v)
	}
}

// FuzzEndpointJSON compares both encoders on arbitrary strings and times.
func FuzzEndpointJSON(f *testing.F) {
	f.Add("ready", "k8s", "app<", "\xff\u2028\x01", int64(1700000000), int64(123), 3600)
	f.Add("", "", "", "", int64(0), int64(0), 0)
	f.Fuzz(func(t *testing.T, state, source, key, value string, sec, nsec int64, off int) {
		when := time.Unix(sec, nsec).In(time.FixedZone("f", off%(30*3600)))
		ls := labels.Labels{{Source: source, Key: key, Value: value}}
		e := &endpoint.Endpoint{State: endpoint.State(state), Labels: ls, LastError: value, ContainerID: key,
			Identity: 5, Created: when, StateChanged: when}
		v := &identityView{id: sec, labels: ls}
		got, ok := appendEndpointRecord(nil, e, v)
		var buf bytes.Buffer
		err := json.NewEncoder(&buf).Encode(endpointModel(e, viewModel(v)))
		switch {
		case err != nil && ok:
			t.Fatalf("hand encoder took what encoding/json refuses (%v)", err)
		case err == nil && !ok:
			t.Fatalf("hand encoder refused what encoding/json encodes: %s", buf.Bytes())
		case ok && string(got)+"\n" != buf.String():
			t.Fatalf("hand encoder\n%q\njson.Encoder\n%q", got, buf.Bytes())
		}
		if ok && !utf8.Valid(got) {
			t.Fatalf("hand encoder wrote invalid UTF-8: %q", got)
		}
	})
}

// BenchmarkEndpointJSON compares the hand encoder with json.Encoder of
// the model (the record converted first, as the handlers did) on a
// typical endpoint answer.
func BenchmarkEndpointJSON(b *testing.B) {
	t0 := time.Date(2026, 11, 23, 9, 1, 2, 345678900, time.UTC)
	ls := labels.Labels{{Source: "k8s", Key: "app", Value: "web"}, {Source: "k8s", Key: "tier", Value: "front"}}
	e := &endpoint.Endpoint{ID: 1234, State: endpoint.StateReady, ContainerID: "sim-123456", ContainerInterfaceName: "eth0",
		Namespace: "ns-3", PodName: "pod-123456", Labels: ls, Identity: 300, IPv4: netip.MustParseAddr("10.1.2.3"),
		RealizedRevision: 3, Regenerations: 2, Created: t0, StateChanged: t0}
	v := &identityView{id: 300, labels: ls, refCount: 12}
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf, _ = appendEndpointRecord(buf[:0], e, v)
		}
	})
	b.Run("model+encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		for b.Loop() {
			buf.Reset()
			if err := enc.Encode(endpointModel(e, viewModel(v))); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestIdentityView checks that identityView reads what identityModel
// builds: a reserved identity, an index row (with and without labels),
// an identity missing from the index.
func TestIdentityView(t *testing.T) {
	ix, err := index.New()
	if err != nil {
		t.Fatal(err)
	}
	web, err := labels.ParseSet([]string{"k8s:app=web", "k8s:tier"})
	if err != nil {
		t.Fatal(err)
	}
	txn := ix.WriteTxn()
	for _, row := range []*index.Identity{
		{ID: 300, Labels: web, Key: web.Key(), RefCount: 2},
		{ID: 301, Key: "empty"},
	} {
		if err := index.Insert(txn, index.TableIdentities, row); err != nil {
			t.Fatal(err)
		}
	}
	txn.Commit()
	s := &Server{ix: ix}
	for _, id := range []identity.NumericIdentity{identity.ReservedHost, identity.ReservedHealth, 300, 301, 999} {
		v := s.identityView(id)
		if got, want := viewModel(&v), s.identityModel(id); !reflect.DeepEqual(got, want) {
			t.Errorf("identity %d: view shows %+v, identityModel %+v", id, got, want)
		}
	}
}

// TestWriteEndpoints checks a list answer, written in pieces, against
// json.Encoder of the list of models, for lists from empty to several
// pieces long.
func TestWriteEndpoints(t *testing.T) {
	ix, err := index.New()
	if err != nil {
		t.Fatal(err)
	}
	web, err := labels.ParseSet([]string{"k8s:app=web"})
	if err != nil {
		t.Fatal(err)
	}
	txn := ix.WriteTxn()
	if err := index.Insert(txn, index.TableIdentities, &index.Identity{ID: 300, Labels: web, Key: web.Key(), RefCount: 7}); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
	s := &Server{ix: ix}
	base, _ := fullRecord()
	for _, n := range []int{0, 1, 3, 200} {
		eps := make([]*endpoint.Endpoint, n)
		for i := range eps {
			e := *base
			e.ID, e.Identity = endpoint.ID(i+1), identity.NumericIdentity([]int{0, 300, 999, 1}[i%4])
			eps[i] = &e
		}
		rec := httptest.NewRecorder()
		s.writeEndpoints(rec, eps)
		want := make([]*models.Endpoint, 0, n)
		for _, e := range eps {
			want = append(want, s.model(e))
		}
		if got, w := rec.Body.String(), encoderJSON(t, want); got != w {
			t.Fatalf("%d endpoints: hand list (%d bytes) differs from json.Encoder's (%d bytes)", n, len(got), len(w))
		}
		if n == 200 && rec.Body.Len() < 2*streamChunk {
			t.Fatalf("the long list is %d bytes: it does not test writing in pieces", rec.Body.Len())
		}
	}
}
