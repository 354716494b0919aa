package flows

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// clock is a manual clock for the rate limit.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

func newStore(t *testing.T, cfg Config) (*Store, *clock) {
	t.Helper()
	c := &clock{now: time.Unix(1e9, 0)}
	cfg.Now = c.Now
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func flowEv(sport, dport uint16, verdict string) datapath.FlowEvent {
	return datapath.FlowEvent{Endpoint: 3, Identity: 1001, Verdict: verdict, Dir: policy.Egress,
		Src: netip.MustParseAddr("10.0.0.3"), Dst: netip.MustParseAddr("10.0.0.4"), SrcPort: sport, DstPort: dport,
		Proto: policy.ProtoTCP, TCPFlags: 0x02, PeerIdentity: 1002, Time: time.Unix(1e9, 0)}
}

// TestStoreRing: the ring keeps the last Capacity flows, oldest first;
// Last keeps the newest matches.
func TestStoreRing(t *testing.T) {
	s, _ := newStore(t, Config{Capacity: 4})
	for i := range 10 {
		s.OnFlow(flowEv(uint16(1000+i), 80, datapath.FlowForwarded))
	}
	got, st := s.Query(Filter{})
	if len(got) != 4 || got[0].Source.Port != 1006 || got[3].Source.Port != 1009 {
		t.Fatalf("ring holds %+v, want the flows from ports 1006..1009", got)
	}
	if st.Seen != 10 || st.Buffered != 4 || st.Capacity != 4 {
		t.Errorf("stats %+v, want seen 10, buffered 4 of 4", st)
	}
	if f := got[0]; f.Verdict != "forwarded" || f.Protocol != "TCP" || strings.Join(f.TCPFlags, ",") != "SYN" ||
		f.Source.Identity != 1001 || f.Destination.Identity != 1002 || f.Destination.IP != "10.0.0.4" || f.Direction != "egress" {
		t.Errorf("flow %+v", f)
	}
	if got, _ := s.Query(Filter{Last: 2}); len(got) != 2 || got[1].Source.Port != 1009 {
		t.Errorf("Last 2: %+v", got)
	}
}

// TestStoreRateLimit: more than Rate flows in a second are counted, not
// kept; the next second admits again.
func TestStoreRateLimit(t *testing.T) {
	s, c := newStore(t, Config{Capacity: 100, Rate: 3})
	for i := range 5 {
		s.OnFlow(flowEv(uint16(1000+i), 80, datapath.FlowForwarded))
	}
	s.OnDrop(datapath.DropEvent{Endpoint: 3, Reason: datapath.DropPolicy})
	_, st := s.Query(Filter{})
	if st.Seen != 3 || st.RateLimited != 3 {
		t.Fatalf("stats %+v, want 3 seen and 3 rate-limited", st)
	}
	c.now = c.now.Add(time.Second)
	s.OnDrop(datapath.DropEvent{Endpoint: 3, Reason: datapath.DropPolicy, Dir: policy.Ingress, Proto: policy.ProtoTCP, TCPFlags: 0x02})
	got, st := s.Query(Filter{Verdict: []string{"dropped"}})
	if st.Seen != 4 || len(got) != 1 || got[0].DropReason != datapath.DropPolicy {
		t.Fatalf("after a second: %+v %+v, want the drop kept", got, st)
	}
	if f := got[0].TCPFlags; len(f) != 1 || f[0] != "SYN" {
		t.Fatalf("the dropped SYN's flow has TCP flags %v, want [SYN]", f)
	}
}

// TestStoreFollowers: a follower gets the matching flows after the
// stored ones; one that falls FollowerBuffer behind is dropped and
// counted, never waited for; MaxFollowers bounds them.
func TestStoreFollowers(t *testing.T) {
	s, _ := newStore(t, Config{Capacity: 100, MaxFollowers: 2, FollowerBuffer: 2})
	s.OnFlow(flowEv(1000, 80, datapath.FlowForwarded))
	fast, stored, err := s.Follow(Filter{Port: []uint16{80}})
	if err != nil || len(stored) != 1 {
		t.Fatalf("Follow: %v, %d stored", err, len(stored))
	}
	slow, _, err := s.Follow(Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Follow(Filter{}); !errors.Is(err, ErrTooManyFollowers) {
		t.Fatalf("third Follow: %v, want ErrTooManyFollowers", err)
	}
	for i := range 3 {
		s.OnFlow(flowEv(uint16(2000+i), 443, datapath.FlowForwarded)) // not port 80: not for fast
	}
	select {
	case <-slow.Dropped():
	default:
		t.Fatal("the slow follower (3 flows, buffer 2) was not dropped")
	}
	s.OnFlow(flowEv(1001, 80, datapath.FlowForwarded))
	if fl := <-fast.C(); fl.Source.Port != 1001 || len(fast.C()) != 0 {
		t.Fatalf("fast follower got %+v (and %d more), want only the port-80 flow", fl, len(fast.C()))
	}
	st := s.Stats()
	if st.FollowerDrops != 1 || st.FollowerLost != 1 || st.Followers != 1 {
		t.Errorf("stats %+v, want 1 follower dropped, 1 flow lost, 1 open", st)
	}
	fast.Close()
	fast.Close()
	if st := s.Stats(); st.Followers != 0 {
		t.Errorf("%d followers after Close", st.Followers)
	}
}

// TestStoreL7: an l7-access event is attached to the redirected flow of
// its connection and recorded as an l7 flow; a dns-query event to the
// endpoint's redirected flow to the server.
func TestStoreL7(t *testing.T) {
	s, _ := newStore(t, Config{Capacity: 100})
	s.OnFlow(flowEv(1000, 80, datapath.FlowForwarded))
	s.OnFlow(flowEv(1001, 80, datapath.FlowRedirected))
	dns := flowEv(1002, 53, datapath.FlowRedirected)
	dns.Proto = policy.ProtoUDP
	s.OnFlow(dns)
	s.onL7(events.Event{Type: events.L7Access, Endpoint: 3, L7: &events.L7{Protocol: "http", Verdict: "allowed",
		Src: "10.0.0.3:1001", Dst: "10.0.0.4:80", Method: "GET", Path: "/x", SrcIdentity: 1001, DstIdentity: 1002}})
	s.onDNS(events.Event{Type: events.DNSQuery, Endpoint: 3, DNS: &events.DNS{Query: "example.com.", QType: "A",
		Verdict: "allowed", Server: "10.0.0.4:53"}})
	got, _ := s.Query(Filter{})
	if len(got) != 5 {
		t.Fatalf("%d flows, want 5: %+v", len(got), got)
	}
	if got[0].L7 != nil {
		t.Errorf("the forwarded flow got an L7 record")
	}
	if l := got[1].L7; l == nil || l.Method != "GET" || l.Path != "/x" {
		t.Errorf("redirected flow's L7 %+v, want GET /x", l)
	}
	if d := got[2].DNS; d == nil || d.Query != "example.com." {
		t.Errorf("DNS flow's record %+v", d)
	}
	if got[3].Type != TypeL7 || got[3].Source.Port != 1001 || got[4].Type != TypeDNS {
		t.Errorf("l7/dns flows %+v %+v", got[3], got[4])
	}
	if got, _ := s.Query(Filter{Verdict: []string{"allowed"}}); len(got) != 2 {
		t.Errorf("verdict allowed: %d flows, want the l7 and dns ones", len(got))
	}
}

// TestParseFilter: every field is validated, naming the parameter.
func TestParseFilter(t *testing.T) {
	now := time.Unix(1e9, 0)
	f, err := ParseFilter(url.Values{"from-pod": {"a", "kube-system/coredns"}, "to-label": {"k8s:app=b,app"}, "verdict": {"DROPPED"},
		"protocol": {"TCP"}, "port": {"80,443"}, "since": {"5m"}, "last": {"10"}, "follow": {"true"}, "namespace": {"default"}}, now)
	if err != nil {
		t.Fatal(err)
	}
	if f.FromPod[0] != "default/a" || f.FromPod[1] != "kube-system/coredns" || len(f.ToLabel) != 2 || f.Protocol[0] != "tcp" ||
		len(f.Port) != 2 || !f.Since.Equal(now.Add(-5*time.Minute)) || f.Last != 10 || !f.Follow {
		t.Errorf("filter %+v", f)
	}
	for _, q := range []string{"bogus=1", "verdict=maybe", "protocol=gre", "port=0", "port=70000", "port=x", "last=0", "last=-1",
		"since=yesterday", "since=-5m", "follow=perhaps", "namespace=Bad_NS", "from-pod=a/b/c", "from-pod=", "to-label=a%20b", "last=1&last=2"} {
		v, _ := url.ParseQuery(q)
		if _, err := ParseFilter(v, now); !errors.Is(err, ErrBadFilter) {
			t.Errorf("%s: %v, want ErrBadFilter", q, err)
		} else if key, _, _ := strings.Cut(q, "="); !strings.Contains(err.Error(), key) {
			t.Errorf("%s: %v does not name %q", q, err, key)
		}
	}
}

// TestFilterMatch: pods by namespace and name prefix, labels, either
// side's namespace and port, verdict translated.
func TestFilterMatch(t *testing.T) {
	fl := &models.Flow{Time: time.Unix(1e9, 0), Verdict: "forwarded", Protocol: "TCP", Service: "10.96.0.1:80",
		Source:      models.FlowPeer{Namespace: "default", Pod: "client-7f", Port: 40000, Labels: []string{"k8s:app=client"}},
		Destination: models.FlowPeer{Namespace: "web", Pod: "server-1", Port: 80, Labels: []string{"k8s:app=server"}}}
	for _, c := range []struct {
		f    Filter
		want bool
	}{
		{Filter{FromPod: []string{"default/client"}}, true},
		{Filter{FromPod: []string{"web/client"}}, false},
		{Filter{ToPod: []string{"web/server-1"}}, true},
		{Filter{FromLabel: []string{"app=client"}}, true},
		{Filter{FromLabel: []string{"k8s:app=client"}}, true},
		{Filter{FromLabel: []string{"app"}}, true},
		{Filter{ToLabel: []string{"app=client"}}, false},
		{Filter{Namespace: []string{"web"}}, true},
		{Filter{Namespace: []string{"other"}}, false},
		{Filter{Verdict: []string{"translated"}}, true},
		{Filter{Verdict: []string{"dropped"}}, false},
		{Filter{Protocol: []string{"tcp"}}, true},
		{Filter{Protocol: []string{"udp"}}, false},
		{Filter{Port: []uint16{80}}, true},
		{Filter{Port: []uint16{81}}, false},
		{Filter{Since: time.Unix(1e9+1, 0)}, false},
	} {
		if got := c.f.Match(fl); got != c.want {
			t.Errorf("%+v.Match = %v, want %v", c.f, got, c.want)
		}
	}
}

// TestStoreRingGrows: the default store starts with a small ring (not
// DefaultCapacity flows of live heap), keeps DefaultCapacity flows once
// they come, in order across the growth, and a redirected flow recorded
// before a growth still gets its L7 record after it.
func TestStoreRingGrows(t *testing.T) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	s, _ := newStore(t, Config{})
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 64<<10 {
		t.Errorf("New allocated %d bytes, want the ring to start small", got)
	}
	for i := range 60 {
		s.OnFlow(flowEv(uint16(1000+i), 80, datapath.FlowForwarded))
	}
	s.OnFlow(flowEv(999, 80, datapath.FlowRedirected)) // seq 60
	for i := 60; i < 200; i++ {                        // grows past 64 and 128
		s.OnFlow(flowEv(uint16(1000+i), 80, datapath.FlowForwarded))
	}
	s.onL7(events.Event{Type: events.L7Access, Endpoint: 3, L7: &events.L7{Protocol: "http", Verdict: "allowed",
		Src: "10.0.0.3:999", Dst: "10.0.0.4:80", Method: "GET", Path: "/grown", SrcIdentity: 1001, DstIdentity: 1002}})
	got, _ := s.Query(Filter{})
	if len(got) != 202 || got[60].Source.Port != 999 || got[60].L7 == nil || got[60].L7.Path != "/grown" {
		t.Fatalf("%d flows; the redirected one %+v, want its L7 record /grown", len(got), got[60])
	}
	for i := range DefaultCapacity {
		s.OnFlow(flowEv(uint16(20000+i), 80, datapath.FlowForwarded))
	}
	got, st := s.Query(Filter{})
	if len(got) != DefaultCapacity || got[0].Source.Port != 20000 || got[DefaultCapacity-1].Source.Port != uint16(20000+DefaultCapacity-1) {
		t.Fatalf("%d flows from port %d, want the last %d from 20000", len(got), got[0].Source.Port, DefaultCapacity)
	}
	if st.Capacity != DefaultCapacity || st.Buffered != DefaultCapacity || len(s.ring) != DefaultCapacity {
		t.Errorf("stats %+v, ring %d: want capacity and buffered %d", st, len(s.ring), DefaultCapacity)
	}
	if len(s.proxied) != 0 {
		t.Errorf("proxied %v: the redirected flow was overwritten", s.proxied)
	}
}

// TestStoreL7BeforeFlow: an L7 or DNS record that comes before its
// redirected flow (the proxy's record and the programs' report travel
// apart) is attached when the flow comes; an old one is not kept
// beyond the table's bound.
func TestStoreL7BeforeFlow(t *testing.T) {
	s, clk := newStore(t, Config{Capacity: 100})
	s.onL7(events.Event{Type: events.L7Access, Endpoint: 3, L7: &events.L7{Protocol: "http", Verdict: "allowed",
		Src: "10.0.0.3:1001", Dst: "10.0.0.4:80", Method: "GET", Path: "/early", SrcIdentity: 1001, DstIdentity: 1002}})
	s.onDNS(events.Event{Type: events.DNSQuery, Endpoint: 3, DNS: &events.DNS{Query: "early.test.", QType: "A",
		Verdict: "allowed", Server: "10.0.0.4:53"}})
	s.OnFlow(flowEv(1001, 80, datapath.FlowRedirected))
	dns := flowEv(1002, 53, datapath.FlowRedirected)
	dns.Proto = policy.ProtoUDP
	s.OnFlow(dns)
	got, _ := s.Query(Filter{Verdict: []string{"redirected"}})
	if len(got) != 2 {
		t.Fatalf("%d redirected flows, want 2: %+v", len(got), got)
	}
	if l := got[0].L7; l == nil || l.Path != "/early" {
		t.Errorf("redirected flow's L7 %+v, want the earlier GET /early", l)
	}
	if d := got[1].DNS; d == nil || d.Query != "early.test." {
		t.Errorf("redirected DNS flow's record %+v, want the earlier query", d)
	}
	// Matched records are gone; the table is bounded, old ones forgotten.
	if n := len(s.early); n != 0 {
		t.Errorf("%d early records left after both matched", n)
	}
	for i := range maxEarly + 10 {
		s.onL7(events.Event{Type: events.L7Access, Endpoint: 3, L7: &events.L7{Protocol: "http", Verdict: "allowed",
			Src: fmt.Sprintf("10.0.1.%d:%d", i%250, 1000+i), Dst: "10.0.0.4:80", Method: "GET", Path: "/x"}})
		if len(s.early) > maxEarly {
			t.Fatalf("%d early records, want at most %d", len(s.early), maxEarly)
		}
	}
	clk.now = clk.now.Add(2 * earlyTTL)
	s.onL7(events.Event{Type: events.L7Access, Endpoint: 3, L7: &events.L7{Protocol: "http", Verdict: "allowed",
		Src: "10.0.2.1:999", Dst: "10.0.0.4:80", Method: "GET", Path: "/late"}})
	if _, ok := s.early[tuple{src: "10.0.2.1:999", dst: "10.0.0.4:80"}]; !ok || len(s.early) != 1 {
		t.Errorf("after earlyTTL a full table kept %d records and not the new one", len(s.early))
	}
}
