package datapath

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// grpcPort is B's port serving HTTP/1.1, h2c and gRPC (the health
// service) on one listener.
const grpcPort = 50051

// mixedServer serves, on port of pod p's netns, HTTP/1.1 and HTTP/2
// without TLS (prior knowledge) on one listener: gRPC calls go to a
// health server (returned: the test changes its status), every other
// request gets "B <method> <path> <proto>".
func mixedServer(t *testing.T, p *testPod, port int) *health.Server {
	t.Helper()
	var l net.Listener
	err := p.ns.Do(func() (err error) {
		l, err = net.Listen("tcp", netip.AddrPortFrom(p.addr(), uint16(port)).String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	hs := health.NewServer()
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	protos := new(http.Protocols)
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Protocols: protos, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			gs.ServeHTTP(w, r)
			return
		}
		fmt.Fprintf(w, "B %s %s %s", r.Method, r.URL.Path, r.Proto)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close(); gs.Stop() })
	return hs
}

// h2Client is an HTTP/2 client of pod p speaking h2c with prior
// knowledge, as gRPC does; dials counts its TCP connections.
func h2Client(p *testPod, dials *atomic.Int32) *http.Client {
	dial := dialFrom(p, connectTimeout)
	protos := new(http.Protocols)
	protos.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: protos, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return dial(ctx, network, addr)
	}}
	return &http.Client{Transport: tr, Timeout: connectTimeout}
}

// do sends method path (with header h) through c to dst:port and
// returns the status, body and protocol.
func do(c *http.Client, dst *testPod, port int, method, path string, h http.Header) (int, string, string, error) {
	req, err := http.NewRequest(method, "http://"+netip.AddrPortFrom(dst.addr(), uint16(port)).String()+path, nil)
	if err != nil {
		return 0, "", "", err
	}
	req.Header = h
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Proto, err
}

