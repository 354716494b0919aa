package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/membrane-cni/membrane/datapath/l7proxy/xdsapi"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// Config configures Run.
type Config struct {
	// XDS is the agent's xDS unix socket.
	XDS string
	// Listen is the proxy's HTTP listening address (host:port).
	Listen string
	// KafkaListen is the Kafka listener's address ("": none).
	KafkaListen string
	// Log receives the proxy's log.
	Log *slog.Logger
	// AccessLog is the agent's unixgram socket for access records (""
	// sends none).
	AccessLog string
	// Reject, when set, makes the proxy reject every configuration
	// (testing the agent's handling of rejections).
	Reject bool
	// AckDelay delays, and AckDropRate (0..1) loses, the proxy's
	// acknowledgements (fault injection: the simulator's proxy faults
	// against the real proxy). A lost acknowledgement is covered by the
	// next version's.
	AckDelay    time.Duration
	AckDropRate float64
}

// Run runs the proxy until ctx ends: it subscribes to the agent's
// xDS server (reconnecting with backoff) and serves HTTP on cfg.Listen,
// enforcing the configuration last applied.
func Run(ctx context.Context, cfg Config) error {
	ap, err := netip.ParseAddrPort(cfg.Listen)
	if err != nil {
		return fmt.Errorf("proxy listen %s: %w", cfg.Listen, err)
	}
	lis, err := transparentListen(ap)
	if err != nil {
		return err
	}
	if cfg.AckDelay < 0 || cfg.AckDropRate < 0 || cfg.AckDropRate > 1 {
		return fmt.Errorf("proxy: ack delay %v and drop rate %v: want >= 0 and a rate in [0, 1]", cfg.AckDelay, cfg.AckDropRate)
	}
	p := &proxy{log: cfg.Log, reject: cfg.Reject, port: ap.Port(), upstream: newUpstreams(), access: newAccessLog(cfg.AccessLog),
		ackDelay: cfg.AckDelay, ackDrop: cfg.AckDropRate}
	if cfg.KafkaListen != "" {
		kap, err := netip.ParseAddrPort(cfg.KafkaListen)
		if err != nil {
			lis.Close()
			return fmt.Errorf("proxy kafka listen %s: %w", cfg.KafkaListen, err)
		}
		klis, err := transparentListen(kap)
		if err != nil {
			lis.Close()
			return err
		}
		p.kafkaPort = kap.Port()
		go p.serveKafka(ctx, klis)
	}
	go p.access.run(ctx)
	p.state.Store(&state{})
	var pc pinnedConns
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10, Protocols: serverProtocols(),
		ConnContext: pc.connContext, ConnState: pc.connState}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go p.subscribe(ctx, cfg.XDS)
	cfg.Log.Info("proxy serving", "listen", lis.Addr().String(), "xds", cfg.XDS)
	if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("proxy serve: %w", err)
	}
	return nil
}

type proxy struct {
	log    *slog.Logger
	reject bool
	port   uint16 // the listening port: a connection to it is explicit
	// kafkaPort is the Kafka listener's port (0: none); a connection to
	// it is refused (Kafka has no explicit proxy form).
	kafkaPort uint16
	upstream  *upstreams
	access    *accessLog
	ackDelay  time.Duration
	ackDrop   float64
	state     atomic.Pointer[state]
	// decoded are the last version's resources, decoded, by their bytes'
	// hash (apply's goroutine only): a resource the next version sends
	// unchanged (most ipcache shards, most endpoints) is not decoded again.
	decoded map[uint64][]decodedResource
}

// decodedResource is a resource's bytes and what they decoded to
// (read-only once decoded: versions share it).
type decodedResource struct {
	raw []byte
	r   *xdsapi.Resource
}

// state is one applied configuration version, immutable.
type state struct {
	version string
	byIP    map[netip.Addr]*compiledEndpoint
	ipcache [xdsapi.IPCacheShards]map[netip.Prefix]identity.NumericIdentity
}

type compiledEndpoint struct {
	id    uint64
	l7    map[policy.Key][]*policy.CompiledHTTPRule
	kafka map[policy.Key][]*policy.CompiledKafkaRule
}

