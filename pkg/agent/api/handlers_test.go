package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/api"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// apiWait bounds every request and wait of these tests.
const apiWait = 10 * time.Second

// apiEnv is an in-process agent and ways to talk to it.
type apiEnv struct {
	agent  *agent.Agent
	fake   *datapath.Fake
	client *client.Client
	http   *http.Client
	socket string
}

// quietLog discards the agent's logs.
func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startHandlersAgent starts an agent with the fake datapath on a socket in
// a temp dir, IPv4 range 10.201.0.0/24 unless mutate changes it.
func startHandlersAgent(tb testing.TB, mutate func(*agent.Config)) *apiEnv {
	tb.Helper()
	dir := tb.TempDir()
	fake := datapath.NewFake(1)
	cfg := agent.Config{
		Socket:    filepath.Join(dir, "a.sock"),
		StateDir:  filepath.Join(dir, "state"),
		IPv4Range: netip.MustParsePrefix("10.201.0.0/24"),
		Datapath:  "fake",
		Fake:      fake,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	a, err := agent.Start(cfg, quietLog())
	if err != nil {
		tb.Fatalf("agent.Start: %v", err)
	}
	env := &apiEnv{agent: a, fake: fake, client: client.New(cfg.Socket), http: unixHTTPClient(cfg.Socket), socket: cfg.Socket}
	tb.Cleanup(func() {
		env.client.Close()
		env.http.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := a.Stop(ctx); err != nil {
			tb.Errorf("agent stop: %v", err)
		}
	})
	return env
}

// unixHTTPClient returns an HTTP client that dials the unix socket.
func unixHTTPClient(socket string) *http.Client {
	return &http.Client{Timeout: apiWait, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
}

// response is a raw HTTP answer.
type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends a raw request; path is sent as is (escapes included).
func (e *apiEnv) do(tb testing.TB, method, path, body string) response {
	tb.Helper()
	return rawDo(tb, e.http, method, path, body)
}

func rawDo(tb testing.TB, c *http.Client, method, path, body string) response {
	tb.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://membrane"+path, rd)
	if err != nil {
		tb.Fatalf("new request %s %s: %v", method, path, err)
	}
	if u, err := url.Parse("http://membrane" + path); err == nil {
		req.URL = u // keep escapes such as %2F as sent
	}
	resp, err := c.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s %s: read: %v", method, path, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// decodeInto decodes a JSON answer, failing the test on error.
func decodeInto(tb testing.TB, r response, v any) {
	tb.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		tb.Errorf("Content-Type %q, want application/json", ct)
	}
	if err := json.Unmarshal(r.body, v); err != nil {
		tb.Fatalf("decode %s into %T: %v", r.body, v, err)
	}
}

// errorBody checks that r is a JSON error body of exactly {code, message}
// and returns it.
func errorBody(tb testing.TB, r response) models.Error {
	tb.Helper()
	var raw map[string]any
	decodeInto(tb, r, &raw)
	if len(raw) != 2 {
		tb.Errorf("error body %s: want exactly code and message", r.body)
	}
	code, ok1 := raw["code"].(string)
	msg, ok2 := raw["message"].(string)
	if !ok1 || !ok2 || code == "" || msg == "" {
		tb.Fatalf("error body %s: want non-empty string code and message", r.body)
	}
	return models.Error{Code: code, Message: msg}
}

// expectError checks status, code and (if non-empty) a message substring.
func expectError(tb testing.TB, r response, status int, code, inMessage string) {
	tb.Helper()
	if r.status != status {
		tb.Errorf("status %d, want %d (body %s)", r.status, status, r.body)
	}
	e := errorBody(tb, r)
	if e.Code != code {
		tb.Errorf("code %q, want %q (message %q)", e.Code, code, e.Message)
	}
	if inMessage != "" && !strings.Contains(e.Message, inMessage) {
		tb.Errorf("message %q does not mention %q", e.Message, inMessage)
	}
}

// expectErrorFields checks that a body carrying more than an error (a
// 503 status or health answer) still decodes as the API's error with code
// and a message.
func expectErrorFields(tb testing.TB, r response, code string) {
	tb.Helper()
	var e models.Error
	decodeInto(tb, r, &e)
	if e.Code != code || e.Message == "" {
		tb.Errorf("body %s decodes as error %+v, want code %q and a message", r.body, e, code)
	}
}

func bg(tb testing.TB) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), apiWait)
	tb.Cleanup(cancel)
	return ctx
}

// createPod creates a ready endpoint for pod ns/name with a fresh IPv4.
func (e *apiEnv) createPod(tb testing.TB, cid, ns, name string, labels ...string) *models.Endpoint {
	tb.Helper()
	ctx := bg(tb)
	alloc, err := e.client.IPAMAllocate(ctx, "ipv4", ns+"/"+name)
	if err != nil {
		tb.Fatalf("allocate for %s/%s: %v", ns, name, err)
	}
	if len(labels) == 0 {
		labels = []string{"k8s:app=" + name}
	}
	ep, err := e.client.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{
		ContainerID: cid, K8sNamespace: ns, K8sPodName: name, Labels: labels,
		Addressing: &models.AddressPair{IPv4: alloc.Address.IPv4}, SyncBuild: true,
	})
	if err != nil {
		tb.Fatalf("create %s/%s: %v", ns, name, err)
	}
	return ep
}

