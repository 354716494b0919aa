package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
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

// buildProxy builds cmd/membrane-proxy into a temporary directory.
func buildProxy(t testing.TB) string {
	t.Helper()
	return filepath.Join(testutil.BuildBinariesT(t, "membrane-proxy"), "membrane-proxy")
}

func freePort(t testing.TB, host string) string {
	t.Helper()
	l, err := net.Listen("tcp", host+":0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

type waits struct {
	mu    sync.Mutex
	acked map[uint64]bool
	nack  map[uint64]string
}

func (w *waits) tracker() *l7proxy.Tracker {
	w.acked, w.nack = map[uint64]bool{}, map[uint64]string{}
	return l7proxy.NewTracker(func(ep, rev uint64) {
		w.mu.Lock()
		w.acked[rev] = true
		w.mu.Unlock()
	}, func(ep, rev uint64, reason string) {
		w.mu.Lock()
		w.nack[rev] = reason
		w.mu.Unlock()
	})
}

func (w *waits) isAcked(rev uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.acked[rev]
}

func (w *waits) nacked(rev uint64) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.nack[rev]
}

type rig struct {
	t      testing.TB
	srv    *l7proxy.Server
	w      *waits
	sup    *l7proxy.Supervisor
	listen string
	b      string // backend address (endpoint B)

	mu      sync.Mutex
	seen    []string      // the paths B received, as sent on the wire
	headers []http.Header // and the headers of each request
}

// lastHeaders returns the headers of the last request B received.
func (r *rig) lastHeaders() http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.headers) == 0 {
		return nil
	}
	return r.headers[len(r.headers)-1]
}

// received returns the paths B received.
func (r *rig) received() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.seen...)
}

const idA, idB, idC identity.NumericIdentity = 300, 301, 302

// newRig starts the xDS server, the proxy process under a supervisor and
// a backend "B" on 127.0.0.4; A is 127.0.0.2, C 127.0.0.3 (loopback).
// Root: the proxy's listener is transparent and its upstream connections
// marked (CAP_NET_ADMIN).
func newRig(t testing.TB, extra ...string) *rig {
	testutil.RequireRoot(t)
	bin := buildProxy(t)
	return newRigWith(t, func(r *rig, xds string) {
		r.sup = &l7proxy.Supervisor{Path: bin, Args: append([]string{"--xds", xds, "--listen", r.listen}, extra...),
			MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, StableAfter: time.Second, Log: slog.Default()}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = r.sup.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
	})
}

// newRigInProcess is newRig with the proxy running in the test's own
// process (Run), so that -cpuprofile sees it.
func newRigInProcess(t testing.TB) *rig {
	testutil.RequireRoot(t)
	return newRigWith(t, func(r *rig, xds string) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := Run(ctx, Config{XDS: xds, Listen: r.listen, Log: slog.Default()}); err != nil {
				t.Error(err)
			}
		}()
		t.Cleanup(func() { cancel(); <-done })
	})
}

// newRigWith sets up the xDS server, backend B and the ipcache around a
// proxy that start runs on r.listen, subscribed to xds.
func newRigWith(t testing.TB, start func(r *rig, xds string)) *rig {
	dir := t.TempDir()
	r := &rig{t: t, w: &waits{}}
	srv, err := l7proxy.NewServer(filepath.Join(dir, "xds.sock"), r.w.tracker(), slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	r.srv = srv
	backend := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.seen = append(r.seen, req.RequestURI)
		r.headers = append(r.headers, req.Header.Clone())
		r.mu.Unlock()
		fmt.Fprintf(w, "B %s %s", req.Method, req.URL.Path)
	}))
	l, err := net.Listen("tcp", "127.0.0.4:0")
	if err != nil {
		t.Fatal(err)
	}
	backend.Listener = l
	backend.Start()
	t.Cleanup(backend.Close)
	r.b = l.Addr().String()
	r.listen = freePort(t, "127.0.0.1")
	start(r, filepath.Join(dir, "xds.sock"))
	if _, err := srv.SetIPCache(l7proxy.IPCache{Entries: map[netip.Prefix]identity.NumericIdentity{
		netip.MustParsePrefix("127.0.0.2/32"): idA, netip.MustParsePrefix("127.0.0.3/32"): idC,
		netip.MustParsePrefix("127.0.0.4/32"): idB,
	}}); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rig) backendPort() uint16 {
	return netip.MustParseAddrPort(r.b).Port()
}

// setB publishes B's L7 entries as revision rev and registers the wait.
func (r *rig) setB(rev uint64, l7 []policy.L7Entry) {
	r.t.Helper()
	v, err := r.srv.SetEndpoint(1, &l7proxy.EndpointPolicy{ID: 1, IPs: []netip.Addr{netip.MustParseAddr("127.0.0.4")}, L7: l7})
	if err != nil {
		r.t.Fatal(err)
	}
	wait, err := r.srv.Tracker().Wait(1, rev, v)
	if err != nil {
		r.t.Fatal(err)
	}
	if !wait {
		r.w.mu.Lock()
		r.w.acked[rev] = true
		r.w.mu.Unlock()
	}
}

