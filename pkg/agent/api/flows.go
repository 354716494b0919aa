package api

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent/flows"
	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// flowsRoute serves the flow log; with follow it streams, and is left out
// of the latency histogram as the event stream is.
const flowsRoute = "GET /v1/flows"

// SetFlows installs the flow log GET /v1/flows serves and GET /v1/status
// reports.
func (s *Server) SetFlows(st *flows.Store) { s.flowLog.Store(st) }

// listFlows answers GET /v1/flows: the stored flows the query's filter
// matches with the stats (models.FlowsResponse) or, with follow=true, a
// stream of NDJSON lines (models.FlowStreamLine): the stored matches, then
// each new one. A stream whose client reads too slowly is dropped by the
// store (counted); its last line says so.
func (s *Server) listFlows(w http.ResponseWriter, r *http.Request) {
	st := s.flowLog.Load()
	if st == nil {
		writeError(w, &apiError{http.StatusServiceUnavailable, CodeInternal, "the agent runs without a flow log"})
		return
	}
	f, err := flows.ParseFilter(r.URL.Query(), time.Now())
	if err != nil {
		writeError(w, badRequest(err.Error()))
		return
	}
	if !f.Follow {
		out, stats := st.Query(f)
		writeJSON(w, http.StatusOK, models.FlowsResponse{Flows: out, Stats: stats})
		return
	}
	s.followFlows(w, r, st, f)
}

func (s *Server) followFlows(w http.ResponseWriter, r *http.Request, st *flows.Store, f flows.Filter) {
	if _, ok := w.(http.Flusher); !ok {
		writeError(w, &apiError{http.StatusInternalServerError, CodeInternal, "streaming not supported by this connection"})
		return
	}
	fw, stored, err := st.Follow(f)
	if errors.Is(err, flows.ErrTooManyFollowers) {
		writeError(w, &apiError{http.StatusTooManyRequests, CodeTooManyStreams, err.Error()})
		return
	} else if err != nil {
		writeError(w, err)
		return
	}
	defer fw.Close()
	rc := http.NewResponseController(w)
	defer s.abortOnShutdown(rc)()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	send := func(fl models.Flow) error { return enc.Encode(models.FlowStreamLine{Flow: &fl}) }
	flush := func() bool {
		return s.extendWrite(rc) && bw.Flush() == nil && rc.Flush() == nil
	}
	for _, fl := range stored {
		if send(fl) != nil {
			return
		}
	}
	if !flush() {
		return
	}
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	for {
		select {
		case fl := <-fw.C():
			if send(fl) != nil {
				return
			}
			// Whatever else is ready goes in the same write.
			for more := true; more; {
				select {
				case fl := <-fw.C():
					if send(fl) != nil {
						return
					}
				default:
					more = false
				}
			}
		case <-fw.Dropped():
			for len(fw.C()) > 0 {
				if send(<-fw.C()) != nil {
					return
				}
			}
			stats := st.Stats()
			_ = enc.Encode(models.FlowStreamLine{Error: fmt.Sprintf("follower dropped: it fell %d flows behind", cap(fw.C())), Stats: &stats})
			flush()
			return
		case <-tick.C:
			if _, err := bw.WriteString("\n"); err != nil {
				return
			}
		case <-r.Context().Done():
			return
		case <-s.streamsDone:
			return
		}
		if !flush() {
			return
		}
	}
}
