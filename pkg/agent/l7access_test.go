package agent

import (
	"context"
	"io"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/datapath/l7proxy/xdsapi"
	"github.com/membrane-cni/membrane/pkg/agent/metrics"
	"github.com/membrane-cni/membrane/pkg/domain/events"
)

// TestOnL7Access: an access record becomes an l7-access event naming
// the request, the verdict and both identities, and counts by verdict
// and direction; beyond the per-second limit events are suppressed (and
// the next one says how many) while the counter counts every request.
func TestOnL7Access(t *testing.T) {
	hub, m := events.New(64), metrics.New()
	sub := hub.Subscribe(0)
	defer sub.Close()
	now := time.Unix(1700000000, 0)
	p := &l7Publisher{hub: hub, m: m, rateLimit: rateLimit{limit: 2, now: func() time.Time { return now }}}
	rec := datapath.L7AccessEvent{Time: now, Endpoint: 12, Direction: "ingress",
		Src: netip.MustParseAddrPort("10.0.0.2:40000"), Dst: netip.MustParseAddrPort("10.0.0.3:80"), SrcIdentity: 1001, DstIdentity: 1002,
		Method: "POST", Path: "/pkg.Service/Private", Host: "b", Reason: "ingress rules deny identity 1001",
		Version: "HTTP/2.0", GRPC: true, Code: 403, GRPCStatus: 7, HeaderMismatches: []string{"LOG X-Trace"}}
	p.access(rec)
	ev, ok := sub.TryNext()
	want := events.L7{Protocol: "http", Verdict: "denied", Reason: rec.Reason, Direction: "ingress", Src: "10.0.0.2:40000", Dst: "10.0.0.3:80",
		SrcIdentity: 1001, DstIdentity: 1002, Method: "POST", Path: "/pkg.Service/Private", Host: "b",
		HTTPVersion: "HTTP/2.0", GRPC: true, Code: 403, GRPCStatus: 7, HeaderMismatches: []string{"LOG X-Trace"}}
	if !ok || ev.Type != events.L7Access || ev.Endpoint != 12 || ev.L7 == nil || !reflect.DeepEqual(*ev.L7, want) {
		t.Fatalf("event %+v (l7 %+v), want %+v", ev, ev.L7, want)
	}
	rec.Allowed, rec.Reason, rec.Path, rec.Code, rec.GRPCStatus = true, "", "/public", 0, 0
	for range 3 {
		p.access(rec)
	}
	if _, ok := sub.TryNext(); !ok {
		t.Fatal("second event not published")
	}
	if ev, ok := sub.TryNext(); ok {
		t.Fatalf("third event in one second published: %+v", ev)
	}
	now = now.Add(time.Second)
	p.access(rec)
	if ev, ok := sub.TryNext(); !ok || !strings.Contains(ev.Message, "2 earlier") {
		t.Fatalf("event after the window: %+v %v, want the suppressed count", ev, ok)
	}
	w := httptest.NewRecorder()
	m.Handler().ServeHTTP(w, httptest.NewRequestWithContext(context.Background(), "GET", "/metrics", nil))
	body, _ := io.ReadAll(w.Body)
	for _, want := range []string{
		`membrane_l7_requests_total{direction="ingress",protocol="http",verdict="denied"} 1`,
		`membrane_l7_requests_total{direction="ingress",protocol="http",verdict="allowed"} 4`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestNoL7: L7 rules are refused on the Linux datapath without a proxy
// and accepted with --l7-proxy (and on the fake datapath) unless the
// configuration refuses them.
func TestNoL7(t *testing.T) {
	withProxy := Config{Datapath: "linux", Linux: datapath.LinuxConfig{L7: datapath.L7Config{ProxyPath: "/usr/bin/membrane-proxy"}}}
	for _, tc := range []struct {
		name   string
		cfg    Config
		refuse bool
		want   bool
	}{
		{"linux without proxy", Config{Datapath: "linux"}, false, true},
		{"linux with --l7-proxy", withProxy, false, false},
		{"fake", Config{Datapath: "fake"}, false, false},
		{"refused by configuration", withProxy, true, true},
	} {
		if got := noL7(tc.cfg, tc.refuse); got != tc.want {
			t.Errorf("%s: noL7 = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestOnL7AccessKafka: a Kafka access record becomes an l7-access event
// of protocol kafka with the request's Kafka fields.
func TestOnL7AccessKafka(t *testing.T) {
	rec := datapath.L7AccessEvent{Endpoint: 3, Direction: "ingress", Src: netip.MustParseAddrPort("10.0.0.2:40000"),
		Dst: netip.MustParseAddrPort("10.0.0.3:9092"), Reason: "ingress kafka rules deny identity 1001",
		Kafka: &xdsapi.KafkaAccess{APIKey: "produce", APIVersion: 9, CorrelationID: 17, ClientID: "c", Topics: []string{"t"}, ErrorCode: 29}}
	ev := l7Event(rec)
	want := &events.KafkaL7{APIKey: "produce", APIVersion: 9, CorrelationID: 17, ClientID: "c", Topics: []string{"t"}, ErrorCode: 29}
	if ev.L7.Protocol != "kafka" || ev.L7.Verdict != "denied" || !reflect.DeepEqual(ev.L7.Kafka, want) {
		t.Errorf("event l7 %+v (kafka %+v), want protocol kafka with %+v", ev.L7, ev.L7.Kafka, want)
	}
}
