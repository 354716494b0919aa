package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

func getActors(tb testing.TB, e *apiEnv, query string) []models.Actor {
	tb.Helper()
	r := e.do(tb, "GET", "/v1/actors"+query, "")
	if r.status != http.StatusOK {
		tb.Fatalf("GET /v1/actors%s = %d %s", query, r.status, r.body)
	}
	var out []models.Actor
	decodeInto(tb, r, &out)
	return out
}

func TestActors(t *testing.T) {
	e := startHandlersAgent(t, nil)
	web := e.createPod(t, "c-web", "ns", "web")
	db := e.createPod(t, "c-db", "ns", "db")
	if _, err := e.client.EndpointRegenerate(bg(t), strconv.FormatInt(db.ID, 10)); err != nil {
		t.Fatal(err)
	}
	all := getActors(t, e, "")
	var kinds []string
	for _, a := range all {
		kinds = append(kinds, a.Kind)
	}
	if got := strings.Join(kinds, ","); got != "agent,datapath,ipam,ipcache,policy,identity,gc,nodes,services,endpoints,endpoint,endpoint" {
		t.Fatalf("actor kinds in tree order = %s", got)
	}
	if all[0].Path != "agent" || all[0].Processed == 0 || all[9].Path != "agent/endpoints" {
		t.Errorf("root or manager: %+v %+v", all[0], all[9])
	}
	ep := all[len(all)-1]
	if ep.Endpoint == nil || ep.Endpoint.ID != db.ID || ep.Path != fmt.Sprintf("agent/endpoints/ep-%d", db.ID) {
		t.Fatalf("last actor %+v, want endpoint %d", ep, db.ID)
	}
	if ep.State != "ready" || ep.Operation != "" || ep.BusySeconds != 0 || ep.Processed == 0 {
		t.Errorf("ready endpoint actor: %+v", ep)
	}
	if ep.Endpoint.RegenerationsRun != 2 || ep.Endpoint.RealizedRevision != ep.Endpoint.DesiredRevision || ep.Endpoint.LastRegeneration == nil {
		t.Errorf("endpoint part after two regenerations: %+v", ep.Endpoint)
	}
	for _, ph := range []string{"write-state", "realize", "proxy-wait", "total"} {
		if _, ok := ep.Endpoint.LastPhasesMs[ph]; !ok {
			t.Errorf("last phases %v lack %s", ep.Endpoint.LastPhasesMs, ph)
		}
	}

	tests := []struct {
		query string
		want  int
	}{
		{"?kind=endpoint", 2},
		{"?kind=ipam", 1},
		{"?state=ready", 2},
		{"?state=running", 10},
		{"?kind=endpoint&state=ready", 2},
		{"?min-mailbox=1000", 0},
		{"?stuck=1h", 0},
		{"?kind=endpoint&stuck=1ns", 0}, // ready endpoints are idle
	}
	for _, tc := range tests {
		t.Run(tc.query, func(t *testing.T) {
			if got := getActors(t, e, tc.query); len(got) != tc.want {
				t.Fatalf("%d actors, want %d: %+v", len(got), tc.want, got)
			}
		})
	}
	for _, path := range []string{fmt.Sprintf("agent/endpoints/ep-%d", web.ID), fmt.Sprintf("ep-%d", web.ID), fmt.Sprintf("endpoint/%d", web.ID)} {
		r := e.do(t, "GET", "/v1/actors/"+path, "")
		var a models.Actor
		decodeInto(t, r, &a)
		if r.status != 200 || a.Endpoint == nil || a.Endpoint.ID != web.ID {
			t.Errorf("GET /v1/actors/%s = %d %s", path, r.status, r.body)
		}
	}
	expectError(t, e.do(t, "GET", "/v1/actors/agent/nope", ""), 404, "not-found", "agent/nope")
	expectError(t, e.do(t, "GET", "/v1/actors?min-mailbox=-1", ""), 400, "invalid-argument", "min-mailbox")
	expectError(t, e.do(t, "GET", "/v1/actors?stuck=soon", ""), 400, "invalid-argument", "stuck")
	expectError(t, e.do(t, "GET", "/v1/actors?color=red", ""), 400, "invalid-argument", "color")
}