// grpcClient is a gRPC client connection from pod p to dst:port.
func grpcClient(t *testing.T, p, dst *testPod, port int) *grpc.ClientConn {
	t.Helper()
	dial := dialFrom(p, connectTimeout)
	cc, err := grpc.NewClient("passthrough:///"+netip.AddrPortFrom(dst.addr(), uint16(port)).String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return dial(ctx, "tcp", addr) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// grpcRules is B's ingress from A on grpcPort: GET /public, the health
// service's Watch (a server-streaming call) by path, and /token only
// with the header X-Token: yes.
func (e *l7E2E) grpcRules() {
	e.t.Helper()
	k := policy.Key{Identity: e.a.ep.Identity, Port: grpcPort, Proto: policy.ProtoTCP, Dir: policy.Ingress}
	m := policy.NewMapState(e.rev, true, false, []policy.Key{k})
	m.L7 = []policy.L7Entry{{Key: k, HTTP: []policy.HTTPRule{{Method: "GET", Path: "/public"},
		{Method: "POST", Path: "/grpc\\.health\\.v1\\.Health/Watch"}, {Path: "/token", Headers: []string{"X-Token: yes"}}}}}
	e.set(e.b, m, true)
}

// TestL7HTTP2 (root, real traffic): one L7 port of B carries HTTP/1.1
// and h2c (prior knowledge) through the proxy the BPF programs redirect
// to. HTTP/1.1 is enforced as before; over HTTP/2 the rules decide per
// stream on one connection: a denied stream gets its 403 while the
// connection's other streams, before and after, are served (one dial);
// a header rule applies to HTTP/2's header fields; the access records
// carry the protocol.
func TestL7HTTP2(t *testing.T) {
	e := newL7E2E(t)
	mixedServer(t, e.b, grpcPort)
	e.grpcRules()

	h1 := &http.Client{Transport: &http.Transport{DialContext: dialFrom(e.a, connectTimeout)}, Timeout: connectTimeout}
	for _, c := range []struct {
		path string
		want int
	}{{"/public", 200}, {"/private", 403}} {
		code, body, proto, err := do(h1, e.b, grpcPort, "GET", c.path, nil)
		if err != nil || code != c.want || proto != "HTTP/1.1" {
			t.Errorf("HTTP/1.1 GET %s = %d %q %s %v, want %d over HTTP/1.1", c.path, code, body, proto, err, c.want)
		}
	}

	var dials atomic.Int32
	h2 := h2Client(e.a, &dials)
	for _, c := range []struct {
		method, path string
		h            http.Header
		want         int
		body         string
	}{
		{"GET", "/public", nil, 200, "B GET /public HTTP/2.0"},
		{"GET", "/private", nil, 403, "Access denied"},
		{"POST", "/public", nil, 403, "Access denied"},
		{"GET", "/public", nil, 200, "B GET /public HTTP/2.0"},
		{"GET", "/token", http.Header{"X-Token": {"yes"}}, 200, "B GET /token HTTP/2.0"},
		{"GET", "/token", http.Header{"X-Token": {"no"}}, 403, "Access denied"},
		{"GET", "/token", nil, 403, "Access denied"},
		{"GET", "/public", nil, 200, "B GET /public HTTP/2.0"},
	} {
		code, body, proto, err := do(h2, e.b, grpcPort, c.method, c.path, c.h)
		if err != nil || code != c.want || proto != "HTTP/2.0" || !strings.Contains(body, c.body) {
			t.Errorf("HTTP/2 %s %s %v = %d %q %s %v, want %d %q over HTTP/2.0", c.method, c.path, c.h, code, body, proto, err, c.want, c.body)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("HTTP/2 client dialled %d connections, want 1: a denied stream must not end its connection", n)
	}
	want := L7AccessEvent{Endpoint: uint64(e.b.ep.ID), Direction: "ingress", Src: netip.AddrPortFrom(e.a.addr(), 0),
		Dst: netip.AddrPortFrom(e.b.addr(), grpcPort), SrcIdentity: uint32(e.a.ep.Identity), DstIdentity: uint32(e.b.ep.Identity),
		Method: "GET", Path: "/private", Host: netip.AddrPortFrom(e.b.addr(), grpcPort).String(),
		Reason: fmt.Sprintf("ingress rules deny identity %d", e.a.ep.Identity), Version: "HTTP/2.0", Code: 403}
	testutil.Eventually(t, "the access record of A's HTTP/2 GET /private", func() bool { return e.accessed(want) })
}

// TestL7GRPC (root, real traffic): gRPC through the proxy. The rule
// allows the health service's Watch by path: a server-streaming call
// that stays open and delivers each status change. Check (no rule) on
// the same connection, while the stream is open, gets the gRPC status
// PERMISSION_DENIED (as Envoy answers a denied gRPC call) and the
// stream goes on; the access record says gRPC over HTTP/2 and the
// status.
func TestL7GRPC(t *testing.T) {
	e := newL7E2E(t)
	hs := mixedServer(t, e.b, grpcPort)
	hs.SetServingStatus("membrane", healthpb.HealthCheckResponse_SERVING)
	e.grpcRules()

	hc := healthpb.NewHealthClient(grpcClient(t, e.a, e.b, grpcPort))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	watch, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: "membrane"})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	next := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		got, err := watch.Recv()
		if err != nil || got.GetStatus() != want {
			t.Fatalf("Watch update: %v %v, want %v", got.GetStatus(), err, want)
		}
	}
	next(healthpb.HealthCheckResponse_SERVING)

	_, err = hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "membrane"})
	if st := status.Convert(err); st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), "Access denied") {
		t.Errorf("Check (no rule) = %v, want code PermissionDenied with the proxy's message", err)
	}
	// On the wire: a trailers-only answer, HTTP 200 with grpc-status 7
	// (a grpc-go client would also map a bare 403 to PermissionDenied).
	var dials atomic.Int32
	req, _ := http.NewRequest("POST", "http://"+netip.AddrPortFrom(e.b.addr(), grpcPort).String()+"/grpc.health.v1.Health/Check", nil)
	req.Header = http.Header{"Content-Type": {"application/grpc"}, "Te": {"trailers"}}
	resp, err := h2Client(e.a, &dials).Do(req)
	if err != nil {
		t.Fatalf("raw gRPC Check: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Grpc-Status") != "7" {
		t.Errorf("raw gRPC Check = %d grpc-status %q, want 200 with grpc-status 7", resp.StatusCode, resp.Header.Get("Grpc-Status"))
	}
	for _, s := range []healthpb.HealthCheckResponse_ServingStatus{healthpb.HealthCheckResponse_NOT_SERVING, healthpb.HealthCheckResponse_SERVING} {
		hs.SetServingStatus("membrane", s)
		next(s)
	}
	want := L7AccessEvent{Endpoint: uint64(e.b.ep.ID), Direction: "ingress", Src: netip.AddrPortFrom(e.a.addr(), 0),
		Dst: netip.AddrPortFrom(e.b.addr(), grpcPort), SrcIdentity: uint32(e.a.ep.Identity), DstIdentity: uint32(e.b.ep.Identity),
		Method: "POST", Path: "/grpc.health.v1.Health/Check", Host: netip.AddrPortFrom(e.b.addr(), grpcPort).String(),
		Reason: fmt.Sprintf("ingress rules deny identity %d", e.a.ep.Identity), Version: "HTTP/2.0", GRPC: true, Code: 403, GRPCStatus: 7}
	testutil.Eventually(t, "the access record of A's denied Check", func() bool { return e.accessed(want) })
	allowed := want
	allowed.Path, allowed.Allowed, allowed.Reason, allowed.Code, allowed.GRPCStatus = "/grpc.health.v1.Health/Watch", true, "", 0, 0
	testutil.Eventually(t, "the access record of A's Watch", func() bool { return e.accessed(allowed) })
}

