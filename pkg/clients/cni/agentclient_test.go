package cni

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

func TestReadAnswer(t *testing.T) {
	for name, tc := range map[string]struct {
		raw          string
		status       int
		body, timing string
	}{
		"content-length":  {"HTTP/1.1 201 Created\r\nContent-Length: 5\r\nServer-Timing: veth;dur=0.5\r\n\r\nhello", 201, "hello", "veth;dur=0.5"},
		"chunked":         {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n", 200, "abcde", ""},
		"until EOF":       {"HTTP/1.0 404 Not Found\r\n\r\n{\"code\":\"not-found\"}", 404, `{"code":"not-found"}`, ""},
		"timing too long": {"HTTP/1.1 200 OK\r\nServer-Timing: " + strings.Repeat("a", maxTiming+1) + "\r\nContent-Length: 0\r\n\r\n", 200, "", ""},
	} {
		t.Run(name, func(t *testing.T) {
			a, err := readAnswer(bufio.NewReader(strings.NewReader(tc.raw)))
			if err != nil || a.status != tc.status || string(a.body) != tc.body || a.timing != tc.timing {
				t.Fatalf("readAnswer = %d %q (timing %q) %v; want %d %q (timing %q)", a.status, a.body, a.timing, err, tc.status, tc.body, tc.timing)
			}
		})
	}
	for _, bad := range []string{"", "SMTP 220 hi\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"} {
		if _, err := readAnswer(bufio.NewReader(strings.NewReader(bad))); err == nil {
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
			w.Header().Set("Server-Timing", "netns;dur=0.100, veth;dur=1.250")
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
	timing, err := c.attach(ctx, &models.AttachRequest{Owner: "ns/pod"}, &r)
	if err != nil || r.IPv4 == nil || r.IPv4.IP != "10.0.0.2" {
		t.Fatalf("attach = %+v, %v", r, err)
	}
	if got := parseServerTiming(timing); !slices.Equal(got, []Phase{{"netns", 100}, {"veth", 1250}}) {
		t.Fatalf("attach timing %q = %v", timing, got)
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
		a, err := readAnswer(bufio.NewReader(strings.NewReader(string(raw))))
		if err == nil && len(a.body) > maxAnswer {
			t.Fatalf("body of %d bytes accepted", len(a.body))
		}
		if len(a.timing) > maxTiming {
			t.Fatalf("Server-Timing of %d bytes kept", len(a.timing))
		}
	})
}

func TestParseServerTiming(t *testing.T) {
	for v, want := range map[string][]Phase{
		"":                                       nil,
		"netns;dur=0.109, veth;dur=0.787":        {{"netns", 109}, {"veth", 787}},
		"a;desc=\"x\";dur=2, b, c;dur=x, ;dur=1": {{"a", 2000}},
		"d;DUR=1.5;dur=9":                        {{"d", 1500}},
		"e;dur=-1, f;dur=1e12":                   nil,
	} {
		if got := parseServerTiming(v); !slices.Equal(got, want) {
			t.Errorf("parseServerTiming(%q) = %v, want %v", v, got, want)
		}
	}
}

func FuzzParseServerTiming(f *testing.F) {
	f.Add("netns;dur=0.109, veth;dur=0.787")
	f.Fuzz(func(t *testing.T, v string) {
		for _, p := range parseServerTiming(v) {
			if p.Name == "" || p.Us < 0 {
				t.Fatalf("%q gave %+v", v, p)
			}
		}
	})
}