// do sends method path to B through the proxy from address from.
func (r *rig) do(from, method, path string) (int, string) {
	r.t.Helper()
	proxyURL, _ := url.Parse("http://" + r.listen)
	tr := &http.Transport{Proxy: http.ProxyURL(proxyURL), DisableKeepAlives: true,
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}).DialContext}
	req, _ := http.NewRequest(method, "http://"+r.b+path, nil)
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func (r *rig) l7(peer identity.NumericIdentity, rules ...policy.HTTPRule) []policy.L7Entry {
	return []policy.L7Entry{{Key: policy.Key{Identity: peer, Port: r.backendPort(), Proto: policy.ProtoTCP, Dir: policy.Ingress}, HTTP: rules}}
}

// TestProxyEnforcesAndRestarts: A may GET /public but not /private nor
// POST (403 from the proxy), C gets nothing; each policy version is
// acknowledged by the proxy process; a killed proxy is restarted and
// enforces again; an allow-all rule restores everything for A.
func TestProxyEnforcesAndRestarts(t *testing.T) {
	r := newRig(t)
	r.setB(1, r.l7(idA, policy.HTTPRule{Method: "GET", Path: "/public"}))
	testutil.Eventually(t, "revision 1 acknowledged", func() bool { return r.w.isAcked(1) })
	check := func() {
		t.Helper()
		if code, body := r.do("127.0.0.2", "GET", "/public"); code != 200 || body != "B GET /public" {
			t.Errorf("A GET /public = %d %q, want 200 from B", code, body)
		}
		if code, body := r.do("127.0.0.2", "GET", "/private"); code != 403 || !strings.Contains(body, "Access denied") {
			t.Errorf("A GET /private = %d %q, want 403 from the proxy", code, body)
		}
		if code, _ := r.do("127.0.0.2", "POST", "/public"); code != 403 {
			t.Errorf("A POST /public = %d, want 403", code)
		}
		if code, _ := r.do("127.0.0.3", "GET", "/public"); code != 403 {
			t.Errorf("C GET /public = %d, want 403", code)
		}
	}
	check()

	pid := r.sup.Status().PID
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "proxy restarted", func() bool { s := r.sup.Status(); return s.PID != 0 && s.PID != pid && s.Restarts == 1 })
	// A revision published while the proxy was down (or is starting) is
	// acknowledged by the restarted proxy.
	r.setB(2, r.l7(idA, policy.HTTPRule{Method: "GET", Path: "/public"}))
	testutil.Eventually(t, "revision 2 acknowledged by the restarted proxy", func() bool { return r.w.isAcked(2) })
	check()

	r.setB(3, r.l7(idA, policy.HTTPRule{}))
	testutil.Eventually(t, "revision 3 acknowledged", func() bool { return r.w.isAcked(3) })
	if code, _ := r.do("127.0.0.2", "POST", "/private"); code != 200 {
		t.Errorf("allow-all: A POST /private = %d, want 200", code)
	}
	if code, _ := r.do("127.0.0.3", "GET", "/public"); code != 403 {
		t.Errorf("allow-all for A: C GET = %d, want 403", code)
	}
}

// TestProxyRejects: a proxy that rejects its configuration fails the
// wait with the proxy's reason (a NACK) and acknowledges nothing.
func TestProxyRejects(t *testing.T) {
	r := newRig(t, "--reject-config")
	r.setB(1, r.l7(idA, policy.HTTPRule{Path: "/public"}))
	testutil.Eventually(t, "revision 1 rejected", func() bool { return r.w.nacked(1) != "" })
	if r.w.isAcked(1) || !strings.Contains(r.w.nacked(1), "reject") {
		t.Errorf("acked=%v nack=%q", r.w.isAcked(1), r.w.nacked(1))
	}
	if st := r.srv.Tracker().Status(); st.Nacks == 0 || st.Acked != 0 {
		t.Errorf("tracker status %+v", st)
	}
}

// TestProxyWaitPending: with no proxy running, a wait stays pending
// (the endpoint actor's timeout then makes it visible).
func TestProxyWaitPending(t *testing.T) {
	w := &waits{}
	srv, err := l7proxy.NewServer(filepath.Join(t.TempDir(), "xds.sock"), w.tracker(), slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	v, err := srv.SetEndpoint(7, &l7proxy.EndpointPolicy{ID: 7})
	if err != nil {
		t.Fatal(err)
	}
	if wait, err := srv.Tracker().Wait(7, 1, v); !wait || err != nil {
		t.Fatalf("Wait = %v, %v; want a pending wait", wait, err)
	}
	if st := srv.Tracker().Status(); st.Pending != 1 {
		t.Errorf("status %+v, want 1 pending", st)
	}
	if _, err := os.Stat(srv.Path()); err != nil {
		t.Errorf("socket: %v", err)
	}
}
