package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
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

// Verdicts of a query (events and metrics).
const (
	VerdictAllowed = "allowed"
	VerdictDenied  = "denied"
	VerdictError   = "error"
)

// Reject response codes (Config.RejectCode), as Cilium's
// --tofqdns-dns-reject-response-code names them.
const (
	RejectRefused   = "refused"
	RejectNameError = "nameError"
)

// Config tunes the proxy. Zero values take the defaults.
type Config struct {
	// Port is the transparent sockets' port in the host netns.
	Port uint16
	// RejectCode answers a denied query: RejectRefused (default) or
	// RejectNameError (NXDOMAIN).
	RejectCode string
	// MaxConcurrent bounds the queries in flight (default 256); a UDP
	// query beyond it is dropped (the client retries), a TCP connection
	// closed.
	MaxConcurrent int
	// UpstreamTimeout bounds the exchange with the server (default 5 s).
	UpstreamTimeout time.Duration
	// HoldTimeout bounds the wait for the learned addresses to be
	// realised (default 1 s); after it the answer is released anyway,
	// as Cilium's --tofqdns-proxy-response-max-delay does, and counted.
	HoldTimeout time.Duration
}

// Defaults of Config.
const (
	DefaultPort          = 10053
	DefaultMaxConcurrent = 256
)

// Validate checks c and fills its defaults.
func (c *Config) Validate() error {
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	switch c.RejectCode {
	case "":
		c.RejectCode = RejectRefused
	case RejectRefused, RejectNameError:
	default:
		return fmt.Errorf("dns proxy: reject code %q: want %s or %s", c.RejectCode, RejectRefused, RejectNameError)
	}
	if c.MaxConcurrent < 0 || c.UpstreamTimeout < 0 || c.HoldTimeout < 0 {
		return errors.New("dns proxy: negative limit")
	}
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = DefaultMaxConcurrent
	}
	if c.UpstreamTimeout == 0 {
		c.UpstreamTimeout = 5 * time.Second
	}
	if c.HoldTimeout == 0 {
		c.HoldTimeout = time.Second
	}
	return nil
}

// Learner realises learned addresses (actors.System.LearnFQDN).
type Learner interface {
	LearnFQDN(ctx context.Context, id endpoint.ID, name string, ips []netip.Addr, ttl time.Duration) error
}

// Stats are the proxy's counters.
type Stats struct {
	Allowed, Denied, Errors, Dropped, HoldTimeouts uint64
}

// Proxy is the DNS proxy.
type Proxy struct {
	cfg     Config
	ix      *index.Index
	learner Learner
	sockets datapath.TransparentSockets
	events  *events.Hub
	log     *slog.Logger
	sem     chan struct{}
	socks   *datapath.ProxySockets
	// upstream holds UDP sockets to the servers made ahead of use
	// (filled while Serve runs).
	upstream *upstreams

	allowed, denied, errs, dropped, holdTimeouts atomic.Uint64
	obs                                          Observer

	// mu guards compiled (rules.dns selectors, compiled) and replies
	// (reply sockets by server address).
	mu       sync.Mutex
	compiled map[fqdn.Selector]*fqdn.Compiled
	replies  map[netip.AddrPort]*replySocket
}

// New returns a proxy; Serve runs it.
func New(cfg Config, ix *index.Index, learner Learner, sockets datapath.TransparentSockets, hub *events.Hub, log *slog.Logger) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Proxy{cfg: cfg, ix: ix, learner: learner, sockets: sockets, events: hub, log: log,
		sem: make(chan struct{}, cfg.MaxConcurrent), compiled: map[fqdn.Selector]*fqdn.Compiled{},
		replies: map[netip.AddrPort]*replySocket{}, upstream: newUpstreams(sockets.DialHost)}, nil
}

// Observer gets each query's verdict (the Verdict constants, "dropped"
// and "hold-timeout") and each allowed answer's hold time (/metrics).
type Observer interface {
	DNSQuery(verdict string)
	DNSHold(d time.Duration)
}

// SetObserver sets the observer (before Serve).
func (p *Proxy) SetObserver(o Observer) { p.obs = o }

func (p *Proxy) count(c *atomic.Uint64, verdict string) {
	c.Add(1)
	if p.obs != nil {
		p.obs.DNSQuery(verdict)
	}
}

// Stats returns the counters.
func (p *Proxy) Stats() Stats {
	return Stats{Allowed: p.allowed.Load(), Denied: p.denied.Load(), Errors: p.errs.Load(),
		Dropped: p.dropped.Load(), HoldTimeouts: p.holdTimeouts.Load()}
}

