package dnsproxy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// testServer runs a miekg/dns server on loopback answering A queries of
// allowed.test and denied.test (TTL 7) and NXDOMAIN for anything else.
func testServer(tb testing.TB, network string) netip.AddrPort {
	tb.Helper()
	mux := dns.NewServeMux()
	mux.HandleFunc(".", func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		switch strings.ToLower(r.Question[0].Name) {
		case "allowed.test.":
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: "allowed.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 7}, A: net.IPv4(192, 0, 2, 10)})
		case "denied.test.":
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: "denied.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 7}, A: net.IPv4(192, 0, 2, 20)})
		default:
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})
	srv := &dns.Server{Net: network, Handler: mux}
	var addr net.Addr
	if network == "udp" {
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		srv.PacketConn, addr = pc, pc.LocalAddr()
	} else {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		srv.Listener, addr = ln, ln.Addr()
	}
	go func() { _ = srv.ActivateAndServe() }()
	tb.Cleanup(func() { _ = srv.Shutdown() })
	return netip.MustParseAddrPort(addr.String())
}

// recorder is a Learner recording the answers it was given.
type recorder struct {
	mu      sync.Mutex
	learned map[string][]netip.Addr
	err     error
}

func (r *recorder) LearnFQDN(_ context.Context, _ endpoint.ID, name string, ips []netip.Addr, _ time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	r.learned[name] = ips
	return nil
}

const podIP = "10.9.0.5"

// fixture returns an index with one endpoint at podIP whose policy
// redirects DNS to the world on port with rules names.
func fixture(tb testing.TB, port uint16, names ...fqdn.Selector) *index.Index {
	tb.Helper()
	ix, err := index.New()
	if err != nil {
		tb.Fatal(err)
	}
	keys := []policy.Key{{Identity: identity.ReservedWorld, Port: port, Proto: policy.ProtoUDP, Dir: policy.Egress},
		{Identity: identity.ReservedWorld, Port: port, Proto: policy.ProtoTCP, Dir: policy.Egress}}
	m := policy.NewMapState(1, false, true, keys)
	for _, k := range m.Allow {
		m.DNS = append(m.DNS, policy.DNSEntry{Key: k, Names: names})
	}
	ep := &endpoint.Endpoint{ID: 7, ContainerID: "c", IPv4: netip.MustParseAddr(podIP), Identity: 300, Policy: m, State: endpoint.StateReady}
	txn := ix.WriteTxn()
	defer txn.Abort()
	if err := index.Insert(txn, index.TableEndpoints, ep); err != nil {
		tb.Fatal(err)
	}
	txn.Commit()
	return ix
}

func newProxy(tb testing.TB, cfg Config, ix *index.Index, l Learner, hub *events.Hub) *Proxy {
	tb.Helper()
	p, err := New(cfg, ix, l, datapath.NetnsSockets{}, hub, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func question(name string) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	return m
}

func TestResolve(t *testing.T) {
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			proto := policy.ProtoUDP
			if network == "tcp" {
				proto = policy.ProtoTCP
			}
			server := testServer(t, network)
			src := netip.AddrPortFrom(netip.MustParseAddr(podIP), 40000)
			ix := fixture(t, server.Port(), fqdn.Selector{MatchName: "allowed.test"})
			rec := &recorder{learned: map[string][]netip.Addr{}}
			hub := events.New(64)
			sub := hub.Subscribe(0)
			defer sub.Close()
			p := newProxy(t, Config{}, ix, rec, hub)
			ctx := context.Background()

			resp := p.Resolve(ctx, question("Allowed.Test."), src, server, proto)
			if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
				t.Fatalf("allowed.test: %v", resp)
			}
			if got := rec.learned["allowed.test."]; len(got) != 1 || got[0] != netip.MustParseAddr("192.0.2.10") {
				t.Fatalf("learned %v", rec.learned)
			}
			if resp := p.Resolve(ctx, question("denied.test."), src, server, proto); resp.Rcode != dns.RcodeRefused {
				t.Fatalf("denied.test: rcode %s", dns.RcodeToString[resp.Rcode])
			}
			if _, ok := rec.learned["denied.test."]; ok {
				t.Fatal("a refused name was learned")
			}
			// NXDOMAIN instead of REFUSED, by configuration.
			p2 := newProxy(t, Config{RejectCode: RejectNameError}, ix, rec, nil)
			if resp := p2.Resolve(ctx, question("denied.test."), src, server, proto); resp.Rcode != dns.RcodeNameError {
				t.Fatalf("denied.test with nameError: %s", dns.RcodeToString[resp.Rcode])
			}
			// Not an endpoint: refused.
			if resp := p.Resolve(ctx, question("allowed.test."), netip.MustParseAddrPort("10.9.0.99:1"), server, proto); resp.Rcode != dns.RcodeRefused {
				t.Fatalf("unknown source: %s", dns.RcodeToString[resp.Rcode])
			}
			// An answer that cannot be realised is not released.
			rec.err = errors.New("boom")
			if resp := p.Resolve(ctx, question("allowed.test."), src, server, proto); resp.Rcode != dns.RcodeServerFailure || len(resp.Answer) != 0 {
				t.Fatalf("learn failure: %v", resp)
			}
			st := p.Stats()
			if st.Allowed != 1 || st.Denied != 1 || st.Errors != 2 {
				t.Fatalf("stats %+v", st)
			}
			ev, _ := sub.TryNext()
			if ev.Type != events.DNSQuery || ev.DNS == nil || ev.DNS.Verdict != VerdictAllowed || ev.Endpoint != 7 || ev.DNS.TTL != 7 {
				t.Fatalf("first event %+v %+v", ev, ev.DNS)
			}
			ev, _ = sub.TryNext()
			if ev.DNS.Verdict != VerdictDenied || ev.DNS.RCode != "REFUSED" || ev.DNS.Query != "denied.test." {
				t.Fatalf("second event %+v", ev.DNS)
			}
		})
	}
}

func TestResolvePatternAndHoldTimeout(t *testing.T) {
	server := testServer(t, "udp")
	src := netip.AddrPortFrom(netip.MustParseAddr(podIP), 40000)
	ix := fixture(t, server.Port(), fqdn.Selector{MatchPattern: "*.test"})
	p := newProxy(t, Config{HoldTimeout: 10 * time.Millisecond}, ix, blocker{}, nil)
	// The hold times out: the answer goes anyway (counted).
	resp := p.Resolve(context.Background(), question("denied.test."), src, server, policy.ProtoUDP)
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 || p.Stats().HoldTimeouts != 1 {
		t.Fatalf("hold timeout: %v %+v", resp, p.Stats())
	}
	if resp := p.Resolve(context.Background(), question("a.b.test."), src, server, policy.ProtoUDP); resp.Rcode != dns.RcodeRefused {
		t.Fatalf("'*' matched across labels: %s", dns.RcodeToString[resp.Rcode])
	}
}

// blocker is a Learner that never realises anything.
type blocker struct{}

func (blocker) LearnFQDN(ctx context.Context, _ endpoint.ID, _ string, _ []netip.Addr, _ time.Duration) error {
	<-ctx.Done()
	return ctx.Err()
}

func TestConfigValidate(t *testing.T) {
	c := Config{RejectCode: "servfail"}
	if err := c.Validate(); err == nil {
		t.Fatal("bad reject code accepted")
	}
	c = Config{}
	if err := c.Validate(); err != nil || c.Port != DefaultPort || c.RejectCode != RejectRefused {
		t.Fatalf("defaults: %+v %v", c, err)
	}
}