// buildState decodes and compiles every resource; any error rejects the
// whole version. The endpoints compile after every resource is decoded:
// their header secrets resolve with the version's secrets resource.
//
// prev holds the previous version's decoded resources (nil: none); the
// second result is this version's, for the next call.
func buildState(version string, resources [][]byte, prev map[uint64][]decodedResource) (*state, map[uint64][]decodedResource, error) {
	st := &state{version: version, byIP: map[netip.Addr]*compiledEndpoint{}}
	var eps []*xdsapi.EndpointPolicy
	var secrets policy.SecretValues
	decoded := make(map[uint64][]decodedResource, len(resources))
	for i, raw := range resources {
		h := fnv.New64a()
		_, _ = h.Write(raw)
		sum := h.Sum64()
		var r *xdsapi.Resource
		for _, d := range prev[sum] {
			if bytes.Equal(d.raw, raw) {
				r = d.r
				break
			}
		}
		if r == nil {
			r = new(xdsapi.Resource)
			if err := json.Unmarshal(raw, r); err != nil {
				return nil, nil, fmt.Errorf("resource %d: %w", i, err)
			}
			if r.IPCache != nil {
				if err := r.IPCache.Check(); err != nil {
					return nil, nil, fmt.Errorf("resource %d: %w", i, err)
				}
			}
		}
		decoded[sum] = append(decoded[sum], decodedResource{raw: raw, r: r})
		switch {
		case r.IPCache != nil:
			if st.ipcache[r.IPCache.Shard] != nil {
				return nil, nil, fmt.Errorf("resource %d: ipcache shard %d twice", i, r.IPCache.Shard)
			}
			st.ipcache[r.IPCache.Shard] = r.IPCache.Entries
		case r.Secrets != nil:
			secrets = r.Secrets.Values
		case r.Endpoint != nil:
			eps = append(eps, r.Endpoint)
		default:
			return nil, nil, fmt.Errorf("resource %d: neither endpoint, ipcache nor secrets", i)
		}
	}
	for _, ep := range eps {
		ce, err := compileEndpoint(ep, secrets)
		if err != nil {
			return nil, nil, err
		}
		for _, ip := range ep.IPs {
			st.byIP[ip.Unmap()] = ce
		}
	}
	return st, decoded, nil
}

func compileEndpoint(ep *xdsapi.EndpointPolicy, secrets policy.SecretValues) (*compiledEndpoint, error) {
	ce := &compiledEndpoint{id: ep.ID, l7: map[policy.Key][]*policy.CompiledHTTPRule{}, kafka: map[policy.Key][]*policy.CompiledKafkaRule{}}
	for i, e := range ep.L7 {
		if e.Parser() == policy.ParserKafka {
			for j, k := range e.Kafka {
				c, err := policy.CompileKafkaRule(k, fmt.Sprintf("endpoint %d l7[%d].kafka[%d]", ep.ID, i, j))
				if err != nil {
					return nil, err
				}
				ce.kafka[e.Key] = append(ce.kafka[e.Key], c)
			}
			continue
		}
		if e.HTTP == nil {
			// Rules of both protocols on one key: no request passes.
			ce.l7[e.Key] = []*policy.CompiledHTTPRule{}
		}
		for j, h := range e.HTTP {
			c, err := policy.CompileHTTPRuleWith(h, fmt.Sprintf("endpoint %d l7[%d].http[%d]", ep.ID, i, j), secrets)
			if err != nil {
				return nil, err
			}
			ce.l7[e.Key] = append(ce.l7[e.Key], c)
		}
	}
	return ce, nil
}

// identityOf returns the identity of addr by longest-prefix match
// (world when the ipcache has no entry).
func (s *state) identityOf(addr netip.Addr) identity.NumericIdentity {
	addr = addr.Unmap()
	for bits := addr.BitLen(); bits >= 0; bits-- {
		p, _ := addr.Prefix(bits)
		if id, ok := s.ipcache[xdsapi.IPCacheShardOf(p)][p]; ok {
			return id
		}
	}
	return identity.ReservedWorld
}