// TestActorsShowStuckEndpoint holds a regeneration in the datapath and
// finds the endpoint by its operation, without asking its mailbox.
func TestActorsShowStuckEndpoint(t *testing.T) {
	e := startHandlersAgent(t, nil)
	ready := e.createPod(t, "c-ok", "ns", "ok")
	release := make(chan struct{})
	e.fake.Set(datapath.FakeHooks{BeforeRealize: func(ctx context.Context, ep *endpoint.Endpoint, _ uint64) error {
		if int64(ep.ID) == ready.ID {
			return nil
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}})
	defer close(release)
	created := make(chan error, 1)
	go func() {
		_, err := e.client.EndpointCreate(context.Background(), "0", &models.EndpointChangeRequest{ContainerID: "c-stuck",
			K8sNamespace: "ns", K8sPodName: "stuck", Labels: []string{"k8s:app=stuck"}, SyncBuild: true})
		created <- err
	}()
	var stuck []models.Actor
	testutil.Eventually(t, "an endpoint stuck in realize", func() bool {
		stuck = getActors(t, e, "?kind=endpoint&stuck=1ms")
		return len(stuck) == 1 && stuck[0].Operation == "realize"
	})
	a := stuck[0]
	if a.State != "regenerating" || a.OperationSince == nil || a.BusySeconds <= 0 || a.Endpoint.RealizedRevision != 0 {
		t.Errorf("stuck actor: %+v", a)
	}
	release <- struct{}{}
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	if got := getActors(t, e, "?kind=endpoint&stuck=1ms"); len(got) != 0 {
		t.Fatalf("after the realize finished, stuck actors: %+v", got)
	}
}

// sseEvent is one parsed Server-Sent Event.
type sseEvent struct {
	id    string
	event string
	data  events.Event
}

// openEvents opens GET /v1/events and returns a channel of its events.
func openEvents(t *testing.T, e *apiEnv, query string, header http.Header) (<-chan sseEvent, *http.Response) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://membrane/v1/events"+query, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	c := unixHTTPClient(e.socket)
	c.Timeout = 0
	resp, err := c.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); resp.Body.Close() })
	if resp.StatusCode != 200 {
		return nil, resp
	}
	ch := make(chan sseEvent, 1024)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(resp.Body)
		var cur sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if cur.event != "" {
					ch <- cur
				}
				cur = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				cur.id = line[4:]
			case strings.HasPrefix(line, "event: "):
				cur.event = line[7:]
			case strings.HasPrefix(line, "data: "):
				if err := json.Unmarshal([]byte(line[6:]), &cur.data); err != nil && ctx.Err() == nil {
					t.Errorf("event data %q: %v", line, err)
				}
			}
		}
	}()
	return ch, resp
}

func nextEvent(t *testing.T, ch <-chan sseEvent) sseEvent {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("event stream ended")
		}
		return ev
	case <-time.After(apiWait):
		t.Fatal("no event within the wait")
	}
	return sseEvent{}
}

