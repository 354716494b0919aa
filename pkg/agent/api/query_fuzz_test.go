package api

import (
	"net/http/httptest"
	"net/url"
	"path"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzQueries feeds arbitrary query strings to the operator query parsers
// (endpoint filters and pages, actor filters, event stream options): they
// answer a value or a 400 error, never panic, and a parsed page is sane.
func FuzzQueries(f *testing.F) {
	for _, s := range []string{"namespace=a&selector=app%3Dweb,tier!%3Ddb&limit=10&after=3", "ip=10.0.0.1", "stuck=30s&min-mailbox=2&kind=endpoint",
		"type=endpoint-created,identity-released&since=5", "limit=0", "selector=%21x", "after=70000", "namespace=%FF", "%C3=1", "owner=a%00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		if _, pg, err := endpointFilterFrom(q); err == nil && (pg.limit < 0 || pg.limit > maxPage) {
			t.Fatalf("%q: page %+v", raw, pg)
		} else if err != nil {
			if status, _ := classify(err); status != 400 {
				t.Fatalf("%q: endpoint filter error %v is a %d", raw, err, status)
			}
		}
		if _, err := actorFilterFrom(q); err != nil {
			if status, _ := classify(err); status != 400 {
				t.Fatalf("%q: actor filter error %v is a %d", raw, err, status)
			}
		}
		if err := checkRequestText(httptest.NewRequest("GET", "/v1/endpoint?"+q.Encode(), nil)); err != nil {
			if status, _ := classify(err); status != 400 {
				t.Fatalf("%q: request text error %v is a %d", raw, err, status)
			}
		} else {
			for key, vals := range q {
				if !utf8.ValidString(key) || (len(vals) > 0 && !utf8.ValidString(vals[0])) {
					t.Fatalf("%q: invalid UTF-8 accepted", raw)
				}
			}
		}
		r := httptest.NewRequest("GET", "/v1/events?"+q.Encode(), nil)
		if _, _, err := eventQuery(r); err != nil {
			if status, _ := classify(err); status != 400 {
				t.Fatalf("%q: event query error %v is a %d", raw, err, status)
			}
		}
	})
}

// FuzzRequestPath feeds arbitrary paths to the checks that run before
// routing: a path passes only if it is valid UTF-8 and in the canonical
// form the mux would not redirect; a refusal is a 400.
func FuzzRequestPath(f *testing.F) {
	for _, s := range []string{"/v1/status", "/v1//status", "/v1/./x", "/v1/endpoint/../status", "/debug/pprof/", "/v1/endpoint/container-id:%FF", "/%C3", "/v1/endpoint/pod-name:ns%2Fp"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := url.ParseRequestURI(raw)
		if err != nil {
			return
		}
		r := httptest.NewRequest("GET", "/", nil)
		r.URL = u
		err = checkRequest(r)
		if err != nil {
			if status, _ := classify(err); status != 400 {
				t.Fatalf("%q: error %v is a %d", raw, err, status)
			}
			return
		}
		if !utf8.ValidString(u.Path) || path.Clean(u.Path) != strings.TrimSuffix(u.Path, "/") && u.Path != "/" {
			t.Fatalf("%q: path %q accepted", raw, u.Path)
		}
	})
}
