package cni

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

func TestReadAnswer(t *testing.T) {
	for name, tc := range map[string]struct {
		raw    string
		status int
		body   string
	}{
		"content-length": {"HTTP/1.1 201 Created\r\nContent-Length: 5\r\n\r\nhello", 201, "hello"},
		"chunked":        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n", 200, "abcde"},
		"until EOF":      {"HTTP/1.0 404 Not Found\r\n\r\n{\"code\":\"not-found\"}", 404, `{"code":"not-found"}`},
	} {
		t.Run(name, func(t *testing.T) {
			status, body, _, err := readAnswer(bufio.NewReader(strings.NewReader(tc.raw)))
			if err != nil || status != tc.status || string(body) != tc.body {
				t.Fatalf("readAnswer = %d %q %v; want %d %q", status, body, err, tc.status, tc.body)
			}
		})
	}
	for _, bad := range []string{"", "SMTP 220 hi\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"} {
		if _, _, _, err := readAnswer(bufio.NewReader(strings.NewReader(bad))); err == nil {
			t.Errorf("readAnswer(%q) succeeded", bad)
		}
	}
}

// TestAgentClientAgainstNetHTTP: the small client talks to a net/http
// server as the agent's is, including large (chunked) answers and errors.
func TestAgentClientAgainstNetHTTP(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 100_000)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/status":
			w.Write([]byte(`{"state":"ok","message":"` + big + `"}`)) // no length: chunked
		case "/v1/attach":
			var req models.AttachRequest
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Owner != "ns/pod" || r.Method != "POST" {
				w.WriteHeader(400)
				return
			}
			w.WriteHeader(201)
			w.Write([]byte(`{"endpoint-id":3,"ipv4":{"ip":"10.0.0.2","gateway":"10.0.0.1"}}`))
		default:
			w.WriteHeader(404)
			w.Write([]byte(`{"code":"not-found","message":"nope"}`))
		}
	})}
	var conns atomic.Int32
	srv.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	c := &agentClient{socket: sock}
	defer c.close()
	ctx := context.Background()
	st, err := c.status(ctx)
	if err != nil || st.State != "ok" || len(st.Message) != len(big) {
		t.Fatalf("status = %v (message %d bytes)", err, len(st.Message))
	}
	var r models.AttachResponse
	if err := c.attach(ctx, &models.AttachRequest{Owner: "ns/pod"}, &r); err != nil || r.IPv4 == nil || r.IPv4.IP != "10.0.0.2" {
		t.Fatalf("attach = %+v, %v", r, err)
	}
	if _, err := c.endpointGet(ctx, "container-id:x"); !isNotFound(err) || !isCode(err, "not-found") {
		t.Fatalf("endpointGet = %v, want the 404", err)
	}
	if err := c.endpointDeleteAttachment(ctx, "x", "eth0"); !isNotFound(err) {
		t.Fatalf("endpointDeleteAttachment = %v", err)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for 4 requests, want 1 kept alive", n)
	}
	gone := &agentClient{socket: filepath.Join(t.TempDir(), "none.sock")}
	var op *net.OpError
	if err := gone.gc(ctx, nil); !errors.As(err, &op) || !unreachable(err) {
		t.Fatalf("gc against no agent = %v, want a dial error", err)
	}
}

func FuzzReadAnswer(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		_, body, _, err := readAnswer(bufio.NewReader(strings.NewReader(string(raw))))
		if err == nil && len(body) > maxAnswer {
			t.Fatalf("body of %d bytes accepted", len(body))
		}
	})
}