func TestEventStream(t *testing.T) {
	e := startHandlersAgent(t, nil)
	ch, _ := openEvents(t, e, "", nil)
	ep := e.createPod(t, "c-ev", "ns", "ev")
	ref := strconv.FormatInt(ep.ID, 10)
	if _, err := e.client.EndpointPatchLabels(bg(t), ref, []string{"k8s:tier=x"}, nil); err != nil {
		t.Fatal(err)
	}
	waitReady(t, e, ref)
	if err := e.client.EndpointDelete(bg(t), ref); err != nil {
		t.Fatal(err)
	}
	var got []string
	lastID := 0
	for {
		ev := nextEvent(t, ch)
		id, _ := strconv.Atoi(ev.id)
		if id <= lastID || ev.data.Seq != uint64(id) || ev.event != string(ev.data.Type) {
			t.Fatalf("event %+v after id %d", ev, lastID)
		}
		lastID = id
		s := ev.event
		if ev.data.State != "" {
			s += ":" + ev.data.State
		}
		if ev.data.Endpoint != 0 && int64(ev.data.Endpoint) != ep.ID {
			t.Errorf("event about endpoint %d, want %d", ev.data.Endpoint, ep.ID)
		}
		got = append(got, s)
		if ev.event == string(events.EndpointDeleted) {
			break
		}
	}
	text := strings.Join(got, " ")
	for _, want := range []string{
		"endpoint-created:waiting-for-identity", "identity-allocated", "endpoint-state-changed:ready",
		"endpoint-state-changed:waiting-for-identity", "endpoint-state-changed:disconnecting", "identity-released",
		"endpoint-deleted:disconnected",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("events %q lack %s", text, want)
		}
	}
	if !strings.HasPrefix(text, "endpoint-created") || !strings.HasSuffix(text, "endpoint-deleted:disconnected") {
		t.Errorf("events out of order: %s", text)
	}

	// Resume with Last-Event-ID: the events after it, filtered by type.
	resumed, _ := openEvents(t, e, "?type=endpoint-deleted,identity-released", http.Header{"Last-Event-ID": {"1"}})
	first := nextEvent(t, resumed)
	if first.event != "identity-released" && first.event != "endpoint-deleted" {
		t.Fatalf("resumed stream starts with %+v", first)
	}
	r := e.do(t, "GET", "/v1/events?type=nope", "")
	expectError(t, r, 400, "invalid-argument", "nope")
	expectError(t, e.do(t, "GET", "/v1/events?since=x", ""), 400, "invalid-argument", "since")
}

// TestEventStreamMissed resumes from an event the ring no longer holds:
// the client is told how many it missed, then gets the rest.
func TestEventStreamMissed(t *testing.T) {
	e := startHandlersAgent(t, nil)
	hub := e.agent.System.Events()
	total := events.DefaultCapacity + 100
	for i := 0; i < total; i++ {
		hub.Publish(events.Event{Type: events.DatapathDrop, Message: "test"})
	}
	ch, _ := openEvents(t, e, "?since=10", nil)
	first := nextEvent(t, ch)
	if first.event != "missed" || first.data.Missed != 90 || first.id != "100" {
		t.Fatalf("first event %+v, want a missed marker for events 11..100", first)
	}
	if next := nextEvent(t, ch); next.id != "101" {
		t.Fatalf("after the marker: %+v, want id 101", next)
	}
}

// TestEventStreamEndsOnShutdown checks that an open stream does not hold
// the agent's shutdown.
func TestEventStreamEndsOnShutdown(t *testing.T) {
	e := startHandlersAgent(t, nil)
	ch, _ := openEvents(t, e, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), apiWait)
	defer cancel()
	if err := e.agent.Stop(ctx); err != nil {
		t.Fatalf("stop with an open event stream: %v", err)
	}
	for range ch { // the stream ends
	}
}

func startHTTPAgent(t *testing.T, pprof bool) (*apiEnv, *http.Client, string) {
	t.Helper()
	e := startHandlersAgent(t, func(c *agent.Config) {
		c.HTTPAddr = "127.0.0.1:0"
		c.API.Pprof = pprof
	})
	addr := e.agent.HTTPAddr()
	if addr == "" {
		t.Fatal("no HTTP listener")
	}
	c := &http.Client{Timeout: apiWait}
	t.Cleanup(c.CloseIdleConnections)
	return e, c, "http://" + addr
}

func httpDo(t *testing.T, c *http.Client, method, url, body string) response {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, _ = bufio.NewReader(resp.Body).WriteTo(&b)
	return response{status: resp.StatusCode, header: resp.Header, body: []byte(b.String())}
}

