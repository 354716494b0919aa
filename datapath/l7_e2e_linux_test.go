package datapath

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

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

// viaProxy sends method path to dst:80 from pod p through the proxy at
// proxyAddr; it returns the status code and body.
func viaProxy(p, dst *testPod, proxyAddr, method, path string) (int, string, error) {
	pu, _ := url.Parse("http://" + proxyAddr)
	tr := &http.Transport{Proxy: http.ProxyURL(pu), DialContext: dialFrom(p, connectTimeout), DisableKeepAlives: true}
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

// TestL7ProxyTraffic (root, real traffic between pod netns): B's ingress
// policy lets A GET /public on port 80 through the proxy process the
// datapath runs in its host netns; /private and POST get 403 from the
// proxy, C gets 403; A's direct connection to B:80 (around the proxy) is
// dropped by BPF. Killing the proxy: it is restarted, acknowledges the
// configuration and enforces again. Replacing the L7 rule by an L4 rule
// restores direct connections.
//
// The pods address the proxy explicitly (an HTTP forward proxy on the
// gateway address): the BPF programs do not redirect transparently yet.
func TestL7ProxyTraffic(t *testing.T) {
	testutil.RequireRoot(t)
	bin := filepath.Join(t.TempDir(), "membrane-proxy")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/membrane-proxy").CombinedOutput(); err != nil {
		t.Fatalf("build proxy: %v\n%s", err, out)
	}
	proxyAddr := netip.AddrPortFrom(e2eGateway, 15001).String()
	cfg := LinuxConfig{L7: L7Config{ProxyPath: bin, XDSSocket: filepath.Join(t.TempDir(), "xds.sock"), Listen: proxyAddr,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 500 * time.Millisecond, StableAfter: time.Second}}
	e := newE2E(t, cfg)
	var ev proxyEvents
	ev.install(e.l)
	httpServer(t, e.b, 80)
	e.mustTalk(e.a, e.b, 8080) // no policy yet

	rev := uint64(1)
	setB := func(m *policy.MapState, wantWait bool) {
		t.Helper()
		rev++
		e.b.ep.Policy = m
		r, err := e.l.Realize(context.Background(), e.b.ep, rev)
		if err != nil {
			t.Fatalf("Realize B revision %d: %v", rev, err)
		}
		if wantWait != (len(r.ProxyWaits) == 1) {
			t.Fatalf("revision %d: ProxyWaits %v, want a wait: %v", rev, r.ProxyWaits, wantWait)
		}
		if wantWait {
			waitFor(t, fmt.Sprintf("revision %d acknowledged", rev), func() bool { return ev.acked(rev) })
		}
	}
	a := e.a.ep.Identity
	k80 := policy.Key{Identity: a, Port: 80, Proto: policy.ProtoTCP, Dir: policy.Ingress}
	l7 := func() *policy.MapState {
		m := policy.NewMapState(rev, true, false, []policy.Key{k80})
		m.L7 = []policy.L7Entry{{Key: k80, HTTP: []policy.HTTPRule{{Method: "GET", Path: "/public"}}}}
		return m
	}
	expect := func(from *testPod, method, path string, want int) {
		t.Helper()
		code, body, err := viaProxy(from, e.b, proxyAddr, method, path)
		if err != nil || code != want {
			t.Errorf("endpoint %d %s %s via proxy = %d %q %v, want %d", from.ep.ID, method, path, code, body, err, want)
		}
	}
	enforced := func() {
		t.Helper()
		expect(e.a, "GET", "/public", 200)
		expect(e.a, "GET", "/private", 403)
		expect(e.a, "POST", "/public", 403)
		expect(e.c, "GET", "/public", 403)
		if err := e.a.tcpConnect(e.b, 80, dropTimeout); err == nil {
			t.Errorf("A connected to B:80 around the proxy")
		}
	}
	setB(l7(), true)
	enforced()

	pid := e.l.L7Status().Process.PID
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the proxy restarted", func() bool { s := e.l.L7Status().Process; return s.PID != 0 && s.PID != pid })
	setB(l7(), true) // a regeneration after the restart is acknowledged by the new process
	enforced()

	setB(policy.NewMapState(rev, true, false, []policy.Key{k80}), true) // L7 withdrawn: plain L4
	if err := e.a.tcpConnect(e.b, 80, connectTimeout); err != nil {
		t.Errorf("L4 rule: A -> B:80: %v, want a connection", err)
	}
	if err := e.c.tcpConnect(e.b, 80, dropTimeout); err == nil {
		t.Errorf("L4 rule: C connected to B:80")
	}
}

// tcpConnect opens (and closes) a TCP connection from p to dst:port.
func (p *testPod) tcpConnect(dst *testPod, port int, timeout time.Duration) error {
	c, err := dialFrom(p, timeout)(context.Background(), "tcp", netip.AddrPortFrom(dst.addr(), uint16(port)).String())
	if err == nil {
		c.Close()
	}
	return err
}