func TestBadRequests(t *testing.T) {
	e := startHandlersAgent(t, nil)
	ready := e.createPod(t, "c-ready", "ns", "ready")
	id := fmt.Sprint(ready.ID)
	big := `{"container-name":"` + strings.Repeat("x", 1<<20) + `"}`
	tests := []struct {
		name         string
		method, path string
		body         string
		status       int
		code         string
		inMessage    string
	}{
		// Bodies.
		{"bad json", "PUT", "/v1/endpoint/0", `{"container-id":`, 400, api.CodeInvalid, "malformed JSON"},
		{"json syntax", "PUT", "/v1/endpoint/0", `{"a" 1}`, 400, api.CodeInvalid, "malformed JSON"},
		{"unknown field", "PUT", "/v1/endpoint/0", `{"container-idd":"a"}`, 400, api.CodeInvalid, "container-idd"},
		{"wrong type", "PUT", "/v1/endpoint/0", `{"labels":"k8s:a=b"}`, 400, api.CodeInvalid, "labels"},
		{"trailing data", "PUT", "/v1/endpoint/0", `{"container-id":"t1"} {}`, 400, api.CodeInvalid, "after the JSON object"},
		{"empty body", "PUT", "/v1/endpoint/0", ``, 400, api.CodeInvalid, "empty"},
		{"too large", "PUT", "/v1/endpoint/0", big, 413, api.CodeRequestTooLarge, ""},
		{"labels invalid", "PUT", "/v1/endpoint/0", `{"labels":["k8s:bad key=x"]}`, 400, api.CodeInvalid, "labels"},
		{"labels duplicate key", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=1","k8s:a=2"]}`, 400, api.CodeInvalid, "labels"},
		{"ipv6 in ipv4", "PUT", "/v1/endpoint/0", `{"addressing":{"ipv4":"fd00::1"}}`, 400, api.CodeInvalid, "addressing.ipv4"},
		{"ipv4 in ipv6", "PUT", "/v1/endpoint/0", `{"addressing":{"ipv6":"10.201.0.9"}}`, 400, api.CodeInvalid, "addressing.ipv6"},
		{"bad ipv4", "PUT", "/v1/endpoint/0", `{"addressing":{"ipv4":"10.201.0.300"}}`, 400, api.CodeInvalid, "addressing.ipv4"},
		{"id mismatch", "PUT", "/v1/endpoint/5", `{"id":6}`, 400, api.CodeInvalid, "id"},
		{"id out of range", "PUT", "/v1/endpoint/0", `{"id":70000}`, 400, api.CodeInvalid, "id"},
		{"namespace without pod", "PUT", "/v1/endpoint/0", `{"k8s-namespace":"ns"}`, 400, api.CodeInvalid, "k8s-pod-name"},
		{"bad mac", "PUT", "/v1/endpoint/0", `{"mac":"zz"}`, 400, api.CodeInvalid, "mac"},
		{"negative ifindex", "PUT", "/v1/endpoint/0", `{"interface-index":-1}`, 400, api.CodeInvalid, "interface-index"},
		{"container id with space", "PUT", "/v1/endpoint/0", `{"container-id":"a b"}`, 400, api.CodeInvalid, "container-id"},
		{"host interface eth0", "PUT", "/v1/endpoint/0", `{"interface-name":"eth0","labels":["k8s:a=b"]}`, 400, api.CodeInvalid, "interface-name"},
		{"host interface dotdot", "PUT", "/v1/endpoint/0", `{"interface-name":"..","labels":["k8s:a=b"]}`, 400, api.CodeInvalid, "interface-name"},
		{"host interface all", "PUT", "/v1/endpoint/0", `{"interface-name":"all","labels":["k8s:a=b"]}`, 400, api.CodeInvalid, "interface-name"},
		{"host interface too long", "PUT", "/v1/endpoint/0", `{"interface-name":"lxc0123456789abcd","labels":["k8s:a=b"]}`, 400, api.CodeInvalid, "interface-name"},
		{"host interface health", "PUT", "/v1/endpoint/0", `{"interface-name":"lxc_health","labels":["k8s:a=b"]}`, 400, api.CodeInvalid, "interface-name"},
		{"container interface dot", "PUT", "/v1/endpoint/0", `{"container-interface-name":".","labels":["k8s:a=b"]}`, 400, api.CodeInvalid, "container-interface-name"},
		{"container interface too long", "PUT", "/v1/endpoint/0", `{"container-interface-name":"eth0123456789abc","labels":["k8s:a=b"]}`, 400, api.CodeInvalid, "container-interface-name"},
		{"container mismatch", "PUT", "/v1/endpoint/container-id:abc", `{"container-id":"xyz"}`, 400, api.CodeInvalid, "container-id"},
		{"pod mismatch", "PUT", "/v1/endpoint/pod-name:ns/p", `{"k8s-pod-name":"q"}`, 400, api.CodeInvalid, "k8s-pod-name"},
		{"put unknown query", "PUT", "/v1/endpoint/0?bogus=1", `{}`, 400, api.CodeInvalid, "bogus"},
		{"put bad sync", "PUT", "/v1/endpoint/0?sync=maybe", `{}`, 400, api.CodeInvalid, "sync"},

		// IDs in the path.
		{"id word", "GET", "/v1/endpoint/abc", "", 400, api.CodeInvalid, "abc"},
		{"id negative", "GET", "/v1/endpoint/-1", "", 400, api.CodeInvalid, ""},
		{"id too big", "GET", "/v1/endpoint/65536", "", 400, api.CodeInvalid, ""},
		{"id plus", "GET", "/v1/endpoint/+5", "", 400, api.CodeInvalid, ""},
		{"id empty container", "GET", "/v1/endpoint/container-id:", "", 400, api.CodeInvalid, ""},
		{"id pod without slash", "GET", "/v1/endpoint/pod-name:ns", "", 400, api.CodeInvalid, ""},
		{"id pod without namespace", "GET", "/v1/endpoint/pod-name:%2Fpod", "", 400, api.CodeInvalid, ""},
		{"id unknown prefix", "GET", "/v1/endpoint/unknown:x", "", 400, api.CodeInvalid, "unknown"},
		{"id very long", "GET", "/v1/endpoint/" + strings.Repeat("9", 700), "", 400, api.CodeInvalid, ""},
		{"delete bad id", "DELETE", "/v1/endpoint/abc", "", 400, api.CodeInvalid, ""},
		{"put bad id", "PUT", "/v1/endpoint/abc", `{}`, 400, api.CodeInvalid, ""},
		{"patch bad id", "PATCH", "/v1/endpoint/-1/labels", `{}`, 400, api.CodeInvalid, ""},
		{"regenerate bad id", "POST", "/v1/endpoint/x/regenerate", "", 400, api.CodeInvalid, ""},
		{"healthz bad id", "GET", "/v1/endpoint/x/healthz", "", 400, api.CodeInvalid, ""},
		{"two segments without pod-name", "GET", "/v1/endpoint/5/x", "", 404, api.CodeNotFound, ""},

		// Unknown endpoints.
		{"get unknown", "GET", "/v1/endpoint/999", "", 404, api.CodeNotFound, "999"},
		{"get unknown container", "GET", "/v1/endpoint/container-id:nope", "", 404, api.CodeNotFound, ""},
		{"get unknown pod", "GET", "/v1/endpoint/pod-name:ns/nope", "", 404, api.CodeNotFound, ""},
		{"delete unknown", "DELETE", "/v1/endpoint/999", "", 404, api.CodeNotFound, ""},
		{"patch unknown", "PATCH", "/v1/endpoint/999/labels", `{"add":["k8s:a=b"]}`, 404, api.CodeNotFound, ""},
		{"regenerate unknown", "POST", "/v1/endpoint/999/regenerate", "", 404, api.CodeNotFound, ""},
		{"healthz unknown", "GET", "/v1/endpoint/999/healthz", "", 404, api.CodeNotFound, ""},

		// Other bodies and queries of endpoint calls.
		{"patch bad json", "PATCH", "/v1/endpoint/" + id + "/labels", `{`, 400, api.CodeInvalid, ""},
		{"patch unknown field", "PATCH", "/v1/endpoint/" + id + "/labels", `{"remove":["x"]}`, 400, api.CodeInvalid, "remove"},
		{"patch invalid label", "PATCH", "/v1/endpoint/" + id + "/labels", `{"add":["k8s:="]}`, 400, api.CodeInvalid, "add"},
		{"patch invalid delete", "PATCH", "/v1/endpoint/" + id + "/labels", `{"delete":["bad source:x"]}`, 400, api.CodeInvalid, "delete"},
		{"delete unknown option", "DELETE", "/v1/endpoint/" + id + "?bogus=1", "", 400, api.CodeInvalid, "bogus"},
		{"delete bad option", "DELETE", "/v1/endpoint/" + id + "?no-ip-release=maybe", "", 400, api.CodeInvalid, "no-ip-release"},
		{"batch delete empty", "DELETE", "/v1/endpoint", `{}`, 400, api.CodeInvalid, "container-id"},
		{"batch delete bad json", "DELETE", "/v1/endpoint", `[`, 400, api.CodeInvalid, ""},
		{"batch delete unknown", "DELETE", "/v1/endpoint", `{"container-id":"nope"}`, 404, api.CodeNotFound, "nope"},

		// List filters.
		{"list bad state", "GET", "/v1/endpoint?state=bogus", "", 400, api.CodeInvalid, "state"},
		{"list bad identity", "GET", "/v1/endpoint?identity=abc", "", 400, api.CodeInvalid, "identity"},
		{"list zero identity", "GET", "/v1/endpoint?identity=0", "", 400, api.CodeInvalid, "identity"},
		{"list pod without namespace", "GET", "/v1/endpoint?pod=x", "", 400, api.CodeInvalid, "namespace"},
		{"list bad label", "GET", "/v1/endpoint?label=k8s:=x", "", 400, api.CodeInvalid, "label"},
		{"list unknown param", "GET", "/v1/endpoint?bogus=1", "", 400, api.CodeInvalid, "bogus"},

		// IPAM.
		{"release out of range", "DELETE", "/v1/ipam/10.99.0.1", "", 400, api.CodeInvalidAddress, "10.99.0.1"},
		{"release unconfigured family", "DELETE", "/v1/ipam/fd00::1", "", 400, api.CodeInvalidAddress, ""},
		{"release unparseable", "DELETE", "/v1/ipam/not-an-ip", "", 400, api.CodeInvalid, "not-an-ip"},
		{"release unknown query", "DELETE", "/v1/ipam/10.201.0.77?bogus=1", "", 400, api.CodeInvalid, "bogus"},
		{"allocate bad family", "POST", "/v1/ipam?family=ipv5", "", 400, api.CodeInvalid, "family"},
		{"allocate unconfigured family", "POST", "/v1/ipam?family=ipv6", "", 400, api.CodeInvalidAddress, "ipv6"},
		{"allocate unknown query", "POST", "/v1/ipam?bogus=1", "", 400, api.CodeInvalid, "bogus"},
		{"allocate long owner", "POST", "/v1/ipam?owner=" + strings.Repeat("o", 600), "", 400, api.CodeInvalid, "owner"},

		// Identities.
		{"identity word", "GET", "/v1/identity/abc", "", 400, api.CodeInvalid, ""},
		{"identity zero", "GET", "/v1/identity/0", "", 400, api.CodeInvalid, ""},
		{"identity unknown", "GET", "/v1/identity/99999", "", 404, api.CodeNotFound, "99999"},
		{"identity list query", "GET", "/v1/identity?x=1", "", 400, api.CodeInvalid, ""},

		// Routes and methods.
		{"unknown route", "GET", "/v1/nothing", "", 404, api.CodeNotFound, "/v1/nothing"},
		{"root", "GET", "/", "", 404, api.CodeNotFound, ""},
		{"other version", "GET", "/v2/endpoint", "", 404, api.CodeNotFound, ""},
		{"post healthz", "POST", "/v1/healthz", "", 405, api.CodeMethodNotAllowed, "POST"},
		{"patch ipam", "PATCH", "/v1/ipam", "", 405, api.CodeMethodNotAllowed, ""},
		{"post endpoint", "POST", "/v1/endpoint/" + id, "", 405, api.CodeMethodNotAllowed, ""},
		{"put identity", "PUT", "/v1/identity/1", "", 405, api.CodeMethodNotAllowed, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.do(t, tt.method, tt.path, tt.body)
			expectError(t, r, tt.status, tt.code, tt.inMessage)
			if tt.status == http.StatusMethodNotAllowed && r.header.Get("Allow") == "" {
				t.Errorf("405 without an Allow header")
			}
		})
	}
	// Nothing was created or removed by the refused calls.
	eps, err := e.client.EndpointList(bg(t), nil)
	if err != nil || len(eps) != 1 || eps[0].ID != ready.ID || eps[0].State != "ready" {
		t.Fatalf("endpoints after refused calls = %+v, %v", eps, err)
	}
}