// TestListeners: the socket (mode 0660) serves everything; the HTTP
// listener serves reads and /metrics and refuses every mutating call.
func TestListeners(t *testing.T) {
	e, c, base := startHTTPAgent(t, false)
	fi, err := os.Stat(e.socket)
	if err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode %v (%v), want 0660", fi.Mode(), err)
	}
	ep := e.createPod(t, "c-l", "ns", "l") // a write through the socket
	for _, path := range []string{"/v1/status", "/v1/endpoint", fmt.Sprintf("/v1/endpoint/%d", ep.ID), "/v1/actors", "/v1/identity", "/v1/ipam", "/metrics"} {
		if r := httpDo(t, c, "GET", base+path, ""); r.status != 200 {
			t.Errorf("HTTP GET %s = %d %s", path, r.status, r.body)
		}
	}
	tests := []struct{ method, path, body string }{
		{"PUT", "/v1/endpoint/0", `{"container-id":"x","labels":["k8s:a=b"]}`},
		{"DELETE", fmt.Sprintf("/v1/endpoint/%d", ep.ID), ""},
		{"PATCH", fmt.Sprintf("/v1/endpoint/%d/labels", ep.ID), `{"add":["k8s:x=y"]}`},
		{"POST", fmt.Sprintf("/v1/endpoint/%d/regenerate", ep.ID), ""},
		{"POST", "/v1/ipam", ""},
		{"DELETE", "/v1/ipam/10.201.0.5", ""},
		{"POST", "/v1/gc", "{}"},
		{"PUT", "/v1/policy", "{}"},
		{"DELETE", "/v1/policy?name=a/b", ""},
		{"POST", "/v1/nonexistent", ""},
	}
	for _, tc := range tests {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			expectError(t, httpDo(t, c, tc.method, base+tc.path, tc.body), 403, "read-only-listener", "read-only")
		})
	}
	if got, err := e.client.EndpointGet(bg(t), strconv.FormatInt(ep.ID, 10)); err != nil || got.Regenerations != 1 || len(got.Labels) != 1 {
		t.Fatalf("the endpoint changed through the read-only listener: %+v %v", got, err)
	}
	if r := httpDo(t, c, "GET", base+"/debug/pprof/", ""); r.status != 404 {
		t.Errorf("pprof without --pprof: %d", r.status)
	}
	// The socket still takes writes.
	if _, err := e.client.EndpointRegenerate(bg(t), strconv.FormatInt(ep.ID, 10)); err != nil {
		t.Fatalf("regenerate through the socket: %v", err)
	}
}

func TestPprof(t *testing.T) {
	e, c, base := startHTTPAgent(t, true)
	if r := httpDo(t, c, "GET", base+"/debug/pprof/goroutine?debug=1", ""); r.status != 200 || !strings.Contains(string(r.body), "goroutine") {
		t.Fatalf("pprof over HTTP: %d", r.status)
	}
	if r := e.do(t, "GET", "/debug/pprof/", ""); r.status != 200 {
		t.Fatalf("pprof over the socket: %d", r.status)
	}
}

// TestMetricsScrape scrapes /metrics after some traffic and checks the
// series the issue asks for.
func TestMetricsScrape(t *testing.T) {
	e, c, base := startHTTPAgent(t, false)
	for i := range 3 {
		e.createPod(t, fmt.Sprintf("c-m%d", i), "ns", fmt.Sprintf("m%d", i))
	}
	e.do(t, "GET", "/v1/endpoint/999", "")
	r := httpDo(t, c, "GET", base+"/metrics", "")
	if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") {
		t.Fatalf("GET /metrics = %d %s", r.status, r.header.Get("Content-Type"))
	}
	body := string(r.body)
	for _, want := range []string{
		`membrane_api_request_duration_seconds_count{code="201",method="PUT",route="PUT /v1/endpoint/{id}"} 3`,
		`membrane_api_request_duration_seconds_count{code="201",method="POST",route="POST /v1/ipam"} 3`,
		`membrane_api_request_duration_seconds_count{code="404",method="GET",route="GET /v1/endpoint/{id}"} 1`,
		`membrane_endpoint_regeneration_duration_seconds_count{phase="total"} 3`,
		`membrane_endpoint_regeneration_duration_seconds_count{phase="realize"} 3`,
		`membrane_endpoint_regeneration_duration_seconds_count{phase="write-state"} 3`,
		`membrane_endpoints{state="ready"} 3`,
		`membrane_ipam_used_addresses{family="ipv4"} 3`,
		`membrane_ipam_free_addresses{family="ipv4"} `,
		`membrane_identities 3`,
		`membrane_actor_mailbox_depth{kind="endpoint"} `,
		`membrane_actor_mailbox_depth_max{kind="ipam"} `,
		`membrane_restore_duration_seconds `,
		`go_goroutines `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(body, "cni_delete_queue_length") {
		t.Error("delete queue length reported without a queue directory")
	}
	// The socket serves the same metrics.
	if r := e.do(t, "GET", "/metrics", ""); r.status != 200 || !strings.Contains(string(r.body), `membrane_endpoints{state="ready"} 3`) {
		t.Errorf("GET /metrics on the socket = %d", r.status)
	}
}

