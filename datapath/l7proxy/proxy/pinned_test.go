package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// pinnedBackend starts a server on B's address with handler h (configure
// may change the server before it starts), points B's L7 rules (allow
// everything from A) at its port as revision rev, and returns its port.
func pinnedBackend(t *testing.T, r *rig, rev uint64, h http.HandlerFunc, configure func(*httptest.Server)) uint16 {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	l, err := net.Listen("tcp", "127.0.0.4:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = l
	if configure != nil {
		configure(srv)
	}
	srv.Start()
	t.Cleanup(srv.Close)
	port := netip.MustParseAddrPort(l.Addr().String()).Port()
	r.setB(rev, []policy.L7Entry{{Key: policy.Key{Identity: idA, Port: port, Proto: policy.ProtoTCP, Dir: policy.Ingress},
		HTTP: []policy.HTTPRule{{}}}})
	testutil.Eventually(t, "revision acknowledged", func() bool { return r.w.isAcked(rev) })
	return port
}

// clientA is an HTTP/1.1 client from A's address through the proxy (its
// explicit form) keeping one connection.
func clientA(r *rig) *http.Client {
	proxyURL, _ := url.Parse("http://" + r.listen)
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL), MaxIdleConnsPerHost: 1,
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).DialContext}}
}

func getBody(t *testing.T, c *http.Client, method, u string, body io.Reader) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: body: %v", method, u, err)
	}
	return resp.StatusCode, string(b)
}

// TestPinnedUpstreamReused: a client connection's requests without a
// body go over one upstream connection, through answers with and
// without bodies; a request with a body goes through the transport and
// is answered too.
func TestPinnedUpstreamReused(t *testing.T) {
	r := newRig(t)
	port := pinnedBackend(t, r, 1, func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/empty" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		b, _ := io.ReadAll(req.Body)
		io.WriteString(w, req.RemoteAddr+" "+string(b))
	}, nil)
	c := clientA(r)
	u := "http://127.0.0.4:" + itoa(port)
	var first string
	for i, path := range []string{"/a", "/empty", "/b", "/head", "/c"} {
		method := http.MethodGet
		if path == "/head" {
			method = http.MethodHead
		}
		code, body := getBody(t, c, method, u+path, nil)
		if method == http.MethodHead || path == "/empty" {
			continue
		}
		if code != 200 {
			t.Fatalf("GET %s: %d %s", path, code, body)
		}
		if i == 0 {
			first = body
		} else if body != first {
			t.Errorf("GET %s came from %q, want the first request's upstream connection %q", path, body, first)
		}
	}
	code, body := getBody(t, c, http.MethodPost, u+"/post", strings.NewReader("payload"))
	if code != 200 || !strings.HasSuffix(body, " payload") {
		t.Errorf("POST with a body: %d %q, want 200 with the body echoed", code, body)
	}
}

// TestPinnedServerClosedIdle: the server closes the kept upstream
// connection while it is idle; the client's next GET on its connection
// is sent again on a new upstream connection, as http.Transport does.
func TestPinnedServerClosedIdle(t *testing.T) {
	r := newRig(t)
	port := pinnedBackend(t, r, 1, func(w http.ResponseWriter, req *http.Request) {
		io.WriteString(w, "ok "+req.RemoteAddr)
	}, func(s *httptest.Server) { s.Config.IdleTimeout = 50 * time.Millisecond })
	c := clientA(r)
	u := "http://127.0.0.4:" + itoa(port) + "/x"
	code, first := getBody(t, c, http.MethodGet, u, nil)
	if code != 200 {
		t.Fatalf("first GET: %d %s", code, first)
	}
	time.Sleep(300 * time.Millisecond) // the server's idle timeout passes
	code, second := getBody(t, c, http.MethodGet, u, nil)
	if code != 200 || !strings.HasPrefix(second, "ok ") {
		t.Fatalf("GET after the server closed the idle upstream connection: %d %q, want 200", code, second)
	}
	if second == first {
		t.Errorf("second GET came over the closed connection %q", first)
	}
}

// TestPinnedClientGone: a client that goes away in the middle of an
// endless answer takes its upstream connection with it (the proxy must
// not drain the answer).
func TestPinnedClientGone(t *testing.T) {
	r := newRig(t)
	var cancelled atomic.Bool
	port := pinnedBackend(t, r, 1, func(w http.ResponseWriter, req *http.Request) {
		chunk := []byte(strings.Repeat("x", 1024))
		for {
			if _, err := w.Write(chunk); err != nil {
				cancelled.Store(true)
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-req.Context().Done():
				cancelled.Store(true)
				return
			case <-time.After(time.Millisecond):
			}
		}
	}, nil)
	c := clientA(r)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.4:"+itoa(port)+"/stream", nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 16<<10)); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	c.CloseIdleConnections()
	testutil.Eventually(t, "the server's answer ended with the client", cancelled.Load)
}

func itoa(p uint16) string { return strconv.Itoa(int(p)) }