func TestConflictsAndExhaustion(t *testing.T) {
	e := startHandlersAgent(t, func(c *agent.Config) { c.IPv4Range = netip.MustParsePrefix("10.202.0.0/29") })
	ctx := bg(t)
	first := e.createPod(t, "c-dup", "ns", "dup")

	t.Run("duplicate container", func(t *testing.T) {
		r := e.do(t, "PUT", "/v1/endpoint/0", `{"container-id":"c-dup","sync-build":true,"labels":["k8s:a=b"]}`)
		expectError(t, r, http.StatusConflict, api.CodeConflict, "c-dup")
	})
	t.Run("duplicate id", func(t *testing.T) {
		r := e.do(t, "PUT", fmt.Sprintf("/v1/endpoint/%d", first.ID), `{"labels":["k8s:a=b"]}`)
		expectError(t, r, http.StatusConflict, api.CodeConflict, "")
	})
	t.Run("duplicate address", func(t *testing.T) {
		body := fmt.Sprintf(`{"container-id":"c-other","labels":["k8s:a=b"],"addressing":{"ipv4":%q}}`, first.Addressing.IPv4)
		r := e.do(t, "PUT", "/v1/endpoint/0", body)
		expectError(t, r, http.StatusConflict, api.CodeConflict, first.Addressing.IPv4)
	})
	t.Run("release claimed address", func(t *testing.T) {
		r := e.do(t, "DELETE", "/v1/ipam/"+first.Addressing.IPv4, "")
		expectError(t, r, http.StatusConflict, api.CodeAddressInUse, "")
	})
	t.Run("address outside the range", func(t *testing.T) {
		r := e.do(t, "PUT", "/v1/endpoint/0", `{"container-id":"c-out","labels":["k8s:a=b"],"addressing":{"ipv4":"10.99.0.2"},"sync-build":true}`)
		expectError(t, r, http.StatusBadRequest, api.CodeInvalidAddress, "")
	})
	t.Run("ipam exhausted", func(t *testing.T) {
		// .2 .. .6 are allocatable; the first endpoint holds one.
		for i := range 4 {
			if _, err := e.client.IPAMAllocate(ctx, "", fmt.Sprintf("ns/p%d", i)); err != nil {
				t.Fatalf("allocation %d: %v", i, err)
			}
		}
		r := e.do(t, "POST", "/v1/ipam?owner=ns/last", "")
		expectError(t, r, http.StatusInsufficientStorage, api.CodeIPAMExhausted, "")
		_, err := e.client.IPAMAllocate(ctx, "ipv4", "ns/last")
		if !client.IsCode(err, api.CodeIPAMExhausted) {
			t.Fatalf("client allocate = %v, want ipam-exhausted", err)
		}
	})
}

