// Package client is the Go client of the agent's REST API on its unix
// socket, used by membrane-cni, membranectl, the simulator and tests.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// APIError is an error answered by the agent.
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("agent: %d %s: %s", e.Status, e.Code, e.Message)
}

// IsNotFound reports whether err is the agent's 404.
func IsNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound
}

// IsCode reports whether err is an agent error with the given code.
func IsCode(err error, code string) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Code == code
}

// Client talks to one agent.
type Client struct {
	http *http.Client
	base string // "http://membrane" for the socket, or the --server URL
}

// New returns a client for the agent listening on socketPath.
func New(socketPath string) *Client {
	tr := newConnTransport(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socketPath)
	})
	return &Client{http: &http.Client{Transport: tr}, base: "http://membrane"}
}

// Close drops idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// do sends a request with the encoded query (may be empty) and decodes a
// 2xx JSON answer into out (may be nil).
func (c *Client) do(ctx context.Context, method, path, query string, body, out any) error {
	if body == nil {
		return c.doRaw(ctx, method, path, query, "", nil, out, nil)
	}
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("%s %s: encode: %w", method, path, err)
	}
	return c.doRaw(ctx, method, path, query, "application/json", b, out, nil)
}

// doRaw sends body (nil: none) with the given Content-Type and the
// encoded query (may be empty), and decodes a 2xx JSON answer into out
// (may be nil; a *[]byte gets the raw body). If header is not nil it
// receives the answer's headers.
func (c *Client) doRaw(ctx context.Context, method, path, query, contentType string, body []byte, out any, header *http.Header) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	u := c.base + path
	if query != "" {
		u += "?" + query
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	switch contentType {
	case "":
	case "application/json":
		req.Header["Content-Type"] = jsonContentType // shared, never modified
	default:
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if header != nil {
		*header = resp.Header
	}
	buf := bufPool.Get().(*bytes.Buffer)
	defer putBuf(buf)
	buf.Reset()
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		return fmt.Errorf("%s %s: read: %w", method, path, err)
	}
	data := buf.Bytes() // valid until putBuf: decoded values and errors copy
	if resp.StatusCode == http.StatusServiceUnavailable && out != nil && method == http.MethodGet {
		// GET /v1/status and /healthz bodies carry state while starting.
		_ = json.Unmarshal(data, out)
	}
	if resp.StatusCode/100 != 2 {
		var me models.Error
		if json.Unmarshal(data, &me) != nil || me.Code == "" {
			me = models.Error{Code: "http-" + strconv.Itoa(resp.StatusCode), Message: string(data)}
		}
		return &APIError{Status: resp.StatusCode, Code: me.Code, Message: me.Message}
	}
	if out == nil {
		return nil
	}
	if err := decodeAnswer(data, out); err != nil {
		return fmt.Errorf("%s %s: decode: %w", method, path, err)
	}
	return nil
}

// decodeAnswer decodes a 2xx answer into out: a copy of the bytes into a
// *[]byte, the hand decoders for the answers they know, encoding/json
// otherwise.
func decodeAnswer(data []byte, out any) error {
	switch v := out.(type) {
	case *[]byte:
		*v = bytes.Clone(data)
		return nil
	case *models.Endpoint:
		if decodeEndpoint(data, v) {
			return nil
		}
	case *models.IPAMResponse:
		if decodeIPAM(data, v) {
			return nil
		}
	}
	return json.Unmarshal(data, out)
}

// jsonContentType is the Content-Type header value of request bodies,
// assigned to request headers without a copy: nothing modifies it.
var jsonContentType = []string{"application/json"}

// bufPool holds the buffers answers are read into (json.Unmarshal copies
// what it keeps).
var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledBuf is the largest buffer kept in bufPool: a large answer
// (an endpoint list) is not held on to.
const maxPooledBuf = 64 << 10

func putBuf(b *bytes.Buffer) {
	if b.Cap() <= maxPooledBuf {
		bufPool.Put(b)
	}
}

// Healthz checks that the agent answers.
func (c *Client) Healthz(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/v1/healthz", "", nil, nil)
}

// Status returns the agent's status (an *APIError with status 503 while
// it is starting, with the body still decoded into the result).
func (c *Client) Status(ctx context.Context) (*models.Status, error) {
	var st models.Status
	return &st, c.do(ctx, http.MethodGet, "/v1/status", "", nil, &st)
}

// Health returns GET /v1/health: the health endpoint and every remote
// node's reachability.
func (c *Client) Health(ctx context.Context) (*models.HealthReport, error) {
	var h models.HealthReport
	return &h, c.do(ctx, http.MethodGet, "/v1/health", "", nil, &h)
}

