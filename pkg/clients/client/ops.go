package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/events"
)

// NewURL returns a client for an agent's HTTP listener (--http-addr), e.g.
// "http://127.0.0.1:9890". That listener only serves reads.
func NewURL(base string) (*Client, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("server URL %q: want http://host:port", base)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	return &Client{http: &http.Client{Transport: tr}, base: strings.TrimRight(u.String(), "/")}, nil
}

// EndpointPage lists one page of endpoints (filter keys: namespace, pod,
// state, identity, label, selector, ip, limit, after). next is the
// "after" of the following page, 0 on the last; total counts every match.
func (c *Client) EndpointPage(ctx context.Context, filter url.Values) (eps []*models.Endpoint, next int64, total int, err error) {
	var h http.Header
	if err := c.doRaw(ctx, http.MethodGet, "/v1/endpoint", filter.Encode(), "", nil, &eps, &h); err != nil {
		return nil, 0, 0, err
	}
	total, _ = strconv.Atoi(h.Get("X-Total-Count"))
	if link := h.Get("Link"); link != "" {
		if i := strings.Index(link, "after="); i >= 0 {
			if end := strings.IndexAny(link[i+6:], "&>"); end > 0 {
				next, _ = strconv.ParseInt(link[i+6:i+6+end], 10, 64)
			}
		}
	}
	return eps, next, total, nil
}

// Actors lists the actor snapshots; filter keys: kind, state,
// min-mailbox, stuck.
func (c *Client) Actors(ctx context.Context, filter url.Values) ([]*models.Actor, error) {
	var out []*models.Actor
	return out, c.do(ctx, http.MethodGet, "/v1/actors", filter.Encode(), nil, &out)
}

// Actor returns one actor by path ("agent/endpoints/ep-3", "ep-3").
func (c *Client) Actor(ctx context.Context, path string) (*models.Actor, error) {
	var out models.Actor
	return &out, c.do(ctx, http.MethodGet, "/v1/actors/"+strings.TrimLeft(path, "/"), "", nil, &out)
}

// Events follows GET /v1/events and calls fn for every event (a Missed
// marker included) until fn returns false, ctx ends or the stream ends.
// filter keys: type (comma-separated), since.
func (c *Client) Events(ctx context.Context, filter url.Values, fn func(events.Event) bool) error {
	u := c.base + "/v1/events"
	if len(filter) > 0 {
		u += "?" + filter.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("GET /v1/events: %w", err)
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("GET /v1/events: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var me models.Error
		if json.NewDecoder(resp.Body).Decode(&me) != nil || me.Code == "" {
			me = models.Error{Code: "http-" + strconv.Itoa(resp.StatusCode)}
		}
		return &APIError{Status: resp.StatusCode, Code: me.Code, Message: me.Message}
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue // id, event, retry and comment lines: data carries all
		}
		var ev events.Event
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return fmt.Errorf("GET /v1/events: decode %q: %w", data, err)
		}
		if !fn(ev) {
			return nil
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("GET /v1/events: %w", err)
	}
	return fmt.Errorf("GET /v1/events: the agent ended the stream")
}
