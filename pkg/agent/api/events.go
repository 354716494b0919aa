package api

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/events"
)

// heartbeat is how often an idle event stream gets a comment line, so
// proxies and clients notice a dead connection.
const heartbeat = 15 * time.Second

// eventQuery parses GET /v1/events' query: type (comma-separated event
// types) and since (resume after this sequence number, like the
// Last-Event-ID header, which wins when both are given).
func eventQuery(r *http.Request) (types []events.Type, after uint64, err error) {
	q := r.URL.Query()
	for key, vals := range q {
		switch key {
		case "type":
			for _, t := range strings.Split(strings.Join(vals, ","), ",") {
				if !slices.Contains(events.Types, events.Type(t)) {
					return nil, 0, badRequest(fmt.Sprintf("query parameter \"type\": unknown event type %q (want %s)", t, typeList()))
				}
				types = append(types, events.Type(t))
			}
		case "since":
		default:
			return nil, 0, badRequest(fmt.Sprintf("unknown query parameter %q (want type, since)", key))
		}
	}
	raw := r.Header.Get("Last-Event-ID")
	name := "Last-Event-ID header"
	if raw == "" {
		raw, name = q.Get("since"), "query parameter \"since\""
	}
	if raw != "" {
		if after, err = strconv.ParseUint(raw, 10, 64); err != nil {
			return nil, 0, badRequest(fmt.Sprintf("%s: %q is not an event ID", name, raw))
		}
	}
	return types, after, nil
}

func typeList() string {
	s := make([]string, len(events.Types))
	for i, t := range events.Types {
		s[i] = string(t)
	}
	return strings.Join(s, ", ")
}

// streamEvents serves GET /v1/events as Server-Sent Events: one
// "id/event/data" record per event, a "missed" record when this client
// fell behind the hub's ring, and a comment line every heartbeat. The
// stream ends when the client goes away or the server shuts down.
func (s *Server) streamEvents(w http.ResponseWriter, r *http.Request) {
	types, after, err := eventQuery(r)
	if err != nil {
		writeError(w, err)
		return
	}
	hub := s.sys.Events()
	if hub == nil {
		writeError(w, &apiError{http.StatusServiceUnavailable, CodeInternal, "the agent runs without an event hub"})
		return
	}
	if _, ok := w.(http.Flusher); !ok {
		writeError(w, &apiError{http.StatusInternalServerError, CodeInternal, "streaming not supported by this connection"})
		return
	}
	rc := http.NewResponseController(w)
	defer s.abortOnShutdown(rc)()
	sub := hub.Subscribe(after)
	defer sub.Close()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "retry: 2000\n: membrane events after %d\n\n", after)
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	for {
		// A client that stops reading fails the write within WriteTimeout
		// and the stream ends, instead of holding the handler (and the
		// agent's shutdown) for as long as it does not read.
		if !s.extendWrite(rc) {
			return
		}
		if err := writeReady(bw, sub, types); err != nil {
			return
		}
		if bw.Flush() != nil || rc.Flush() != nil {
			return
		}
		select {
		case <-sub.Ready():
		case <-tick.C:
			fmt.Fprint(bw, ": keep-alive\n\n")
		case <-r.Context().Done():
			return
		case <-s.streamsDone:
			return
		}
	}
}

// beforeExtendWrite, when set (tests), runs before a stream extends its
// write deadline.
var beforeExtendWrite func()

// extendWrite gives a stream's next writes WriteTimeout, unless the
// server is shutting down: false then, and the stream ends. The check
// follows the extension: abortOnShutdown's deadline, set once streamsDone
// is closed, must never be overwritten by an extension made after it
// (a stream woken by an event just before Shutdown, writing to a client
// that does not read, then held the shutdown for WriteTimeout: the
// TestStalledStreamShutdown flake).
func (s *Server) extendWrite(rc *http.ResponseController) bool {
	if beforeExtendWrite != nil {
		beforeExtendWrite()
	}
	if rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout)) != nil {
		return false
	}
	select {
	case <-s.streamsDone:
		return false
	default:
		return true
	}
}

// abortOnShutdown makes a stream's write that is blocked on a client not
// reading fail at once when Shutdown starts. The returned function stops
// the watcher and waits for it: rc is never touched after the handler
// returned.
func (s *Server) abortOnShutdown(rc *http.ResponseController) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case <-s.streamsDone:
			_ = rc.SetWriteDeadline(time.Now())
		case <-done:
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}

// writeReady writes every event the subscription holds now.
func writeReady(bw *bufio.Writer, sub *events.Subscription, types []events.Type) error {
	for {
		ev, ok := sub.TryNext()
		if !ok {
			return nil
		}
		if ev.Type != events.Missed && len(types) > 0 && !slices.Contains(types, ev.Type) {
			continue
		}
		data, err := json.Marshal(&ev)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(bw, "id: %d\nevent: %s\ndata: %s\n\n", ev.Seq, ev.Type, data); err != nil {
			return err
		}
	}
}
