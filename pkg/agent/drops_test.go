package agent

import (
	"context"
	"io"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent/metrics"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// TestOnDrop: a drop notification becomes a datapath-drop event with
// every field and counts in the Prometheus counter by reason and
// direction.
func TestOnDrop(t *testing.T) {
	tests := []struct {
		name string
		in   datapath.DropEvent
		want events.Drop
	}{
		{"tcp-v4", datapath.DropEvent{Endpoint: 9, Reason: datapath.DropPolicy, Dir: policy.Ingress,
			Src: netip.MustParseAddr("10.0.0.2"), Dst: netip.MustParseAddr("10.0.0.3"), SrcPort: 40000, DstPort: 8081,
			Proto: 6, PeerIdentity: 300, Length: 74},
			events.Drop{Reason: "policy-denied", Direction: "ingress", Src: "10.0.0.2", Dst: "10.0.0.3", SrcPort: 40000, DstPort: 8081,
				Proto: 6, PeerIdentity: 300, Bytes: 74}},
		{"non-ip", datapath.DropEvent{Endpoint: 9, Reason: datapath.DropUnknownL3, Dir: policy.Egress, Length: 60},
			events.Drop{Reason: "unknown-l3", Direction: "egress", Bytes: 60}},
	}
	hub, m := events.New(16), metrics.New()
	sub := hub.Subscribe(0)
	defer sub.Close()
	fn := onDrop(hub, m)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Time = time.Unix(1700000000, 0)
			fn(tc.in)
			ev, ok := sub.TryNext()
			if !ok {
				t.Fatal("no event published")
			}
			if ev.Type != events.DatapathDrop || ev.Endpoint != 9 || !ev.Time.Equal(tc.in.Time) || ev.Drop == nil || *ev.Drop != tc.want {
				t.Fatalf("event = %+v drop %+v, want %+v", ev, ev.Drop, tc.want)
			}
		})
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequestWithContext(context.Background(), "GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		`membrane_datapath_drop_notifications_total{direction="ingress",reason="policy-denied"} 1`,
		`membrane_datapath_drop_notifications_total{direction="egress",reason="unknown-l3"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestDropEventsRateLimited: beyond the limit per second, notifications
// are counted but not published; the next published event says how many
// were left out.
func TestDropEventsRateLimited(t *testing.T) {
	hub, m := events.New(64), metrics.New()
	sub := hub.Subscribe(0)
	defer sub.Close()
	now := time.Unix(1700000000, 0)
	p := &dropPublisher{hub: hub, m: m, rateLimit: rateLimit{limit: 3, now: func() time.Time { return now }}}
	d := datapath.DropEvent{Endpoint: 4, Reason: datapath.DropPolicy, Dir: policy.Ingress}
	for i := 0; i < 10; i++ {
		p.drop(d)
	}
	now = now.Add(time.Second)
	p.drop(d)
	var got []events.Event
	for {
		ev, ok := sub.TryNext()
		if !ok {
			break
		}
		got = append(got, ev)
	}
	if len(got) != 4 || got[0].Message != "" || got[3].Message != "7 earlier drop notifications not published (more than 3 per second)" {
		t.Fatalf("published %d events (%+v), want 3 then one saying 7 were left out", len(got), got)
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequestWithContext(context.Background(), "GET", "/metrics", nil))
	if want := `membrane_datapath_drop_notifications_total{direction="ingress",reason="policy-denied"} 11`; !strings.Contains(rec.Body.String(), want) {
		t.Errorf("metrics lack %q", want)
	}
}