// decision is a verdict and what it was decided on.
type decision struct {
	allowed bool
	reason  string
	// endpoint is the endpoint whose rules decided (the denying one, else
	// the last allowing one; 0 if none had rules), dir their direction.
	endpoint     uint64
	dir          policy.Direction
	srcID, dstID identity.NumericIdentity
	// mismatches are the headerMatches actions of the rules that allowed
	// (each side's first matching rule), applied to the request.
	mismatches []policy.HeaderMismatch
}

// verdict decides an HTTP request from src to dst:port (decide).
func (s *state) verdict(src, dst netip.Addr, port uint16, r *http.Request) decision {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return decide(s, src, dst, port, "rules", (*compiledEndpoint).rules, func(rules []*policy.CompiledHTTPRule) (bool, []policy.HeaderMismatch) {
		c := matchAny(rules, r.Method, r.URL.Path, host, r.Header)
		if c == nil {
			return false, nil
		}
		return true, c.Mismatches(r.Header)
	})
}

// decide decides a request from src to dst:port: every side with rules
// on the connection (dst's ingress, src's egress; rulesOf returns a
// side's rules and whether it redirects the connection at all) must
// allow it (allows, which also returns the headerMatches actions of the
// rule that allowed), and at least one side must have rules (else it is
// not the proxy's traffic). what names the rules in a denial's reason.
func decide[R any](s *state, src, dst netip.Addr, port uint16, what string,
	rulesOf func(e *compiledEndpoint, peer identity.NumericIdentity, port uint16, dir policy.Direction) ([]R, bool),
	allows func(rules []R) (bool, []policy.HeaderMismatch)) decision {
	d := decision{srcID: s.identityOf(src), dstID: s.identityOf(dst)}
	for _, side := range []struct {
		ep   *compiledEndpoint
		peer identity.NumericIdentity
		dir  policy.Direction
	}{{s.byIP[dst.Unmap()], d.srcID, policy.Ingress}, {s.byIP[src.Unmap()], d.dstID, policy.Egress}} {
		if side.ep == nil {
			continue
		}
		rules, ok := rulesOf(side.ep, side.peer, port, side.dir)
		if !ok {
			continue
		}
		d.endpoint, d.dir = side.ep.id, side.dir
		ok, mismatches := allows(rules)
		if !ok {
			d.allowed, d.reason, d.mismatches = false, fmt.Sprintf("%s %s deny identity %d", side.dir, what, side.peer), nil
			return d
		}
		d.allowed = true
		d.mismatches = append(d.mismatches, mismatches...)
	}
	if d.endpoint == 0 {
		d.reason = "no L7 policy for this connection"
	}
	return d
}

// rules returns the HTTP rules of e for peer on port in dir, and
// whether e redirects that traffic at all. Traffic e redirects to the
// Kafka listener has no HTTP rules (nil, true): the HTTP proxy denies
// it.
func (e *compiledEndpoint) rules(peer identity.NumericIdentity, port uint16, dir policy.Direction) ([]*policy.CompiledHTTPRule, bool) {
	return keyRules(e.l7, e.kafka, peer, port, dir)
}

// kafkaRules is rules for the Kafka listener.
func (e *compiledEndpoint) kafkaRules(peer identity.NumericIdentity, port uint16, dir policy.Direction) ([]*policy.CompiledKafkaRule, bool) {
	return keyRules(e.kafka, e.l7, peer, port, dir)
}

// keyRules returns the rules of m on the keys of peer (and any peer)
// on port in dir, and whether m or other (the other protocol's rules)
// has one of those keys: other's keys contribute no rules, so a
// request of the wrong protocol is denied.
func keyRules[R, O any](m map[policy.Key][]R, other map[policy.Key][]O, peer identity.NumericIdentity, port uint16, dir policy.Direction) ([]R, bool) {
	var out []R
	found := false
	for _, k := range []policy.Key{{Identity: peer, Port: port, Proto: policy.ProtoTCP, Dir: dir}, {Port: port, Proto: policy.ProtoTCP, Dir: dir}} {
		if rs, ok := m[k]; ok {
			out, found = append(out, rs...), true
		}
		if _, ok := other[k]; ok {
			found = true
		}
	}
	return out, found
}

