package api_test

import (
	"strings"
	"testing"
)

// TestUIRoutes: /ui/ serves the flows page with its policy headers, its
// script and style with their types, /ui redirects, and anything else
// under /ui/ is a 404; a mutating method is refused.
func TestUIRoutes(t *testing.T) {
	e := startHandlersAgent(t, nil)
	tests := []struct {
		path, ctype, contains string
	}{
		{"/ui/", "text/html", `<script src="app.js">`},
		{"/ui/app.js", "javascript", "/v1/flows?"},
		{"/ui/style.css", "text/css", ".edge"},
	}
	for _, tt := range tests {
		r := e.do(t, "GET", tt.path, "")
		if r.status != 200 || !strings.Contains(r.header.Get("Content-Type"), tt.ctype) || !strings.Contains(string(r.body), tt.contains) {
			t.Errorf("GET %s: %d %q, body %.80q", tt.path, r.status, r.header.Get("Content-Type"), r.body)
		}
		if csp := r.header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("GET %s: Content-Security-Policy %q", tt.path, csp)
		}
		if r.header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s: no nosniff", tt.path)
		}
	}
	if r := e.do(t, "GET", "/ui", ""); r.status != 200 || !strings.Contains(string(r.body), `<script src="app.js">`) { // redirected to /ui/
		t.Errorf("GET /ui: %d %.80q", r.status, r.body)
	}
	if r := e.do(t, "GET", "/ui/doc.go", ""); r.status != 404 {
		t.Errorf("GET /ui/doc.go: %d, want 404 (only the page's files are served)", r.status)
	}
	if r := e.do(t, "POST", "/ui/", ""); r.status != 405 {
		t.Errorf("POST /ui/: %d, want 405", r.status)
	}
}