func TestMetricsDeleteQueue(t *testing.T) {
	dir := t.TempDir()
	e := startHandlersAgent(t, func(c *agent.Config) { c.DeleteQueueDir = dir })
	r := e.do(t, "GET", "/metrics", "")
	if !strings.Contains(string(r.body), "membrane_cni_delete_queue_length 0") {
		t.Fatalf("/metrics lacks the delete queue length")
	}
}

func TestEndpointQueries(t *testing.T) {
	e := startHandlersAgent(t, nil)
	var ids []int64
	for i, spec := range []struct{ ns, name, app, tier string }{
		{"a", "web-0", "web", "front"}, {"a", "web-1", "web", "front"}, {"a", "db-0", "db", "db"},
		{"b", "web-0", "web", "front"}, {"b", "cache-0", "cache", "db"},
	} {
		ep := e.createPod(t, fmt.Sprintf("c-q%d", i), spec.ns, spec.name, "k8s:app="+spec.app, "k8s:tier="+spec.tier)
		ids = append(ids, ep.ID)
	}
	first, _ := e.client.EndpointGet(bg(t), strconv.FormatInt(ids[0], 10))
	tests := []struct {
		query string
		want  []int64
	}{
		{"?selector=app%3Dweb", []int64{ids[0], ids[1], ids[3]}},
		{"?selector=app%3Dweb,tier!%3Ddb&namespace=a", []int64{ids[0], ids[1]}},
		{"?selector=tier%3Ddb,app!%3Ddb", []int64{ids[4]}},
		{"?selector=!app", nil},
		{"?ip=" + first.Addressing.IPv4, []int64{ids[0]}},
		{"?ip=" + first.Addressing.IPv4 + "&namespace=b", nil},
		{"?ip=10.201.0.250", nil},
		{"?state=ready&selector=k8s:tier%3Ddb", []int64{ids[2], ids[4]}},
		{"?limit=2", []int64{ids[0], ids[1]}},
		{fmt.Sprintf("?limit=2&after=%d", ids[1]), []int64{ids[2], ids[3]}},
		{fmt.Sprintf("?limit=2&after=%d", ids[3]), []int64{ids[4]}},
		{fmt.Sprintf("?selector=app%%3Dweb&limit=1&after=%d", ids[0]), []int64{ids[1]}},
	}
	for _, tc := range tests {
		t.Run(tc.query, func(t *testing.T) {
			r := e.do(t, "GET", "/v1/endpoint"+tc.query, "")
			var eps []models.Endpoint
			decodeInto(t, r, &eps)
			var got []int64
			for _, ep := range eps {
				got = append(got, ep.ID)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
	r := e.do(t, "GET", "/v1/endpoint?limit=2", "")
	if link := r.header.Get("Link"); !strings.Contains(link, fmt.Sprintf("after=%d", ids[1])) || !strings.Contains(link, `rel="next"`) {
		t.Errorf("Link %q", link)
	}
	if total := r.header.Get("X-Total-Count"); total != "5" {
		t.Errorf("X-Total-Count %q", total)
	}
	if r := e.do(t, "GET", "/v1/endpoint?limit=5", ""); r.header.Get("Link") != "" {
		t.Errorf("last page has a Link header %q", r.header.Get("Link"))
	}
	for q, name := range map[string]string{"?ip=nope": "ip", "?selector=a%3D%3D": "", "?selector=%3Db": "selector", "?limit=0": "limit", "?limit=x": "limit", "?after=-1": "after"} {
		r := e.do(t, "GET", "/v1/endpoint"+q, "")
		if name == "" {
			if r.status != 200 { // "a==" is a=""
				t.Errorf("%s = %d", q, r.status)
			}
			continue
		}
		expectError(t, r, 400, "invalid-argument", name)
	}
}
