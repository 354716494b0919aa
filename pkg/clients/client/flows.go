package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// Flows answers GET /v1/flows: the stored flows filter matches, and the
// flow log's stats. filter keys: from-pod, to-pod, from-label, to-label,
// namespace, verdict, protocol, port, since, last.
func (c *Client) Flows(ctx context.Context, filter url.Values) (*models.FlowsResponse, error) {
	var out models.FlowsResponse
	return &out, c.do(ctx, http.MethodGet, "/v1/flows", filter.Encode(), nil, &out)
}

// FollowFlows follows GET /v1/flows?follow=true (filter as Flows') and
// calls fn for every flow, the stored matches first, until fn returns
// false or ctx ends (nil), or the agent ends the stream: a follower it
// dropped for reading too slowly gets an error saying so, with the stats.
func (c *Client) FollowFlows(ctx context.Context, filter url.Values, fn func(models.Flow) bool) error {
	q := url.Values{}
	for k, v := range filter {
		q[k] = v
	}
	q.Set("follow", "true")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/flows?"+q.Encode(), nil)
	if err != nil {
		return fmt.Errorf("GET /v1/flows: %w", err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("GET /v1/flows: %w", err)
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
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue // keep-alive
		}
		var l models.FlowStreamLine
		if err := json.Unmarshal(line, &l); err != nil {
			return fmt.Errorf("GET /v1/flows: decode %q: %w", line, err)
		}
		if l.Error != "" {
			return &FlowStreamError{Message: l.Error, Stats: l.Stats}
		}
		if l.Flow != nil && !fn(*l.Flow) {
			return nil
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("GET /v1/flows: %w", err)
	}
	return errors.New("GET /v1/flows: the agent ended the stream")
}

// FlowStreamError is how a follow stream ended on the agent's side (a
// follower dropped for reading too slowly).
type FlowStreamError struct {
	Message string
	Stats   *models.FlowStats
}

func (e *FlowStreamError) Error() string { return "GET /v1/flows: " + e.Message }