// TestStarting: before SetReady, mutating calls are refused with 503
// "starting" while reads work.
func TestStarting(t *testing.T) {
	ix, err := index.New()
	if err != nil {
		t.Fatal(err)
	}
	sys, err := actors.Start(actors.Config{IPAM: actors.IPAMConfig{IPv4: netip.MustParsePrefix("10.203.0.0/24")}},
		ix, datapath.NewFake(1), quietLog())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sys.Stop)
	srv, err := api.New(api.Config{Version: "v9.9.9-test"}, sys, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(t.TempDir(), "s.sock")
	lis, err := api.Listen(socket, 0o660)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), apiWait)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	hc := unixHTTPClient(socket)
	t.Cleanup(hc.CloseIdleConnections)

	mutating := []struct{ method, path, body string }{
		{"PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"]}`},
		{"DELETE", "/v1/endpoint/1", ""},
		{"DELETE", "/v1/endpoint", `{"container-id":"x"}`},
		{"PATCH", "/v1/endpoint/1/labels", `{}`},
		{"POST", "/v1/endpoint/1/regenerate", ""},
		{"POST", "/v1/ipam", ""},
		{"DELETE", "/v1/ipam/10.203.0.5", ""},
		{"PUT", "/v1/policy", "apiVersion: cilium.io/v2"},
		{"DELETE", "/v1/policy?name=a/b", ""},
	}
	for _, m := range mutating {
		t.Run(m.method+" "+m.path, func(t *testing.T) {
			r := rawDo(t, hc, m.method, m.path, m.body)
			expectError(t, r, http.StatusServiceUnavailable, api.CodeStarting, "")
			if r.header.Get("Retry-After") == "" {
				t.Errorf("503 starting without Retry-After")
			}
		})
	}
	t.Run("reads work", func(t *testing.T) {
		for _, p := range []string{"/v1/healthz", "/v1/endpoint", "/v1/ipam", "/v1/identity", "/v1/policy", "/v1/ipcache"} {
			if r := rawDo(t, hc, "GET", p, ""); r.status != http.StatusOK {
				t.Errorf("GET %s while starting = %d %s", p, r.status, r.body)
			}
		}
		r := rawDo(t, hc, "GET", "/v1/status", "")
		var st models.Status
		decodeInto(t, r, &st)
		if r.status != http.StatusServiceUnavailable || st.State != "starting" {
			t.Errorf("GET /v1/status while starting = %d %+v", r.status, st)
		}
		// The 503 body is also the API's error shape with its code.
		expectErrorFields(t, r, api.CodeStarting)
	})
	srv.SetReady()
	t.Run("ready", func(t *testing.T) {
		r := rawDo(t, hc, "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"],"sync-build":true}`)
		if r.status != http.StatusCreated {
			t.Fatalf("PUT after SetReady = %d %s", r.status, r.body)
		}
		r = rawDo(t, hc, "GET", "/v1/status", "")
		var st models.Status
		decodeInto(t, r, &st)
		if r.status != http.StatusOK || st.Version != "v9.9.9-test" {
			t.Errorf("GET /v1/status when ready = %d %s, want 200 with the version", r.status, r.body)
		}
	})
}

