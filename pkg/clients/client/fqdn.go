package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// FQDNCache returns the names learned from DNS answers; endpoint (>= 0)
// and matchPattern ("" : any) filter.
func (c *Client) FQDNCache(ctx context.Context, endpoint int, matchPattern string) ([]models.FQDNCacheEntry, error) {
	q := url.Values{}
	if endpoint >= 0 {
		q.Set("endpoint", strconv.Itoa(endpoint))
	}
	if matchPattern != "" {
		q.Set("matchpattern", matchPattern)
	}
	path := "/v1/fqdn/cache"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out []models.FQDNCacheEntry
	return out, c.do(ctx, http.MethodGet, path, "", nil, &out)
}