// query is one query being handled.
type query struct {
	req   *dns.Msg
	src   netip.AddrPort
	dst   netip.AddrPort // the server the pod asked
	proto uint8
}

// Resolve answers q: refused when the endpoint may not resolve the name,
// else the server's answer once its addresses are realised. It never
// returns nil.
func (p *Proxy) Resolve(ctx context.Context, req *dns.Msg, src, dst netip.AddrPort, proto uint8) *dns.Msg {
	resp, _ := p.resolve(ctx, req, src, dst, proto)
	return resp
}

// resolve is Resolve, which also returns the server's answer as it
// came (nil: not the server's answer, or over TCP): resp is it unpacked.
func (p *Proxy) resolve(ctx context.Context, req *dns.Msg, src, dst netip.AddrPort, proto uint8) (resp *dns.Msg, raw []byte) {
	q := query{req: req, src: src, dst: dst, proto: proto}
	ev := &events.DNS{Server: dst.String(), Verdict: VerdictError}
	var epID endpoint.ID
	defer func() { p.publish(epID, ev) }()
	if len(req.Question) != 1 {
		ev.Error = "not exactly one question"
		return p.fail(req, dns.RcodeFormatError, ev), nil
	}
	ev.Query, ev.QType = fqdn.Normalize(req.Question[0].Name), dns.TypeToString[req.Question[0].Qtype]
	ep, ok := p.ix.EndpointByIP(src.Addr())
	if !ok {
		ev.Error = "source is not a local endpoint"
		return p.fail(req, dns.RcodeRefused, ev), nil
	}
	epID, ev.Identity = ep.ID, uint32(ep.Identity)
	if !p.allowedName(ep.Policy, q, ev.Query) {
		p.count(&p.denied, VerdictDenied)
		ev.Verdict = VerdictDenied
		code := dns.RcodeRefused
		if p.cfg.RejectCode == RejectNameError {
			code = dns.RcodeNameError
		}
		ev.RCode = dns.RcodeToString[code]
		return reply(req, code), nil
	}
	resp, raw, err := p.exchange(ctx, q)
	if err != nil {
		ev.Error = err.Error()
		return p.fail(req, dns.RcodeServerFailure, ev), nil
	}
	ips, ttl := answerAddrs(resp)
	ev.TTL, ev.RCode = ttl, dns.RcodeToString[resp.Rcode]
	for _, ip := range ips {
		ev.IPs = append(ev.IPs, ip.String())
	}
	if len(ips) > 0 {
		if err := p.hold(ctx, ep.ID, ev.Query, ips, ttl); err != nil {
			ev.Error = err.Error()
			return p.fail(req, dns.RcodeServerFailure, ev), nil
		}
	}
	p.count(&p.allowed, VerdictAllowed)
	ev.Verdict = VerdictAllowed
	resp.Id = req.Id
	return resp, raw
}

// hold waits until the agent realised the learned addresses, bounded by
// HoldTimeout; a timeout releases the answer anyway (counted).
func (p *Proxy) hold(ctx context.Context, id endpoint.ID, name string, ips []netip.Addr, ttl uint32) error {
	start := time.Now()
	hctx, cancel := context.WithTimeout(ctx, p.cfg.HoldTimeout)
	defer cancel()
	err := p.learner.LearnFQDN(hctx, id, name, ips, time.Duration(ttl)*time.Second)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		p.count(&p.holdTimeouts, "hold-timeout")
		p.log.Warn("dns answer released before its addresses were realised", "endpoint", id, "name", name, "after", p.cfg.HoldTimeout)
		err = nil
	}
	if err == nil && p.obs != nil {
		p.obs.DNSHold(time.Since(start))
	}
	return err
}

func (p *Proxy) fail(req *dns.Msg, code int, ev *events.DNS) *dns.Msg {
	p.count(&p.errs, VerdictError)
	ev.RCode = dns.RcodeToString[code]
	return reply(req, code)
}

func reply(req *dns.Msg, code int) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(req, code)
	return m
}

// allowedName reports whether the endpoint's policy lets it resolve name
// at the query's server: the DNS entry of the first policy map key that
// matches (Lookups order) decides; without one, an egress that allows
// the server on that port without DNS rules allows every name.
func (p *Proxy) allowedName(m *policy.MapState, q query, name string) bool {
	peer, ok := p.ix.IPCacheLookup(q.dst.Addr())
	if !ok {
		peer = identity.ReservedWorld
	}
	for _, k := range policy.Lookups(peer, q.dst.Port(), q.proto, policy.Egress) {
		e, ok := m.DNSRedirected(k)
		if !ok {
			continue
		}
		for _, s := range e.Names {
			if c := p.selector(s); c != nil && c.Matches(name) {
				return true
			}
		}
		return false
	}
	return m.AllowsAddr(peer, q.dst.Addr(), q.dst.Port(), q.proto, policy.Egress)
}

