package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// seen is one request the fake agent received.
type seen struct {
	method, rawPath, query, body string
}

// fakeAgent serves canned answers on a unix socket and records requests.
type fakeAgent struct {
	mu       sync.Mutex
	requests []seen
	header   http.Header // of the last request
	status   int
	body     string
	ctype    string
}

func (f *fakeAgent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.requests = append(f.requests, seen{r.Method, r.URL.EscapedPath(), r.URL.RawQuery, string(b)})
	f.header = r.Header.Clone()
	status, body, ctype := f.status, f.body, f.ctype
	f.mu.Unlock()
	if ctype != "" {
		w.Header().Set("Content-Type", ctype)
	}
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

// answer sets the next answers.
func (f *fakeAgent) answer(status int, body string) {
	f.mu.Lock()
	f.status, f.body, f.ctype = status, body, "application/json"
	f.mu.Unlock()
}

func (f *fakeAgent) last(tb testing.TB) seen {
	tb.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.requests) == 0 {
		tb.Fatalf("no request reached the agent")
	}
	return f.requests[len(f.requests)-1]
}

// startFakeAgent serves f on a socket and returns a client for it.
func startFakeAgent(tb testing.TB) (*fakeAgent, *client.Client, string) {
	tb.Helper()
	socket := filepath.Join(tb.TempDir(), "c.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		tb.Fatal(err)
	}
	f := &fakeAgent{status: 200, body: "{}", ctype: "application/json"}
	srv := &http.Server{Handler: f}
	go func() { _ = srv.Serve(l) }()
	c := client.New(socket)
	tb.Cleanup(func() {
		c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return f, c, socket
}

func bgCtx(tb testing.TB) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

// TestRequestHeaders checks the headers the client sends: a JSON
// Content-Type with a body, none without, and no Accept-Encoding (the
// agent never compresses).
func TestRequestHeaders(t *testing.T) {
	f, c, _ := startFakeAgent(t)
	ctx := bgCtx(t)
	tests := []struct {
		name  string
		call  func() error
		ctype []string
	}{
		{"with a body", func() error { _, err := c.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{}); return err }, []string{"application/json"}},
		{"without a body", func() error { _, err := c.EndpointRegenerate(ctx, "7"); return err }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f.answer(200, `{"id":7}`)
			if err := tt.call(); err != nil {
				t.Fatal(err)
			}
			f.mu.Lock()
			h := f.header
			f.mu.Unlock()
			if got := h.Values("Content-Type"); fmt.Sprint(got) != fmt.Sprint(tt.ctype) {
				t.Errorf("Content-Type %q, want %q", got, tt.ctype)
			}
			if got := h.Values("Accept-Encoding"); len(got) != 0 {
				t.Errorf("Accept-Encoding %q sent", got)
			}
		})
	}
}

