package datapath

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath/l7proxy"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// httpServer serves "B <method> <path>" on port in pod p's netns.
func httpServer(t *testing.T, p *testPod, port int) {
	t.Helper()
	var l net.Listener
	err := p.ns.Do(func() (err error) {
		l, err = net.Listen("tcp", netip.AddrPortFrom(p.addr(), uint16(port)).String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "B %s %s", r.Method, r.URL.Path)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// dialFrom opens a TCP connection from pod p's netns.
func dialFrom(p *testPod, timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := p.ns.Do(func() (err error) {
			c, err = (&net.Dialer{Timeout: timeout}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// request sends method path to dst:80 from pod p as an ordinary client
// (no proxy configured: the BPF programs redirect it); it returns the
// status code and body.
func request(p, dst *testPod, method, path string, timeout time.Duration) (int, string, error) {
	tr := &http.Transport{DialContext: dialFrom(p, timeout), DisableKeepAlives: true}
	req, err := http.NewRequest(method, "http://"+netip.AddrPortFrom(dst.addr(), 80).String()+path, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := (&http.Client{Transport: tr, Timeout: connectTimeout}).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// l7E2E is the end-to-end environment with the real proxy process on
// 127.0.0.1:15001 of the test host netns.
type l7E2E struct {
	*e2eEnv
	ev     *proxyEvents
	rev    uint64
	mu     sync.Mutex
	access []L7AccessEvent
}

// accessed reports whether an access record matching want (Time, Src
// port ignored) arrived.
func (e *l7E2E) accessed(want L7AccessEvent) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range e.access {
		r.Time, r.Src = time.Time{}, netip.AddrPortFrom(r.Src.Addr(), 0)
		if reflect.DeepEqual(r, want) {
			return true
		}
	}
	return false
}

const e2eProxyPort = 15001

func newL7E2E(t *testing.T) *l7E2E {
	testutil.RequireRoot(t)
	bin := filepath.Join(testutil.BuildBinariesT(t, "membrane-proxy"), "membrane-proxy")
	cfg := LinuxConfig{L7: L7Config{ProxyPath: bin, XDSSocket: filepath.Join(t.TempDir(), "xds.sock"),
		Listen:     netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), e2eProxyPort).String(),
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 500 * time.Millisecond, StableAfter: time.Second}}
	e := &l7E2E{e2eEnv: newE2E(t, cfg), ev: &proxyEvents{}, rev: 1}
	e.ev.install(e.l)
	e.l.SetHooks(LinuxHooks{OnDrop: e.drops.add, OnL7Access: func(r L7AccessEvent) {
		e.mu.Lock()
		e.access = append(e.access, r)
		e.mu.Unlock()
	}})
	httpServer(t, e.b, 80)
	return e
}

// set realises m as p's policy in a new revision and, when it changes
// L7 configuration, waits (bounded) for the proxy's acknowledgement.
func (e *l7E2E) set(p *testPod, m *policy.MapState, wantWait bool) {
	e.t.Helper()
	e.rev++
	p.ep.Policy = m
	r, err := e.l.Realize(context.Background(), p.ep, e.rev)
	if err != nil {
		e.t.Fatalf("Realize endpoint %d revision %d: %v", p.ep.ID, e.rev, err)
	}
	if !wantWait {
		if len(r.ProxyWaits) != 0 {
			e.t.Fatalf("revision %d: ProxyWaits %v, want none", e.rev, r.ProxyWaits)
		}
		return
	}
	e.ev.waitAcked(e.t, e.l, p.ep.ID, r, e.rev)
}

// expect checks the answer to method path from p to B:80.
func (e *l7E2E) expect(from *testPod, method, path string, want int, wantBody string) {
	e.t.Helper()
	code, body, err := request(from, e.b, method, path, connectTimeout)
	if err != nil || code != want || !strings.Contains(body, wantBody) {
		e.t.Errorf("endpoint %d %s %s to B:80 = %d %q %v, want %d %q", from.ep.ID, method, path, code, body, err, want, wantBody)
	}
}

// enforced checks GET /public only, from A (a 403 comes from the proxy).
func (e *l7E2E) enforced() {
	e.t.Helper()
	e.expect(e.a, "GET", "/public", 200, "B GET /public")
	e.expect(e.a, "GET", "/private", 403, "Access denied")
	e.expect(e.a, "POST", "/public", 403, "Access denied")
}

// TestL7RedirectIngress (root, real traffic): B's ingress policy lets A
// GET /public on port 80, enforced by the proxy process the BPF programs
// redirect to transparently (A addresses B, not the proxy, and gets its
// answers from B's address); /private and POST get 403 from the proxy;
// C has no rule and gets nothing (dropped); B:8080 (no L7 rule) is
// untouched. The proxy's upstream connection carries A's identity: B's
// L4 policy admits it without admitting the host. SIGKILLing the proxy:
// it is restarted, gets its configuration again and enforces it.
// Replacing the L7 rule by an L4 rule restores plain L4 behaviour.
func TestL7RedirectIngress(t *testing.T) {
	e := newL7E2E(t)
	a := e.a.ep.Identity
	k80 := policy.Key{Identity: a, Port: 80, Proto: policy.ProtoTCP, Dir: policy.Ingress}
	k8080 := policy.Key{Identity: a, Port: 8080, Proto: policy.ProtoTCP, Dir: policy.Ingress}
	l7 := func() *policy.MapState {
		m := policy.NewMapState(e.rev, true, false, []policy.Key{k80, k8080})
		m.L7 = []policy.L7Entry{{Key: k80, HTTP: []policy.HTTPRule{{Method: "GET", Path: "/public"}}}}
		return m
	}
	e.set(e.b, l7(), true)
	e.enforced()
	denied := L7AccessEvent{Endpoint: uint64(e.b.ep.ID), Direction: "ingress", Src: netip.AddrPortFrom(e.a.addr(), 0),
		Dst: netip.AddrPortFrom(e.b.addr(), 80), SrcIdentity: uint32(a), DstIdentity: uint32(e.b.ep.Identity),
		Method: "GET", Path: "/private", Host: netip.AddrPortFrom(e.b.addr(), 80).String(), Reason: fmt.Sprintf("ingress rules deny identity %d", a),
		Version: "HTTP/1.1", Code: 403}
	testutil.Eventually(t, "the proxy's access record of A's GET /private", func() bool { return e.accessed(denied) })
	if _, _, err := request(e.c, e.b, "GET", "/public", dropTimeout); err == nil {
		t.Errorf("C reached B:80, want its connection dropped")
	}
	e.mustTalk(e.a, e.b, 8080)
	entries, _, _, err := e.l.DumpPolicy(context.Background(), e.b.ep.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range entries {
		if want := map[policy.Key]uint16{k80: e2eProxyPort}[en.Key]; en.ProxyPort != want {
			t.Errorf("policy map entry %+v: proxy port %d, want %d", en.Key, en.ProxyPort, want)
		}
	}

	pid := e.l.L7Status().Process.PID
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the proxy restarted", func() bool { s := e.l.L7Status().Process; return s.PID != 0 && s.PID != pid })
	testutil.Eventually(t, "the restarted proxy answers A", func() bool {
		code, _, err := request(e.a, e.b, "GET", "/public", dropTimeout)
		return err == nil && code == 200
	})
	e.enforced()

	e.set(e.b, policy.NewMapState(e.rev, true, false, []policy.Key{k80}), true) // L7 withdrawn: plain L4
	e.expect(e.a, "GET", "/private", 200, "B GET /private")
	if _, _, err := request(e.c, e.b, "GET", "/public", dropTimeout); err == nil {
		t.Errorf("L4 rule: C reached B:80")
	}
}

// TestL7RedirectEgress (root, real traffic): A's egress policy lets it
// GET /public on B:80 (the BPF program at A's side redirects to the
// proxy); B enforces nothing. A's other egress (B:8080) is plain L4.
func TestL7RedirectEgress(t *testing.T) {
	e := newL7E2E(t)
	b := e.b.ep.Identity
	k80 := policy.Key{Identity: b, Port: 80, Proto: policy.ProtoTCP, Dir: policy.Egress}
	k8080 := policy.Key{Identity: b, Port: 8080, Proto: policy.ProtoTCP, Dir: policy.Egress}
	m := policy.NewMapState(e.rev, false, true, []policy.Key{k80, k8080})
	m.L7 = []policy.L7Entry{{Key: k80, HTTP: []policy.HTTPRule{{Method: "GET", Path: "/public"}}}}
	e.set(e.a, m, true)
	e.enforced()
	e.mustTalk(e.a, e.b, 8080)
	e.mustNotTalk(e.a, e.b, 8081)
	e.expect(e.c, "GET", "/private", 200, "B GET /private") // C has no policy
}

// TestL7RedirectUDP (root, real traffic): the redirect is generic: a UDP
// entry with a proxy port hands A's datagrams to B:53 to a transparent
// UDP socket at 127.0.0.1:<port> of the node (as a DNS proxy's), which
// reads the original destination (IP_RECVORIGDSTADDR) and answers from
// it; A gets the answer from B:53.
func TestL7RedirectUDP(t *testing.T) {
	e := newL7E2E(t)
	got := make(chan netip.AddrPort, 1)
	udpProxy(t, e.host, e2eProxyPort, got)
	k53 := policy.Key{Identity: e.b.ep.Identity, Port: 53, Proto: policy.ProtoUDP, Dir: policy.Egress}
	m := policy.NewMapState(e.rev, false, true, []policy.Key{k53})
	m.L7 = []policy.L7Entry{{Key: k53, HTTP: []policy.HTTPRule{{}}}}
	e.set(e.a, m, true)
	var reply string
	err := e.a.ns.Do(func() error {
		c, err := net.Dial("udp", netip.AddrPortFrom(e.b.addr(), 53).String())
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(connectTimeout))
		if _, err := c.Write([]byte("query")); err != nil {
			return err
		}
		buf := make([]byte, 100)
		n, err := c.Read(buf) // a connected socket: only from B:53
		reply = string(buf[:n])
		return err
	})
	if err != nil || reply != "proxied query" {
		t.Fatalf("A's datagram to B:53: reply %q, %v; want the proxy's answer", reply, err)
	}
	if dst := <-got; dst != netip.AddrPortFrom(e.b.addr(), 53) {
		t.Errorf("the proxy saw original destination %v, want B:53", dst)
	}
}

// udpProxy answers one datagram at 127.0.0.1:port of ns's netns from
// the datagram's original destination (l7proxy's transparent UDP
// helpers, as a DNS proxy uses them), reporting that destination.
func udpProxy(t *testing.T, ns *testutil.NS, port int, got chan<- netip.AddrPort) {
	t.Helper()
	var conn *net.UDPConn
	err := ns.Do(func() (err error) {
		conn, err = l7proxy.ListenTransparentUDP(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 100)
		n, from, orig, err := l7proxy.ReadOriginal(conn, buf)
		if err != nil {
			return
		}
		got <- orig
		_ = ns.Do(func() error { return l7proxy.ReplyFrom(orig, from, append([]byte("proxied "), buf[:n]...)) })
	}()
}

// TestL7RedirectIPv6 (root, real traffic): the redirect on IPv6, B's
// ingress L7 rule enforced by the proxy listening dual-stack ([::]:port,
// found by the programs at ::1).
func TestL7RedirectIPv6(t *testing.T) {
	testutil.RequireRoot(t)
	bin := filepath.Join(testutil.BuildBinariesT(t, "membrane-proxy"), "membrane-proxy")
	l, host, nl := newTestLinux(t, LinuxConfig{TeardownDelay: -1, GatewayDevice: "mbt_gw6",
		Gateways: []netip.Addr{netip.MustParseAddr("fd00:61::1")},
		L7: L7Config{ProxyPath: bin, XDSSocket: filepath.Join(t.TempDir(), "xds.sock"), Listen: fmt.Sprintf("[::]:%d", e2eProxyPort),
			MinBackoff: 10 * time.Millisecond, MaxBackoff: 500 * time.Millisecond, StableAfter: time.Second}})
	if err := host.Do(func() error { return os.WriteFile("/proc/sys/net/ipv6/conf/default/accept_dad", []byte("0"), 0) }); err != nil {
		t.Fatal(err)
	}
	e := &l7E2E{e2eEnv: &e2eEnv{t: t, l: l, host: host, nl: nl, drops: &dropLog{}}, ev: &proxyEvents{}, rev: 1}
	e.ev.install(l)
	l.SetHooks(LinuxHooks{OnDrop: e.drops.add})
	e.a = addPod6(t, nl, 31, 3001, "fd00:61::11")
	e.b = addPod6(t, nl, 32, 3002, "fd00:61::12")
	e.c = addPod6(t, nl, 33, 3003, "fd00:61::13")
	for _, p := range []*testPod{e.a, e.b, e.c} {
		e.ipcache(p)
		e.realize(p)
	}
	httpServer(t, e.b, 80)
	k80 := policy.Key{Identity: e.a.ep.Identity, Port: 80, Proto: policy.ProtoTCP, Dir: policy.Ingress}
	m := policy.NewMapState(e.rev, true, false, []policy.Key{k80})
	m.L7 = []policy.L7Entry{{Key: k80, HTTP: []policy.HTTPRule{{Method: "GET", Path: "/public"}}}}
	e.set(e.b, m, true)
	e.enforced()
	if _, _, err := request(e.c, e.b, "GET", "/public", dropTimeout); err == nil {
		t.Errorf("C reached B:80, want its connection dropped")
	}
}

// TestL7RedirectFromHost (root, real traffic): a client on the node
// itself (identity host, as kubelet's probes) reaching B's L7 port goes
// through the proxy too: to_container hairpins the host's packets like
// a pod's.
func TestL7RedirectFromHost(t *testing.T) {
	e := newL7E2E(t)
	k80 := policy.Key{Identity: identity.ReservedHost, Port: 80, Proto: policy.ProtoTCP, Dir: policy.Ingress}
	m := policy.NewMapState(e.rev, true, false, []policy.Key{k80})
	m.L7 = []policy.L7Entry{{Key: k80, HTTP: []policy.HTTPRule{{Method: "GET", Path: "/public"}}}}
	e.set(e.b, m, true)
	host := &testPod{ns: e.host, ep: e.a.ep} // requests from the host netns (its routes to the pods)
	for _, c := range []struct {
		path string
		want int
		body string
	}{{"/public", 200, "B GET /public"}, {"/private", 403, "Access denied"}} {
		code, body, err := request(host, e.b, "GET", c.path, connectTimeout)
		if err != nil || code != c.want || !strings.Contains(body, c.body) {
			t.Errorf("host GET %s to B:80 = %d %q %v, want %d %q", c.path, code, body, err, c.want, c.body)
		}
	}
}