// maxCompiled bounds the compiled selector cache (cleared when full).
const maxCompiled = 4096

func (p *Proxy) selector(s fqdn.Selector) *fqdn.Compiled {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.compiled[s]; ok {
		return c
	}
	c, err := fqdn.Compile(s, "rules.dns")
	if err != nil {
		return nil // validated at import: never
	}
	if len(p.compiled) >= maxCompiled {
		clear(p.compiled)
	}
	p.compiled[s] = c
	return c
}

// exchange forwards the query to the server from the host netns. Over
// UDP it also returns the answer's bytes as they came.
func (p *Proxy) exchange(ctx context.Context, q query) (*dns.Msg, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.UpstreamTimeout)
	defer cancel()
	if q.proto != policy.ProtoTCP {
		conn, err := p.upstream.get(ctx, q.dst)
		if err != nil {
			return nil, nil, fmt.Errorf("dial udp %s: %w", q.dst, err)
		}
		defer conn.Close()
		resp, raw, err := exchangeUDP(ctx, conn, q.req)
		if err != nil {
			return nil, nil, fmt.Errorf("exchange with %s: %w", q.dst, err)
		}
		return resp, raw, nil
	}
	conn, err := p.sockets.DialHost(ctx, "tcp", q.dst.String())
	if err != nil {
		return nil, nil, fmt.Errorf("dial tcp %s: %w", q.dst, err)
	}
	defer conn.Close()
	c := &dns.Client{Net: "tcp", Timeout: p.cfg.UpstreamTimeout}
	resp, _, err := c.ExchangeWithConnContext(ctx, q.req, &dns.Conn{Conn: conn})
	if err != nil {
		return nil, nil, fmt.Errorf("exchange with %s: %w", q.dst, err)
	}
	return resp, nil, nil
}

// answerBufs are the buffers UDP answers are read into (the largest
// datagram: the server may answer up to what the query allows).
var answerBufs = sync.Pool{New: func() any { b := make([]byte, dns.MaxMsgSize); return &b }}

// exchangeUDP sends req on conn (a UDP socket connected to the server)
// and returns the answer, unpacked and as it came: as dns.Client does,
// bounded by ctx's deadline, skipping datagrams with another ID (an
// earlier query's late answer); one that does not unpack fails it.
// Unlike dns.Client it reads into a pooled buffer, not a new 64 KiB one
// per query.
func exchangeUDP(ctx context.Context, conn net.Conn, req *dns.Msg) (*dns.Msg, []byte, error) {
	out, err := req.Pack()
	if err != nil {
		return nil, nil, fmt.Errorf("pack: %w", err)
	}
	if dl, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(dl); err != nil {
			return nil, nil, err
		}
	}
	if _, err := conn.Write(out); err != nil {
		return nil, nil, err
	}
	bp := answerBufs.Get().(*[]byte)
	defer answerBufs.Put(bp)
	for {
		n, err := conn.Read(*bp)
		if err != nil {
			return nil, nil, err
		}
		raw := append([]byte(nil), (*bp)[:n]...)
		resp := new(dns.Msg)
		if err := resp.Unpack(raw); err != nil {
			return nil, nil, err
		}
		if resp.Id == req.Id {
			return resp, raw, nil
		}
	}
}

// answerAddrs returns the A and AAAA addresses of an answer and its
// lowest TTL (seconds).
func answerAddrs(m *dns.Msg) ([]netip.Addr, uint32) {
	var (
		ips []netip.Addr
		ttl uint32
	)
	for _, rr := range m.Answer {
		var ip netip.Addr
		switch r := rr.(type) {
		case *dns.A:
			ip, _ = netip.AddrFromSlice(r.A.To4())
		case *dns.AAAA:
			ip, _ = netip.AddrFromSlice(r.AAAA)
		default:
			continue
		}
		if !ip.IsValid() {
			continue
		}
		if h := rr.Header().Ttl; len(ips) == 0 || h < ttl {
			ttl = h
		}
		ips = append(ips, ip.Unmap())
	}
	return ips, ttl
}

func (p *Proxy) publish(id endpoint.ID, ev *events.DNS) {
	if ev.Error != "" {
		p.log.Debug("dns query failed", "endpoint", id, "query", ev.Query, "err", ev.Error)
	}
	if p.events == nil {
		return
	}
	p.events.Publish(events.Event{Type: events.DNSQuery, Endpoint: uint16(id), Identity: ev.Identity, DNS: ev})
}
