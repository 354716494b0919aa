package api_test

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/agent/api"
)

// TestUnmatchedAnswers checks that the mux's own 404 and 405 answers
// never reach the wire: only the JSON error, with the JSON content type,
// the Allow header on a 405 and none of the text answer's headers, and
// the request counted under route="unmatched".
func TestUnmatchedAnswers(t *testing.T) {
	e, c, base := startHTTPAgent(t, false)
	tests := []struct {
		name, method, path string
		status             int
		code, allow        string
	}{
		{"no route", "GET", "/v1/nothing", 404, api.CodeNotFound, ""},
		{"wrong method", "POST", "/v1/healthz", 405, api.CodeMethodNotAllowed, "GET, HEAD"},
		{"wrong method with path values", "PATCH", "/v1/identity/1", 405, api.CodeMethodNotAllowed, "GET, HEAD"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.do(t, tt.method, tt.path, "")
			expectError(t, r, tt.status, tt.code, "")
			if ct := r.header.Values("Content-Type"); len(ct) != 1 || ct[0] != "application/json" {
				t.Errorf("Content-Type %q, want only application/json", ct)
			}
			if got := r.header.Get("X-Content-Type-Options"); got != "" {
				t.Errorf("X-Content-Type-Options %q leaked from the mux's text answer", got)
			}
			if got := r.header.Get("Allow"); got != tt.allow {
				t.Errorf("Allow %q, want %q", got, tt.allow)
			}
		})
	}
	r := httpDo(t, c, "GET", base+"/metrics", "")
	for _, want := range []string{
		`membrane_api_request_duration_seconds_count{code="404",method="GET",route="unmatched"} 1`,
		`membrane_api_request_duration_seconds_count{code="405",method="POST",route="unmatched"} 1`,
		`membrane_api_request_duration_seconds_count{code="405",method="PATCH",route="unmatched"} 1`,
	} {
		if !strings.Contains(string(r.body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestStarRequest checks a request for "*" (other than OPTIONS, which
// net/http answers itself), which the mux would answer with a bare 400:
// the API answers its JSON 404.
func TestStarRequest(t *testing.T) {
	e := startHandlersAgent(t, nil)
	conn, err := net.Dial("unix", e.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("GET * HTTP/1.1\r\nHost: membrane\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET * = %d %s, want 404 application/json", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}