// matchAny returns the first of rules that matches the request, nil if
// none does.
func matchAny(rules []*policy.CompiledHTTPRule, method, path, host string, h http.Header) *policy.CompiledHTTPRule {
	for _, c := range rules {
		if c.Matches(method, path, host, h) {
			return c
		}
	}
	return nil
}

// upstreamSource is the source address of the upstream connection of a
// client at src: the client's own when it is a local endpoint with L7
// policy (an egress redirect), as Cilium's proxy keeps the original
// source, so that the server's node, this one or another, native or
// tunnel routing, takes the client's identity from its address (the
// ipcache, or the VNI to_overlay derives from it); the endpoint
// programs hand the answers to the proxy's socket (proxy_upstream in
// bpf/endpoint.c). Any other client (a remote pod, the node, the
// world, reaching a local endpoint's ingress rules) gets the node's
// address and its identity in the mark, which this node's programs
// read.
func (s *state) upstreamSource(src netip.Addr) netip.Addr {
	if s.byIP[src.Unmap()] == nil {
		return netip.Addr{}
	}
	return src.Unmap()
}

// errExplicitRefused: a connection to the proxy's own port that did not
// come from the node itself (a pod or an underlay host using the proxy
// as a forward proxy would send with the proxy's identity mark, around
// its own egress policy).
var errExplicitRefused = errors.New("explicit proxy requests are accepted on the loopback address only")

// destination returns where r goes: the accepted connection's local
// address when the BPF programs redirected it (transparent: the
// original destination), else (a connection to the proxy's own port on
// a loopback address: explicit, from the node itself) the request's
// absolute http:// URL. Any other connection to the proxy's own port is
// refused.
func (p *proxy) destination(r *http.Request) (netip.AddrPort, error) {
	la, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, errors.New("no local address")
	}
	local := la.AddrPort()
	if local.Port() != p.port {
		return netip.AddrPortFrom(local.Addr().Unmap(), local.Port()), nil
	}
	if !local.Addr().Unmap().IsLoopback() {
		return netip.AddrPort{}, errExplicitRefused
	}
	if r.URL.Host == "" || r.URL.Scheme != "http" {
		return netip.AddrPort{}, errors.New("want an absolute http:// URL")
	}
	if dst, err := netip.ParseAddrPort(r.URL.Host); err == nil {
		return dst, nil
	}
	a, err := netip.ParseAddr(r.URL.Host)
	if err != nil {
		return netip.AddrPort{}, errors.New("destination must be an address")
	}
	return netip.AddrPortFrom(a, 80), nil
}

// ServeHTTP enforces and forwards one request. The upstream connection
// carries the client's identity in its mark (upstreams), so the
// destination's L4 policy sees the client, not the node.
func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	st := p.state.Load()
	src, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		http.Error(w, "membrane-proxy: bad client address", http.StatusBadRequest)
		return
	}
	dst, err := p.destination(r)
	if errors.Is(err, errExplicitRefused) {
		deny(w, r, http.StatusForbidden, "membrane-proxy: "+err.Error())
		return
	}
	if err != nil {
		deny(w, r, http.StatusBadRequest, "membrane-proxy: "+err.Error())
		return
	}
	if why := refusedRequest(r); why != "" {
		deny(w, r, http.StatusBadRequest, "membrane-proxy: "+why)
		return
	}
	// Rules match, and the server receives, the one normalised path: a
	// server that resolved "..", "%2e%2e" or doubled slashes itself would
	// otherwise serve a path the rules never saw.
	r.URL.Path, r.URL.RawPath = normalizePath(r.URL.Path), ""
	srcAddr := src.Addr().Unmap()
	d := st.verdict(srcAddr, dst.Addr(), dst.Port(), r)
	rec := xdsapi.AccessRecord{Time: time.Now(), Endpoint: d.endpoint, Direction: d.dir.String(),
		Src: netip.AddrPortFrom(srcAddr, src.Port()), Dst: dst, SrcIdentity: uint32(d.srcID), DstIdentity: uint32(d.dstID),
		Method: r.Method, Path: r.URL.Path, Host: r.Host, Allowed: d.allowed, Reason: d.reason,
		Version: r.Proto, GRPC: isGRPC(r)}
	if !d.allowed {
		rec.Code, rec.GRPCStatus = http.StatusForbidden, grpcPermissionDenied(r)
	}
	for _, m := range d.mismatches {
		rec.HeaderMismatches = append(rec.HeaderMismatches, m.String())
		m.Apply(r.Header) // the request the server receives
	}
	p.access.log(rec)
	if !d.allowed {
		deny(w, r, http.StatusForbidden, "Access denied ("+d.reason+")")
		return
	}
	var tr http.RoundTripper = p.upstream.forIdentity(d.srcID, r.ProtoMajor == 2, st.upstreamSource(srcAddr))
	if pin, ok := r.Context().Value(pinnedKey{}).(*pinned); ok && r.ProtoMajor == 1 {
		tr = &pinnedTransport{p: pin, key: upstreamKey{id: d.srcID, src: st.upstreamSource(srcAddr)}, dst: dst, fallback: tr}
	}
	rp := &httputil.ReverseProxy{Transport: tr,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", dst.String()
			pr.Out.URL.Path, pr.Out.URL.RawPath = r.URL.Path, ""
			pr.Out.Host = r.Host
		}}
	rp.ServeHTTP(w, r)
}

