package api

import (
	"net/http/httptest"
	"net/url"
	"testing"
)

// FuzzQueries feeds arbitrary query strings to the operator query parsers
// (endpoint filters and pages, actor filters, event stream options): they
// answer a value or a 400 error, never panic, and a parsed page is sane.
func FuzzQueries(f *testing.F) {
	for _, s := range []string{"namespace=a&selector=app%3Dweb,tier!%3Ddb&limit=10&after=3", "ip=10.0.0.1", "stuck=30s&min-mailbox=2&kind=endpoint",
		"type=endpoint-created,identity-released&since=5", "limit=0", "selector=%21x", "after=70000"} {
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
		r := httptest.NewRequest("GET", "/v1/events?"+q.Encode(), nil)
		if _, _, err := eventQuery(r); err != nil {
			if status, _ := classify(err); status != 400 {
				t.Fatalf("%q: event query error %v is a %d", raw, err, status)
			}
		}
	})
}