func TestEndpointHappyPaths(t *testing.T) {
	e := startHandlersAgent(t, nil)
	ctx := bg(t)
	alloc, err := e.client.IPAMAllocate(ctx, "", "web/web-0")
	if err != nil {
		t.Fatal(err)
	}
	if alloc.IPv4 == nil || alloc.IPv4.Gateway != "10.201.0.1" || alloc.IPv4.Owner != "web/web-0" {
		t.Fatalf("allocate answered %+v", alloc.IPv4)
	}
	if alloc.HostAddressing == nil || alloc.HostAddressing.IPv4 == nil || !alloc.HostAddressing.IPv4.Enabled {
		t.Errorf("host addressing %+v", alloc.HostAddressing)
	}

	// PUT sync through the client.
	web, err := e.client.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{
		ContainerID: "c-web", K8sNamespace: "web", K8sPodName: "web-0", Labels: []string{"k8s:tier=fe", "k8s:app=web"},
		Addressing: &models.AddressPair{IPv4: alloc.Address.IPv4}, Mac: "02:00:00:00:00:01", InterfaceName: "lxc1",
		InterfaceIndex: 7, SyncBuild: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if web.State != "ready" || web.ID == 0 || web.PolicyRevision < 1 || web.Identity == nil || web.Identity.ID < 256 {
		t.Fatalf("sync PUT answered %+v", web)
	}
	if !slices.Equal(web.Labels, []string{"k8s:app=web", "k8s:tier=fe"}) {
		t.Errorf("labels %v, want sorted", web.Labels)
	}
	if web.Addressing == nil || web.Addressing.IPv4 != alloc.Address.IPv4 || web.Mac != "02:00:00:00:00:01" {
		t.Errorf("addressing %+v mac %q", web.Addressing, web.Mac)
	}
	// PUT with a raw body and ?sync=true, by container ID and by pod name.
	byCID := e.do(t, "PUT", "/v1/endpoint/container-id:c-db?sync=true", `{"k8s-namespace":"db","k8s-pod-name":"db-0","labels":["k8s:app=db"]}`)
	var db models.Endpoint
	decodeInto(t, byCID, &db)
	if byCID.status != http.StatusCreated || db.ContainerID != "c-db" || db.State != "ready" {
		t.Fatalf("PUT by container ID = %d %s", byCID.status, byCID.body)
	}
	byPod := e.do(t, "PUT", "/v1/endpoint/pod-name:web/web-1", `{"container-id":"c-web-1","labels":["k8s:app=web"]}`)
	var web1 models.Endpoint
	decodeInto(t, byPod, &web1)
	if byPod.status != http.StatusCreated || web1.K8sNamespace != "web" || web1.K8sPodName != "web-1" {
		t.Fatalf("PUT by pod name = %d %s", byPod.status, byPod.body)
	}
	waitReady(t, e, fmt.Sprint(web1.ID))
	if got, err := e.client.EndpointGet(ctx, fmt.Sprint(web1.ID)); err != nil || got.Identity == nil {
		t.Fatalf("GET web-1 = %+v, %v", got, err)
	} else {
		web1 = *got
	}

	t.Run("get", func(t *testing.T) {
		for _, path := range []string{
			fmt.Sprintf("/v1/endpoint/%d", web.ID),
			"/v1/endpoint/container-id:c-web",
			"/v1/endpoint/pod-name:web%2Fweb-0",
			"/v1/endpoint/pod-name:web/web-0",
		} {
			r := e.do(t, "GET", path, "")
			var got models.Endpoint
			decodeInto(t, r, &got)
			if r.status != http.StatusOK || got.ID != web.ID {
				t.Errorf("GET %s = %d, endpoint %d; want %d", path, r.status, got.ID, web.ID)
			}
			if got.Identity == nil || !slices.Equal(got.Identity.Labels, web.Labels) {
				t.Errorf("GET %s identity %+v, want labels %v", path, got.Identity, web.Labels)
			}
		}
		for _, ref := range []string{fmt.Sprint(web.ID), "container-id:c-web", "pod-name:web/web-0"} {
			got, err := e.client.EndpointGet(ctx, ref)
			if err != nil || got.ID != web.ID {
				t.Errorf("client get %s = %+v, %v", ref, got, err)
			}
		}
	})

	t.Run("list", func(t *testing.T) {
		tests := []struct {
			query url.Values
			want  []int64
		}{
			{nil, []int64{web.ID, db.ID, web1.ID}},
			{url.Values{"namespace": {"web"}}, []int64{web.ID, web1.ID}},
			{url.Values{"namespace": {"we"}}, nil},
			{url.Values{"namespace": {"web"}, "pod": {"web-1"}}, []int64{web1.ID}},
			{url.Values{"state": {"ready"}}, []int64{web.ID, db.ID, web1.ID}},
			{url.Values{"state": {"disconnecting"}}, nil},
			{url.Values{"identity": {fmt.Sprint(db.Identity.ID)}}, []int64{db.ID}},
			{url.Values{"label": {"k8s:app=web"}}, []int64{web.ID, web1.ID}},
			{url.Values{"label": {"k8s:app=web", "k8s:tier=fe"}}, []int64{web.ID}},
			{url.Values{"label": {"any:app=db"}}, []int64{db.ID}},
			{url.Values{"namespace": {"web"}, "label": {"k8s:tier=fe"}, "state": {"ready"}}, []int64{web.ID}},
		}
		for _, tt := range tests {
			t.Run(tt.query.Encode(), func(t *testing.T) {
				eps, err := e.client.EndpointList(ctx, tt.query)
				if err != nil {
					t.Fatal(err)
				}
				var got []int64
				for _, ep := range eps {
					got = append(got, ep.ID)
				}
				want := slices.Clone(tt.want)
				slices.Sort(want)
				if !slices.Equal(got, want) {
					t.Fatalf("list %s = %v, want %v (sorted by ID)", tt.query.Encode(), got, want)
				}
			})
		}
		// An empty result is an empty JSON array, not null.
		r := e.do(t, "GET", "/v1/endpoint?namespace=none", "")
		if strings.TrimSpace(string(r.body)) != "[]" {
			t.Errorf("empty list body %q, want []", r.body)
		}
	})

	t.Run("patch labels", func(t *testing.T) {
		got, err := e.client.EndpointPatchLabels(ctx, fmt.Sprint(web1.ID), []string{"k8s:tier=be"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got.Identity == nil || got.Identity.ID == web1.Identity.ID || !slices.Contains(got.Labels, "k8s:tier=be") {
			t.Fatalf("patched endpoint %+v (identity was %d)", got, web1.Identity.ID)
		}
		got, err = e.client.EndpointPatchLabels(ctx, "pod-name:web/web-1", nil, []string{"k8s:tier"})
		if err != nil || slices.Contains(got.Labels, "k8s:tier=be") {
			t.Fatalf("delete label = %+v, %v", got, err)
		}
		waitReady(t, e, fmt.Sprint(web1.ID))
	})

	t.Run("regenerate", func(t *testing.T) {
		before, err := e.client.EndpointGet(ctx, fmt.Sprint(db.ID))
		if err != nil {
			t.Fatal(err)
		}
		got, err := e.client.EndpointRegenerate(ctx, "container-id:c-db")
		if err != nil {
			t.Fatal(err)
		}
		if got.PolicyRevision <= before.PolicyRevision || got.Regenerations <= before.Regenerations {
			t.Fatalf("regenerate: revision %d -> %d, regenerations %d -> %d", before.PolicyRevision, got.PolicyRevision,
				before.Regenerations, got.Regenerations)
		}
	})

	t.Run("healthz", func(t *testing.T) {
		h, err := e.client.EndpointHealth(ctx, fmt.Sprint(web.ID))
		if err != nil || !h.Healthy || h.Datapath != "ok" || h.State != "ready" {
			t.Fatalf("health = %+v, %v", h, err)
		}
		e.fake.Forget(endpoint.ID(web.ID)) // the host interface vanished
		r := e.do(t, "GET", fmt.Sprintf("/v1/endpoint/%d/healthz", web.ID), "")
		var hh models.EndpointHealth
		decodeInto(t, r, &hh)
		if r.status != http.StatusServiceUnavailable || hh.Healthy || hh.Datapath != "error" || hh.Message == "" {
			t.Fatalf("health of a vanished datapath = %d %+v", r.status, hh)
		}
		expectErrorFields(t, r, api.CodeUnhealthy)
		if _, err := e.client.EndpointRegenerate(ctx, fmt.Sprint(web.ID)); err != nil { // realise it again
			t.Fatal(err)
		}
	})

	t.Run("identity", func(t *testing.T) {
		ids, err := e.client.Identities(ctx)
		if err != nil {
			t.Fatal(err)
		}
		reserved, local := 0, map[int64]*models.Identity{}
		for _, id := range ids {
			if id.Reserved {
				reserved++
			} else {
				local[id.ID] = id
			}
		}
		if reserved != 8 {
			t.Errorf("%d reserved identities listed, want 8", reserved)
		}
		if got := local[web.Identity.ID]; got == nil || got.RefCount != 1 || !slices.Equal(got.Labels, web.Labels) {
			t.Errorf("web's identity in the list: %+v", got)
		}
		one, err := e.client.Identity(ctx, web.Identity.ID)
		if err != nil || one.ID != web.Identity.ID || one.RefCount != 1 {
			t.Errorf("GET identity %d = %+v, %v", web.Identity.ID, one, err)
		}
		host, err := e.client.Identity(ctx, 1)
		if err != nil || !host.Reserved || !slices.Equal(host.Labels, []string{"reserved:host"}) {
			t.Errorf("GET identity 1 = %+v, %v", host, err)
		}
	})

	t.Run("ipam status", func(t *testing.T) {
		st, err := e.client.IPAMStatus(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.IPv4 == nil || st.IPv6 != nil {
			t.Fatalf("ipam status %+v", st)
		}
		v4 := st.IPv4
		if v4.Cidr != "10.201.0.0/24" || v4.Size != 253 || v4.Used != 1 || v4.Free != 252 || len(v4.Allocations) != 1 {
			t.Fatalf("ipv4 status %+v", v4)
		}
		if a := v4.Allocations[0]; a.IP != alloc.Address.IPv4 || a.Owner != "web/web-0" || a.Endpoint != web.ID {
			t.Errorf("allocation %+v", a)
		}
	})

	t.Run("delete", func(t *testing.T) {
		r := e.do(t, "DELETE", fmt.Sprintf("/v1/endpoint/%d", web.ID), "")
		var gone models.Endpoint
		decodeInto(t, r, &gone)
		if r.status != http.StatusOK || gone.State != "disconnected" {
			t.Fatalf("DELETE = %d %s", r.status, r.body)
		}
		if _, err := e.client.EndpointGet(ctx, fmt.Sprint(web.ID)); !client.IsNotFound(err) {
			t.Fatalf("GET after DELETE = %v, want 404", err)
		}
		testutil.Eventually(t, "the address released", func() bool {
			st, err := e.client.IPAMStatus(ctx)
			return err == nil && st.IPv4.Used == 0
		})
		// Batch delete by container ID.
		r = e.do(t, "DELETE", "/v1/endpoint", `{"container-id":"c-db"}`)
		var batch models.EndpointBatchDeleteResponse
		decodeInto(t, r, &batch)
		if r.status != http.StatusOK || !slices.Equal(batch.Deleted, []int64{db.ID}) {
			t.Fatalf("batch DELETE = %d %s", r.status, r.body)
		}
		// Delete by pod name, unescaped, with options; then through the client.
		if r := e.do(t, "DELETE", "/v1/endpoint/pod-name:web/web-1?no-ip-release=true&no-identity-release=false", ""); r.status != http.StatusOK {
			t.Fatalf("DELETE by pod = %d %s", r.status, r.body)
		}
		if err := e.client.EndpointDelete(ctx, "pod-name:web/web-1"); !client.IsNotFound(err) {
			t.Fatalf("second DELETE = %v, want 404", err)
		}
		if err := e.client.EndpointDeleteByContainer(ctx, "c-db"); !client.IsNotFound(err) {
			t.Fatalf("second batch DELETE = %v, want 404", err)
		}
		eps, err := e.client.EndpointList(ctx, nil)
		if err != nil || len(eps) != 0 {
			t.Fatalf("endpoints left: %+v, %v", eps, err)
		}
	})

	t.Run("release", func(t *testing.T) {
		got, err := e.client.IPAMAllocate(ctx, "ipv4", "ns/rel")
		if err != nil {
			t.Fatal(err)
		}
		r := e.do(t, "DELETE", "/v1/ipam/"+got.Address.IPv4, "")
		var out map[string]any
		decodeInto(t, r, &out)
		if r.status != http.StatusOK || out["released"] != true || out["owner"] != "ns/rel" {
			t.Fatalf("release = %d %s", r.status, r.body)
		}
		// Releasing again (or anything unallocated) is a no-op.
		r = e.do(t, "DELETE", "/v1/ipam/"+got.Address.IPv4, "")
		decodeInto(t, r, &out)
		if r.status != http.StatusOK || out["released"] != false {
			t.Fatalf("second release = %d %s", r.status, r.body)
		}
		if err := e.client.IPAMRelease(ctx, "10.201.0.250"); err != nil {
			t.Fatalf("release of an unallocated address = %v", err)
		}
	})
}

// TestEndpointWithoutLabels: labels are optional in the API; an endpoint
// without any must either work or be refused as a bad request, never fail
// as an internal error.
func TestEndpointWithoutLabels(t *testing.T) {
	e := startHandlersAgent(t, nil)
	r := e.do(t, "PUT", "/v1/endpoint/0", `{"container-id":"c-nolabels","sync-build":true}`)
	switch r.status {
	case http.StatusCreated:
		var ep models.Endpoint
		decodeInto(t, r, &ep)
		if ep.State != "ready" {
			t.Fatalf("created without labels: %+v", ep)
		}
	case http.StatusBadRequest:
		expectError(t, r, http.StatusBadRequest, api.CodeInvalid, "labels")
	default:
		t.Fatalf("PUT without labels = %d %s; want 201, or 400 naming labels", r.status, r.body)
	}
}

func TestSocketMode(t *testing.T) {
	e := startHandlersAgent(t, nil)
	fi, err := os.Stat(e.socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("%s is not a socket: %v", e.socket, fi.Mode())
	}
	if perm := fi.Mode().Perm(); perm != 0o660 {
		t.Fatalf("socket mode %o, want 660", perm)
	}
}

// TestConcurrentCreates drives the API from many clients at once.
func TestConcurrentCreates(t *testing.T) {
	e := startHandlersAgent(t, nil)
	ctx := bg(t)
	const n = 40
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cid := fmt.Sprintf("c-par-%d", i)
			ep, err := e.client.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{ContainerID: cid,
				K8sNamespace: "par", K8sPodName: cid, Labels: []string{fmt.Sprintf("k8s:shard=%d", i%4)}, SyncBuild: true})
			if err == nil && ep.State != "ready" {
				err = fmt.Errorf("%s: state %s", cid, ep.State)
			}
			if err == nil {
				err = e.client.EndpointDeleteByContainer(ctx, cid)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	testutil.Eventually(t, "every identity released", func() bool {
		ids, err := e.client.Identities(ctx)
		return err == nil && len(ids) == 8 // the reserved ones
	})
}

// waitReady polls GET until the endpoint is ready.
func waitReady(tb testing.TB, e *apiEnv, ref string) {
	tb.Helper()
	testutil.Eventually(tb, "endpoint "+ref+" ready", func() bool {
		ep, err := e.client.EndpointGet(bg(tb), ref)
		return err == nil && ep.State == "ready"
	})
}

// TestListenModes: the socket gets the requested mode whether it is made
// in a private directory and renamed (short paths) or in place (paths
// too long for the detour), and the process umask is left alone.
func TestListenModes(t *testing.T) {
	base := t.TempDir()
	// 107 bytes: the longest path a socket can have; no room for the detour.
	long := filepath.Join(base, strings.Repeat("d", 107-len(base)-len("/s.sock")-1))
	if err := os.MkdirAll(long, 0o750); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		path string
		mode os.FileMode
	}{
		{"short path", filepath.Join(base, "a.sock"), 0o660},
		{"long path", filepath.Join(long, "s.sock"), 0o600},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			old := syscall.Umask(0o022)
			defer syscall.Umask(old)
			l, err := api.Listen(tt.path, tt.mode)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if cur := syscall.Umask(0o022); cur != 0o022 {
				t.Fatalf("umask changed to %o", cur)
			}
			fi, err := os.Stat(tt.path)
			if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != tt.mode {
				t.Fatalf("socket %s: %v %v, want mode %o", tt.path, fi, err, tt.mode)
			}
			entries, _ := os.ReadDir(filepath.Dir(tt.path))
			for _, e := range entries {
				if strings.HasPrefix(e.Name(), ".s") {
					t.Fatalf("temporary %s left behind", e.Name())
				}
			}
		})
	}
}

// TestPodsNamedLikeSubresources: pod-name:<ns>/<pod> with an unescaped
// '/' and a pod called healthz or policy reads the pod, and the
// sub-resources of such a pod still answer.
func TestPodsNamedLikeSubresources(t *testing.T) {
	e := startHandlersAgent(t, nil)
	for _, name := range []string{"healthz", "policy"} {
		ep := e.createPod(t, "c-"+name, "default", name)
		for _, path := range []string{"/v1/endpoint/pod-name:default/" + name, "/v1/endpoint/pod-name:default%2F" + name} {
			var got models.Endpoint
			decodeInto(t, e.do(t, "GET", path, ""), &got)
			if got.ID != ep.ID || got.K8sPodName != name {
				t.Errorf("GET %s = endpoint %d (%s), want %d", path, got.ID, got.K8sPodName, ep.ID)
			}
		}
		if r := e.do(t, "GET", "/v1/endpoint/pod-name:default/"+name+"/healthz", ""); r.status != http.StatusOK {
			t.Errorf("healthz of pod %s: %d %s", name, r.status, r.body)
		}
		if r := e.do(t, "GET", "/v1/endpoint/pod-name:default/"+name+"/policy", ""); r.status != http.StatusOK {
			t.Errorf("policy of pod %s: %d %s", name, r.status, r.body)
		}
	}
	if r := e.do(t, "GET", fmt.Sprintf("/v1/endpoint/%d/healthz", 1), ""); r.status != http.StatusOK {
		t.Errorf("healthz by ID: %d %s", r.status, r.body)
	}
}

// TestDatapathFailure: a sync PUT whose realise fails answers 502
// datapath-error, and the endpoint is gone (the caller releases its IP).
func TestDatapathFailure(t *testing.T) {
	e := startHandlersAgent(t, nil)
	e.fake.Set(datapath.FakeHooks{ErrorRate: 1})
	alloc, err := e.client.IPAMAllocate(bg(t), "ipv4", "default/broken")
	if err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"container-id":"c-broken","k8s-namespace":"default","k8s-pod-name":"broken","labels":["k8s:app=broken"],"addressing":{"ipv4":%q}}`, alloc.Address.IPv4)
	expectError(t, e.do(t, "PUT", "/v1/endpoint/0?sync=true", body), http.StatusBadGateway, api.CodeDatapath, "injected")
	if r := e.do(t, "GET", "/v1/endpoint/container-id:c-broken", ""); r.status != http.StatusNotFound {
		t.Errorf("endpoint after a failed sync PUT: %d %s", r.status, r.body)
	}
}

// TestListenRefusesNonSocket: a path that names a regular file, a
// directory or a symlink is refused with ErrNotSocket and left as it was;
// a stale socket is replaced.
func TestListenRefusesNonSocket(t *testing.T) {
	base := t.TempDir()
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "dir")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ name, path, kind string }{
		{"regular file", file, "regular file"},
		{"directory", dir, "directory"},
		{"symlink", link, "symlink"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before, err := os.Lstat(tt.path)
			if err != nil {
				t.Fatal(err)
			}
			l, err := api.Listen(tt.path, 0o660)
			if err == nil {
				l.Close()
				t.Fatalf("Listen on a %s succeeded", tt.kind)
			}
			if !errors.Is(err, api.ErrNotSocket) || !strings.Contains(err.Error(), tt.kind) {
				t.Fatalf("Listen on a %s = %v, want ErrNotSocket naming it", tt.kind, err)
			}
			after, err := os.Lstat(tt.path)
			if err != nil || !os.SameFile(before, after) || after.Mode() != before.Mode() {
				t.Fatalf("%s changed: %v %v", tt.path, after, err)
			}
		})
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "precious" {
		t.Fatalf("file content %q, %v", b, err)
	}
	t.Run("stale socket", func(t *testing.T) {
		path := filepath.Join(base, "s.sock")
		l, err := api.Listen(path, 0o660)
		if err != nil {
			t.Fatal(err)
		}
		l.Close() // leaves the file: a stale socket
		if l, err = api.Listen(path, 0o660); err != nil {
			t.Fatalf("Listen over a stale socket: %v", err)
		}
		l.Close()
	})
}
