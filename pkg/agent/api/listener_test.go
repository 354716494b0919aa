package api_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/api"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// heldConn is a raw connection that made one request and stays open,
// idle, holding one of its listener's slots.
type heldConn struct {
	net.Conn
	br *bufio.Reader
}

// holdConn dials network/addr and sends GET /v1/healthz with Host host;
// it fails the test unless the answer is a 200.
func holdConn(tb testing.TB, network, addr, host string) *heldConn {
	tb.Helper()
	c, err := net.Dial(network, addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	h := &heldConn{Conn: c, br: bufio.NewReader(c)}
	if r := h.get(tb, host); r.status != http.StatusOK {
		tb.Fatalf("held connection: GET /v1/healthz = %d %s", r.status, r.body)
	}
	return h
}

// get sends GET /v1/healthz on the connection and reads the answer.
func (h *heldConn) get(tb testing.TB, host string) response {
	tb.Helper()
	_ = h.SetDeadline(time.Now().Add(apiWait))
	if _, err := h.Write([]byte("GET /v1/healthz HTTP/1.1\r\nHost: " + host + "\r\n\r\n")); err != nil {
		tb.Fatal(err)
	}
	return readAnswer(tb, h.br)
}

// tryGet is get for a connection that may be refused (at the cap: the
// agent answers 503 and closes, possibly before the request is written):
// the status, 0 when the request or its answer failed.
func (h *heldConn) tryGet(host string) int {
	_ = h.SetDeadline(time.Now().Add(apiWait))
	if _, err := h.Write([]byte("GET /v1/healthz HTTP/1.1\r\nHost: " + host + "\r\n\r\n")); err != nil {
		return 0
	}
	resp, err := http.ReadResponse(h.br, nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func readAnswer(tb testing.TB, br *bufio.Reader) response {
	tb.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		tb.Fatalf("no answer: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// expectRefused dials network/addr without sending anything: a listener
// at its cap answers 503 too-many-connections and closes.
func expectRefused(tb testing.TB, network, addr string) {
	tb.Helper()
	c, err := net.Dial(network, addr)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(apiWait))
	br := bufio.NewReader(c)
	expectError(tb, readAnswer(tb, br), http.StatusServiceUnavailable, api.CodeTooManyConnections, "at most")
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		tb.Fatalf("refused connection left open: read %v", err)
	}
}

// TestHTTPConnectionCap: idle connections beyond the TCP listener's cap
// are refused at once, the unix socket keeps answering, and a closed
// connection frees its slot (issue 18.2).
func TestHTTPConnectionCap(t *testing.T) {
	const maxConns = 4
	e := startHandlersAgent(t, func(c *agent.Config) {
		c.HTTPAddr = "127.0.0.1:0"
		c.API.MaxHTTPConns = maxConns
	})
	addr := e.agent.HTTPAddr()
	held := make([]*heldConn, maxConns)
	for i := range held {
		held[i] = holdConn(t, "tcp", addr, "127.0.0.1")
	}
	for range 5 * maxConns {
		expectRefused(t, "tcp", addr)
	}
	if r := e.do(t, "GET", "/v1/status", ""); r.status != http.StatusOK {
		t.Fatalf("socket GET /v1/status = %d %s", r.status, r.body)
	}
	e.createPod(t, "c-cap", "ns", "cap")
	for _, h := range held { // the held connections still work
		if r := h.get(t, "127.0.0.1"); r.status != http.StatusOK {
			t.Fatalf("held connection: %d %s", r.status, r.body)
		}
	}
	held[0].Close()
	testutil.Eventually(t, "a slot freed by a closed connection", func() bool {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false
		}
		defer c.Close()
		h := &heldConn{Conn: c, br: bufio.NewReader(c)}
		return h.tryGet("127.0.0.1") == http.StatusOK
	})
}

// TestSocketConnectionCap: the unix socket has its own cap.
func TestSocketConnectionCap(t *testing.T) {
	const maxConns = 3
	e := startHandlersAgent(t, func(c *agent.Config) { c.API.MaxConns = maxConns })
	e.http.CloseIdleConnections()
	e.client.Close()
	held := make([]*heldConn, maxConns)
	for i := range held {
		held[i] = holdConn(t, "unix", e.socket, "membrane")
	}
	expectRefused(t, "unix", e.socket)
	held[0].Close()
	testutil.Eventually(t, "a socket slot freed", func() bool {
		c, err := net.Dial("unix", e.socket)
		if err != nil {
			return false
		}
		defer c.Close()
		h := &heldConn{Conn: c, br: bufio.NewReader(c)}
		return h.tryGet("membrane") == http.StatusOK
	})
}

// TestIdleTimeout: a keep-alive connection left idle is closed by the
// agent.
func TestIdleTimeout(t *testing.T) {
	e := startHandlersAgent(t, func(c *agent.Config) {
		c.HTTPAddr = "127.0.0.1:0"
		c.API.IdleTimeout = 100 * time.Millisecond
	})
	for _, h := range []*heldConn{holdConn(t, "tcp", e.agent.HTTPAddr(), "localhost"), holdConn(t, "unix", e.socket, "membrane")} {
		_ = h.SetReadDeadline(time.Now().Add(apiWait))
		if _, err := h.br.ReadByte(); !errors.Is(err, io.EOF) {
			t.Fatalf("idle %s connection: read %v, want EOF (closed by the agent)", h.LocalAddr().Network(), err)
		}
	}
}

// TestHostHeader: the TCP listener answers only loopback hosts and the
// configured ones (DNS rebinding, issue 18.13); the socket answers any.
func TestHostHeader(t *testing.T) {
	e := startHandlersAgent(t, func(c *agent.Config) {
		c.HTTPAddr = "127.0.0.1:0"
		c.API.AllowedHosts = []string{"node1.example", "10.0.0.5"}
	})
	addr := e.agent.HTTPAddr()
	tests := []struct {
		host string
		ok   bool
	}{
		{"127.0.0.1", true}, {addr, true}, {"localhost:9890", true}, {"LOCALHOST", true}, {"[::1]:9890", true}, {"127.1.2.3", true},
		{"node1.example", true}, {"NODE1.example:80", true}, {"10.0.0.5:9890", true},
		{"evil.example", false}, {"evil.example:9890", false}, {"localhost.evil.example", false}, {"10.0.0.6", false},
		{"node1.example.evil", false}, {"", false},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			h := &heldConn{Conn: c, br: bufio.NewReader(c)}
			r := h.get(t, tt.host)
			if tt.ok {
				if r.status != http.StatusOK {
					t.Fatalf("Host %q: %d %s", tt.host, r.status, r.body)
				}
				return
			}
			expectError(t, r, http.StatusForbidden, api.CodeHostNotAllowed, "Host")
		})
	}
	sock := holdConn(t, "unix", e.socket, "membrane") // any Host on the socket
	if r := sock.get(t, "evil.example"); r.status != http.StatusOK {
		t.Fatalf("socket with Host evil.example: %d %s", r.status, r.body)
	}
}
