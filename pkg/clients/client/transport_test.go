package client

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// unixServer serves h on a unix socket and records its connections.
type unixServer struct {
	path  string
	mu    sync.Mutex
	conns []net.Conn // every accepted connection
	idle  map[net.Conn]bool
}

func startUnixServer(t *testing.T, h http.Handler) *unixServer {
	t.Helper()
	s := &unixServer{path: filepath.Join(t.TempDir(), "s.sock"), idle: map[net.Conn]bool{}}
	ln, err := net.Listen("unix", s.path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ConnState: func(c net.Conn, st http.ConnState) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if st == http.StateNew {
			s.conns = append(s.conns, c)
		}
		s.idle[c] = st == http.StateIdle
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return s
}

func (s *unixServer) accepted() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// closeIdle closes the server side of every idle connection, as an agent
// that stops (or an idle timeout) does.
func (s *unixServer) closeIdle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		n := 0
		for c, idle := range s.idle {
			if idle {
				_ = c.Close()
				delete(s.idle, c)
				n++
			}
		}
		s.mu.Unlock()
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no idle server connection to close")
		}
		time.Sleep(time.Millisecond)
	}
}

func (s *unixServer) client() *http.Client {
	return &http.Client{Transport: newConnTransport(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", s.path)
	})}
}

func get(t *testing.T, c *http.Client, method, path, body string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, "http://membrane"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read: %v", method, path, err)
	}
	return string(b)
}

func echo(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	_, _ = io.WriteString(w, r.Method+" "+r.URL.Path+" "+string(b))
}

func TestConnTransportReuse(t *testing.T) {
	s := startUnixServer(t, http.HandlerFunc(echo))
	c := s.client()
	for i, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodGet} {
		if got, want := get(t, c, m, "/v1/x", "b"), m+" /v1/x b"; got != want {
			t.Fatalf("request %d = %q, want %q", i, got, want)
		}
	}
	if n := s.accepted(); n != 1 {
		t.Errorf("sequential requests used %d connections, want 1", n)
	}
}

func TestConnTransportEmptyAndCloseAnswers(t *testing.T) {
	s := startUnixServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/close" {
			w.Header().Set("Connection", "close")
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	c := s.client()
	get(t, c, http.MethodGet, "/empty", "")
	get(t, c, http.MethodGet, "/empty", "")
	if n := s.accepted(); n != 1 {
		t.Errorf("bodyless answers used %d connections, want 1", n)
	}
	get(t, c, http.MethodGet, "/close", "")
	get(t, c, http.MethodGet, "/empty", "")
	if n := s.accepted(); n != 2 {
		t.Errorf("after Connection: close: %d connections, want 2", n)
	}
}

// TestConnTransportServerClosedIdle: a pooled connection the agent closed
// is replaced, for a POST (nothing was written) as for a GET.
func TestConnTransportServerClosedIdle(t *testing.T) {
	s := startUnixServer(t, http.HandlerFunc(echo))
	c := s.client()
	for i, m := range []string{http.MethodPost, http.MethodGet, http.MethodPut} {
		get(t, c, http.MethodGet, "/warm", "")
		s.closeIdle(t)
		if got, want := get(t, c, m, "/v1/y", "z"), m+" /v1/y z"; got != want {
			t.Fatalf("request %d after the server closed the connection = %q, want %q", i, got, want)
		}
	}
}

func TestConnTransportContext(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	s := startUnixServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	c := s.client()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://membrane/slow", strings.NewReader("x"))
	if _, err := c.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("past the deadline: %v, want context.DeadlineExceeded", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, "http://membrane/slow", nil)
	go func() {
		for s.accepted() < 2 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	if _, err := c.Do(req); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v, want context.Canceled", err)
	}
}

// TestConnTransportStream: a streamed answer holds its connection until
// it ends; a body closed early closes the connection.
func TestConnTransportStream(t *testing.T) {
	s := startUnixServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/stream" {
			echo(w, r)
			return
		}
		for i := range 3 {
			_, _ = io.WriteString(w, strings.Repeat("e", i+1)+"\n")
			w.(http.Flusher).Flush()
		}
	}))
	c := s.client()
	if got := get(t, c, http.MethodGet, "/stream", ""); got != "e\nee\neee\n" {
		t.Fatalf("stream = %q", got)
	}
	get(t, c, http.MethodGet, "/after", "")
	if n := s.accepted(); n != 1 {
		t.Errorf("a stream read to its end: %d connections, want 1", n)
	}
	resp, err := c.Get("http://membrane/stream")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	get(t, c, http.MethodGet, "/after", "")
	if n := s.accepted(); n != 2 {
		t.Errorf("a stream closed early: %d connections, want 2", n)
	}
}
