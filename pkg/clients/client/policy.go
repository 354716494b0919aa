package client

import (
	"context"
	"net/http"
	"net/url"
	"sort"
	"strings"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// Content types PolicyImport accepts.
const (
	ContentTypeYAML = "application/yaml"
	ContentTypeJSON = "application/json"
)

// PolicyImport imports policy documents (YAML or JSON, several separated
// by "---" or in a list); contentType may be "" (the agent sniffs). All
// or nothing: an invalid document is an *APIError with code
// "invalid-policy" naming the document and field.
func (c *Client) PolicyImport(ctx context.Context, doc []byte, contentType string) (*models.PolicyImportResponse, error) {
	var out models.PolicyImportResponse
	return &out, c.doRaw(ctx, http.MethodPut, "/v1/policy", "", contentType, doc, &out, nil)
}

// PolicyList returns the imported policies and the revision.
func (c *Client) PolicyList(ctx context.Context) (*models.PolicyList, error) {
	var out models.PolicyList
	return &out, c.do(ctx, http.MethodGet, "/v1/policy", "", nil, &out)
}

// PolicyDelete deletes the policy "namespace/name" (404 if there is none).
func (c *Client) PolicyDelete(ctx context.Context, name string) (*models.PolicyDeleteResponse, error) {
	var out models.PolicyDeleteResponse
	return &out, c.do(ctx, http.MethodDelete, "/v1/policy", url.Values{"name": {name}}.Encode(), nil, &out)
}

// PolicyDeleteMatching deletes the policy named "namespace/name", or,
// with name "", the policies matching labels ("k=v,...").
func (c *Client) PolicyDeleteMatching(ctx context.Context, name, labels string) (*models.PolicyDeleteResponse, error) {
	q := url.Values{}
	if name != "" {
		q.Set("name", name)
	}
	if labels != "" {
		q.Set("labels", labels)
	}
	var out models.PolicyDeleteResponse
	return &out, c.do(ctx, http.MethodDelete, "/v1/policy", q.Encode(), nil, &out)
}

// PolicyDeleteByLabels deletes every policy whose metadata labels include
// all of sel.
func (c *Client) PolicyDeleteByLabels(ctx context.Context, sel map[string]string) (*models.PolicyDeleteResponse, error) {
	keys := make([]string, 0, len(sel))
	for k := range sel {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + sel[k]
	}
	var out models.PolicyDeleteResponse
	return &out, c.do(ctx, http.MethodDelete, "/v1/policy", url.Values{"labels": {strings.Join(parts, ",")}}.Encode(), nil, &out)
}

// EndpointPolicy returns an endpoint's computed and realised policy.
func (c *Client) EndpointPolicy(ctx context.Context, ref string) (*models.EndpointPolicy, error) {
	var out models.EndpointPolicy
	return &out, c.do(ctx, http.MethodGet, "/v1/endpoint/"+url.PathEscape(ref)+"/policy", "", nil, &out)
}

// Drops returns every endpoint's drop counters (GET /v1/drops).
func (c *Client) Drops(ctx context.Context) ([]models.DropCounter, error) {
	var out []models.DropCounter
	return out, c.do(ctx, http.MethodGet, "/v1/drops", "", nil, &out)
}

// IPCache returns the node's ipcache.
func (c *Client) IPCache(ctx context.Context) ([]models.IPCacheEntry, error) {
	var out []models.IPCacheEntry
	return out, c.do(ctx, http.MethodGet, "/v1/ipcache", "", nil, &out)
}

// Services returns the service table; with maps, what the BPF service
// maps hold for each frontend too.
func (c *Client) Services(ctx context.Context, maps bool) (models.ServiceList, error) {
	var out models.ServiceList
	path := "/v1/service"
	if maps {
		path += "?maps=true"
	}
	return out, c.do(ctx, http.MethodGet, path, "", nil, &out)
}