func TestRequests(t *testing.T) {
	f, c, _ := startFakeAgent(t)
	ctx := bgCtx(t)
	tests := []struct {
		name   string
		answer string
		call   func() error
		want   seen
		check  func(t *testing.T, s seen)
	}{
		{"healthz", `{"status":"ok"}`, func() error { return c.Healthz(ctx) }, seen{"GET", "/v1/healthz", "", ""}, nil},
		{"status", `{"state":"ok"}`, func() error { _, err := c.Status(ctx); return err }, seen{"GET", "/v1/status", "", ""}, nil},
		{"create", `{"id":3}`, func() error {
			ep, err := c.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{ContainerID: "abc", SyncBuild: true})
			if err == nil && ep.ID != 3 {
				err = fmt.Errorf("decoded ID %d", ep.ID)
			}
			return err
		}, seen{"PUT", "/v1/endpoint/0", "", ""}, func(t *testing.T, s seen) {
			var req models.EndpointChangeRequest
			if err := json.Unmarshal([]byte(s.body), &req); err != nil || req.ContainerID != "abc" || !req.SyncBuild {
				t.Errorf("body %s", s.body)
			}
		}},
		{"get by pod escapes the slash", `{"id":4}`, func() error { _, err := c.EndpointGet(ctx, "pod-name:ns/pod"); return err },
			seen{"GET", "/v1/endpoint/pod-name:ns%2Fpod", "", ""}, nil},
		{"get by container", `{"id":4}`, func() error { _, err := c.EndpointGet(ctx, "container-id:abc"); return err },
			seen{"GET", "/v1/endpoint/container-id:abc", "", ""}, nil},
		{"list", `[{"id":1},{"id":2}]`, func() error {
			eps, err := c.EndpointList(ctx, url.Values{"namespace": {"ns"}, "label": {"k8s:a=b"}})
			if err == nil && len(eps) != 2 {
				err = fmt.Errorf("decoded %d endpoints", len(eps))
			}
			return err
		}, seen{"GET", "/v1/endpoint", "label=k8s%3Aa%3Db&namespace=ns", ""}, nil},
		{"list without filter", `[]`, func() error { _, err := c.EndpointList(ctx, nil); return err },
			seen{"GET", "/v1/endpoint", "", ""}, nil},
		{"delete", `{}`, func() error { return c.EndpointDelete(ctx, "7") }, seen{"DELETE", "/v1/endpoint/7", "", ""}, nil},
		{"delete by container", `{"deleted":[7]}`, func() error { return c.EndpointDeleteByContainer(ctx, "abc") },
			seen{"DELETE", "/v1/endpoint", "", `{"container-id":"abc"}`}, nil},
		{"patch labels", `{"id":7}`, func() error {
			_, err := c.EndpointPatchLabels(ctx, "7", []string{"k8s:a=b"}, []string{"k8s:c"})
			return err
		},
			seen{"PATCH", "/v1/endpoint/7/labels", "", `{"add":["k8s:a=b"],"delete":["k8s:c"]}`}, nil},
		{"regenerate", `{"id":7}`, func() error { _, err := c.EndpointRegenerate(ctx, "pod-name:a/b"); return err },
			seen{"POST", "/v1/endpoint/pod-name:a%2Fb/regenerate", "", ""}, nil},
		{"health", `{"id":7,"healthy":true}`, func() error { _, err := c.EndpointHealth(ctx, "7"); return err },
			seen{"GET", "/v1/endpoint/7/healthz", "", ""}, nil},
		{"allocate", `{"address":{"ipv4":"10.0.0.2"}}`, func() error {
			r, err := c.IPAMAllocate(ctx, "ipv4", "ns/pod")
			if err == nil && r.Address.IPv4 != "10.0.0.2" {
				err = fmt.Errorf("decoded %+v", r.Address)
			}
			return err
		}, seen{"POST", "/v1/ipam", "family=ipv4&owner=ns%2Fpod", ""}, nil},
		{"allocate any family", `{"address":{}}`, func() error { _, err := c.IPAMAllocate(ctx, "", ""); return err },
			seen{"POST", "/v1/ipam", "", ""}, nil},
		{"allocate family only", `{"address":{}}`, func() error { _, err := c.IPAMAllocate(ctx, "ipv6", ""); return err },
			seen{"POST", "/v1/ipam", "family=ipv6", ""}, nil},
		{"allocate owner only", `{"address":{}}`, func() error { _, err := c.IPAMAllocate(ctx, "", "a b&c=d/é"); return err },
			seen{"POST", "/v1/ipam", url.Values{"owner": {"a b&c=d/é"}}.Encode(), ""}, nil},
		{"allocate escaped", `{"address":{}}`, func() error { _, err := c.IPAMAllocate(ctx, "ip v4", "x+y"); return err },
			seen{"POST", "/v1/ipam", url.Values{"family": {"ip v4"}, "owner": {"x+y"}}.Encode(), ""}, nil},
		{"release", `{}`, func() error { return c.IPAMRelease(ctx, "10.0.0.2") }, seen{"DELETE", "/v1/ipam/10.0.0.2", "", ""}, nil},
		{"ipam status", `{}`, func() error { _, err := c.IPAMStatus(ctx); return err }, seen{"GET", "/v1/ipam", "", ""}, nil},
		{"identities", `[]`, func() error { _, err := c.Identities(ctx); return err }, seen{"GET", "/v1/identity", "", ""}, nil},
		{"identity", `{"id":300}`, func() error { _, err := c.Identity(ctx, 300); return err }, seen{"GET", "/v1/identity/300", "", ""}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f.answer(200, tt.answer)
			if err := tt.call(); err != nil {
				t.Fatalf("call: %v", err)
			}
			got := f.last(t)
			if got.method != tt.want.method || got.rawPath != tt.want.rawPath || got.query != tt.want.query {
				t.Errorf("request %s %s ?%s, want %s %s ?%s", got.method, got.rawPath, got.query, tt.want.method, tt.want.rawPath, tt.want.query)
			}
			if tt.want.body != "" && strings.TrimSpace(got.body) != tt.want.body {
				t.Errorf("body %s, want %s", got.body, tt.want.body)
			}
			if tt.check != nil {
				tt.check(t, got)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	f, c, _ := startFakeAgent(t)
	ctx := bgCtx(t)
	tests := []struct {
		name        string
		status      int
		body, ctype string
		wantStatus  int
		wantCode    string
		wantMessage string
		notFound    bool
	}{
		{"json error", 404, `{"code":"not-found","message":"endpoint 9 not found"}`, "application/json", 404, "not-found", "endpoint 9 not found", true},
		{"conflict", 409, `{"code":"conflict","message":"dup"}`, "application/json", 409, "conflict", "dup", false},
		{"plain text", 502, "bad gateway", "text/plain", 502, "http-502", "bad gateway", false},
		{"json without code", 500, `{"message":"x"}`, "application/json", 500, "http-500", `{"message":"x"}`, false},
		{"empty body", 503, "", "", 503, "http-503", "", false},
		{"plain 404", 404, "404 page not found", "text/plain", 404, "http-404", "404 page not found", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f.mu.Lock()
			f.status, f.body, f.ctype = tt.status, tt.body, tt.ctype
			f.mu.Unlock()
			_, err := c.EndpointGet(ctx, "9")
			var ae *client.APIError
			if !errors.As(err, &ae) {
				t.Fatalf("error %v (%T), want *client.APIError", err, err)
			}
			if ae.Status != tt.wantStatus || ae.Code != tt.wantCode || ae.Message != tt.wantMessage {
				t.Errorf("APIError %+v, want %d %s %q", ae, tt.wantStatus, tt.wantCode, tt.wantMessage)
			}
			if client.IsNotFound(err) != tt.notFound {
				t.Errorf("IsNotFound = %v", !tt.notFound)
			}
			if !client.IsCode(fmt.Errorf("wrapped: %w", err), tt.wantCode) {
				t.Errorf("IsCode through a wrap = false")
			}
			if !strings.Contains(ae.Error(), fmt.Sprint(tt.wantStatus)) || !strings.Contains(ae.Error(), tt.wantCode) {
				t.Errorf("Error() = %q", ae.Error())
			}
		})
	}
	t.Run("undecodable success", func(t *testing.T) {
		f.answer(200, "not json")
		_, err := c.EndpointGet(ctx, "9")
		var ae *client.APIError
		if err == nil || errors.As(err, &ae) {
			t.Fatalf("error %v, want a decode error", err)
		}
	})
	t.Run("helpers on other errors", func(t *testing.T) {
		for _, err := range []error{nil, errors.New("x"), context.Canceled} {
			if client.IsNotFound(err) || client.IsCode(err, "not-found") {
				t.Errorf("helpers match %v", err)
			}
		}
	})
}

// TestStatusWhileStarting: Status documents that a 503 while the agent
// starts comes with the body decoded into the result.
func TestStatusWhileStarting(t *testing.T) {
	f, c, _ := startFakeAgent(t)
	f.answer(503, `{"state":"starting","message":"restoring endpoints"}`)
	st, err := c.Status(bgCtx(t))
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != 503 {
		t.Fatalf("Status error %v, want an APIError 503", err)
	}
	if st == nil || st.State != "starting" {
		t.Fatalf("Status result %+v while starting, want the decoded body (state starting)", st)
	}
}

func TestUnreachable(t *testing.T) {
	c := client.New(filepath.Join(t.TempDir(), "nobody.sock"))
	defer c.Close()
	err := c.Healthz(bgCtx(t))
	var ae *client.APIError
	if err == nil || errors.As(err, &ae) {
		t.Fatalf("Healthz on a missing socket = %v, want a connection error", err)
	}
	if !strings.Contains(err.Error(), "/v1/healthz") {
		t.Errorf("error %q does not name the call", err)
	}
}

func TestContextCancel(t *testing.T) {
	_, c, _ := startFakeAgent(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Healthz(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Healthz with a cancelled context = %v, want context.Canceled", err)
	}
}

// TestWaitReady: WaitReady waits through a starting agent until its
// status is ok, and stops with an error when the agent's process is gone
// or the context ends.
func TestWaitReady(t *testing.T) {
	f, c, _ := startFakeAgent(t)
	f.answer(503, `{"state":"starting","message":"restoring endpoints"}`)
	done := make(chan error, 1)
	go func() { done <- c.WaitReady(bgCtx(t), nil) }()
	for { // a few polls while starting
		f.mu.Lock()
		n := len(f.requests)
		f.mu.Unlock()
		if n >= 3 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("WaitReady returned %v while the agent was starting", err)
	default:
	}
	f.answer(200, `{"state":"ok"}`)
	if err := <-done; err != nil {
		t.Fatalf("WaitReady = %v once ok", err)
	}

	f.answer(503, `{"state":"starting"}`)
	gone := make(chan struct{})
	close(gone)
	if err := c.WaitReady(bgCtx(t), gone); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("WaitReady with the process gone = %v, want an exit error", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.WaitReady(ctx, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitReady with the context done = %v, want context.Canceled", err)
	}
}
