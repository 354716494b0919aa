package api

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
)

// listFQDNCache serves GET /v1/fqdn/cache: the names learned from DNS
// answers, per endpoint and address. Query parameters: endpoint (an ID)
// and matchpattern (a toFQDNs matchPattern) filter.
func (s *Server) listFQDNCache(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for k := range q {
		if k != "endpoint" && k != "matchpattern" {
			writeError(w, badRequest(fmt.Sprintf("GET /v1/fqdn/cache: unknown query parameter %q (want endpoint, matchpattern)", k)))
			return
		}
	}
	ep := -1
	if v := q.Get("endpoint"); v != "" {
		n, err := strconv.ParseUint(v, 10, 16)
		if err != nil {
			writeError(w, badRequest(fmt.Sprintf("query parameter \"endpoint\": %q is not an endpoint ID", v)))
			return
		}
		ep = int(n)
	}
	var match *fqdn.Compiled
	if v := q.Get("matchpattern"); v != "" {
		c, err := fqdn.Compile(fqdn.Selector{MatchPattern: v}, "query")
		if err != nil {
			writeError(w, badRequest(fmt.Sprintf("query parameter \"matchpattern\": %v", err)))
			return
		}
		match = c
	}
	entries, err := s.sys.FQDNCache(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	now := time.Now()
	out := make([]models.FQDNCacheEntry, 0, len(entries))
	for _, e := range entries {
		if (ep >= 0 && int(e.Endpoint) != ep) || (match != nil && !match.Matches(e.Name)) {
			continue
		}
		ttl := int(math.Ceil(e.Expires.Sub(now).Seconds()))
		out = append(out, models.FQDNCacheEntry{Endpoint: e.Endpoint, FQDN: e.Name, IP: e.IP.String(),
			ExpirationTime: e.Expires.UTC(), TTL: max(ttl, 0)})
	}
	writeJSON(w, http.StatusOK, out)
}