// subscribe keeps an ADS stream to the agent open, reconnecting with
// backoff, and applies every response.
func (p *proxy) subscribe(ctx context.Context, path string) {
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := p.stream(ctx, path)
		if ctx.Err() != nil {
			return
		}
		p.log.Warn("xds stream ended; reconnecting", "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func (p *proxy) stream(ctx context.Context, path string) error {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("xds dial: %w", err)
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ads, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
	if err != nil {
		return fmt.Errorf("xds stream: %w", err)
	}
	node := &core.Node{Id: "membrane-proxy"}
	if err := ads.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: xdsapi.TypeURL}); err != nil {
		return fmt.Errorf("xds subscribe: %w", err)
	}
	for {
		resp, err := ads.Recv()
		if err != nil {
			return fmt.Errorf("xds receive: %w", err)
		}
		ack := &discovery.DiscoveryRequest{Node: node, TypeUrl: xdsapi.TypeURL, ResponseNonce: resp.GetNonce(), VersionInfo: resp.GetVersionInfo()}
		if err := p.apply(resp); err != nil {
			// The rejected version stays in version_info so that the
			// server waits for a new one instead of resending it.
			p.log.Warn("rejecting configuration", "version", resp.GetVersionInfo(), "err", err)
			ack.ErrorDetail = &status.Status{Code: 3, Message: err.Error()}
		}
		if !p.ackFault(ctx) {
			continue
		}
		if err := ads.Send(ack); err != nil {
			return fmt.Errorf("xds acknowledge: %w", err)
		}
	}
}

// ackFault applies the injected acknowledgement faults: it waits
// AckDelay and reports false for an acknowledgement to lose.
func (p *proxy) ackFault(ctx context.Context) bool {
	if p.ackDelay > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(p.ackDelay):
		}
	}
	if p.ackDrop > 0 && rand.Float64() < p.ackDrop {
		p.log.Info("losing an acknowledgement (--ack-drop-rate)")
		return false
	}
	return true
}

func (p *proxy) apply(resp *discovery.DiscoveryResponse) error {
	if p.reject {
		return errors.New("configured to reject every configuration")
	}
	var rs [][]byte
	for _, a := range resp.GetResources() {
		var b wrapperspb.BytesValue
		if a.GetTypeUrl() != xdsapi.TypeURL {
			return fmt.Errorf("resource of type %q, want %s", a.GetTypeUrl(), xdsapi.TypeURL)
		}
		if err := a.UnmarshalTo(&b); err != nil {
			return fmt.Errorf("decode resource: %w", err)
		}
		rs = append(rs, b.GetValue())
	}
	st, decoded, err := buildState(resp.GetVersionInfo(), rs, p.decoded)
	if err != nil {
		return err
	}
	p.decoded = decoded
	p.state.Store(st)
	p.log.Info("configuration applied", "version", st.version, "resources", len(rs))
	return nil
}