// WaitReady polls Status until the agent reports "ok" (restore done, the
// delete queue drained), ctx ends, or gone closes (the agent's process
// exited); it returns the last error seen with the reason it stopped.
func (c *Client) WaitReady(ctx context.Context, gone <-chan struct{}) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := c.Status(sctx)
		cancel()
		if err == nil && st.State == "ok" {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("agent state %q", st.State)
		}
		select {
		case <-gone:
			return fmt.Errorf("agent exited before it was ready: %w", err)
		case <-ctx.Done():
			return fmt.Errorf("agent not ready: %w (last: %w)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// EndpointCreate creates an endpoint; ref is "0" (agent picks the ID), a
// number, "container-id:<id>" or "pod-name:<ns>/<pod>".
func (c *Client) EndpointCreate(ctx context.Context, ref string, req *models.EndpointChangeRequest) (*models.Endpoint, error) {
	var ep models.Endpoint
	return &ep, c.do(ctx, http.MethodPut, "/v1/endpoint/"+url.PathEscape(ref), "", req, &ep)
}

// EndpointGet returns one endpoint.
func (c *Client) EndpointGet(ctx context.Context, ref string) (*models.Endpoint, error) {
	var ep models.Endpoint
	return &ep, c.do(ctx, http.MethodGet, "/v1/endpoint/"+url.PathEscape(ref), "", nil, &ep)
}

// EndpointList lists endpoints; filter keys: namespace, pod, state, identity, label.
func (c *Client) EndpointList(ctx context.Context, filter url.Values) ([]*models.Endpoint, error) {
	var eps []*models.Endpoint
	return eps, c.do(ctx, http.MethodGet, "/v1/endpoint", filter.Encode(), nil, &eps)
}

// EndpointDelete deletes one endpoint.
func (c *Client) EndpointDelete(ctx context.Context, ref string) error {
	return c.do(ctx, http.MethodDelete, "/v1/endpoint/"+url.PathEscape(ref), "", nil, nil)
}

// EndpointDeleteByContainer deletes the endpoint of a container.
func (c *Client) EndpointDeleteByContainer(ctx context.Context, containerID string) error {
	return c.do(ctx, http.MethodDelete, "/v1/endpoint", "", &models.EndpointBatchDeleteRequest{ContainerID: containerID}, nil)
}

// EndpointPatchLabels adds and deletes labels.
func (c *Client) EndpointPatchLabels(ctx context.Context, ref string, add, del []string) (*models.Endpoint, error) {
	var ep models.Endpoint
	return &ep, c.do(ctx, http.MethodPatch, "/v1/endpoint/"+url.PathEscape(ref)+"/labels", "", &models.LabelsPatch{Add: add, Delete: del}, &ep)
}

// EndpointRegenerate asks for a regeneration and waits for it.
func (c *Client) EndpointRegenerate(ctx context.Context, ref string) (*models.Endpoint, error) {
	var ep models.Endpoint
	return &ep, c.do(ctx, http.MethodPost, "/v1/endpoint/"+url.PathEscape(ref)+"/regenerate", "", nil, &ep)
}

// EndpointHealth checks one endpoint.
func (c *Client) EndpointHealth(ctx context.Context, ref string) (*models.EndpointHealth, error) {
	var h models.EndpointHealth
	return &h, c.do(ctx, http.MethodGet, "/v1/endpoint/"+url.PathEscape(ref)+"/healthz", "", nil, &h)
}

// IPAMAllocate allocates an address of family ("ipv4", "ipv6", "" for all).
func (c *Client) IPAMAllocate(ctx context.Context, family, owner string) (*models.IPAMResponse, error) {
	var r models.IPAMResponse
	return &r, c.do(ctx, http.MethodPost, "/v1/ipam", ipamQuery(family, owner), nil, &r)
}

// ipamQuery encodes POST /v1/ipam's query as url.Values.Encode would
// (keys sorted), without building the map.
func ipamQuery(family, owner string) string {
	switch {
	case family == "" && owner == "":
		return ""
	case owner == "":
		return "family=" + url.QueryEscape(family)
	case family == "":
		return "owner=" + url.QueryEscape(owner)
	}
	return "family=" + url.QueryEscape(family) + "&owner=" + url.QueryEscape(owner)
}

// IPAMRelease releases an address (no-op if it is not allocated).
func (c *Client) IPAMRelease(ctx context.Context, ip string) error {
	return c.do(ctx, http.MethodDelete, "/v1/ipam/"+url.PathEscape(ip), "", nil, nil)
}

// IPAMReleaseOwned releases an address only if owner still owns it (409
// address-in-use otherwise): what a CNI rollback uses, so it never frees
// an address another pod was given after an agent restart.
func (c *Client) IPAMReleaseOwned(ctx context.Context, ip, owner string) error {
	return c.do(ctx, http.MethodDelete, "/v1/ipam/"+url.PathEscape(ip), url.Values{"owner": {owner}}.Encode(), nil, nil)
}

// IPAMStatus returns the pools and their allocations.
func (c *Client) IPAMStatus(ctx context.Context) (*models.IPAMStatus, error) {
	var st models.IPAMStatus
	return &st, c.do(ctx, http.MethodGet, "/v1/ipam", "", nil, &st)
}

// Identities lists identities.
func (c *Client) Identities(ctx context.Context) ([]*models.Identity, error) {
	var ids []*models.Identity
	return ids, c.do(ctx, http.MethodGet, "/v1/identity", "", nil, &ids)
}

// Identity returns one identity.
func (c *Client) Identity(ctx context.Context, id int64) (*models.Identity, error) {
	var ident models.Identity
	return &ident, c.do(ctx, http.MethodGet, "/v1/identity/"+strconv.FormatInt(id, 10), "", nil, &ident)
}