// TestBenchL7HTTPVersions (root; MEMBRANE_BENCH_L7=1): sequential GETs
// from A to B over one kept-alive connection, HTTP/1.1 and h2c, each
// directly (an L4 rule) and through the proxy (an L7 rule), in one run:
// the latencies (p50, p99, mean) and what the proxy adds per version.
func TestBenchL7HTTPVersions(t *testing.T) {
	if os.Getenv("MEMBRANE_BENCH_L7") == "" {
		t.Skip("MEMBRANE_BENCH_L7 unset")
	}
	n := 2000
	e := newL7E2E(t)
	mixedServer(t, e.b, grpcPort)
	k := policy.Key{Identity: e.a.ep.Identity, Port: grpcPort, Proto: policy.ProtoTCP, Dir: policy.Ingress}
	run := func(name string, c *http.Client) {
		lat := make([]time.Duration, 0, n)
		for range n {
			start := time.Now()
			code, _, _, err := do(c, e.b, grpcPort, "GET", "/public", nil)
			if err != nil || code != 200 {
				t.Fatalf("%s: %d %v", name, code, err)
			}
			lat = append(lat, time.Since(start))
		}
		c.CloseIdleConnections()
		slices.Sort(lat)
		var sum time.Duration
		for _, d := range lat {
			sum += d
		}
		line := fmt.Sprintf("l7-http-versions %-16s n=%d p50=%v p99=%v mean=%v", name, n, lat[n/2], lat[n*99/100], sum/time.Duration(n))
		t.Log(line)
		fmt.Println(line)
	}
	var dials atomic.Int32
	h1 := func() *http.Client {
		return &http.Client{Transport: &http.Transport{DialContext: dialFrom(e.a, connectTimeout)}, Timeout: connectTimeout}
	}
	e.set(e.b, policy.NewMapState(e.rev, true, false, []policy.Key{k}), false)
	run("http1-direct", h1())
	run("h2c-direct", h2Client(e.a, &dials))
	e.grpcRules()
	run("http1-proxy", h1())
	run("h2c-proxy", h2Client(e.a, &dials))
}
