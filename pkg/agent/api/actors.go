package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// actorFilterFrom parses GET /v1/actors' query: kind, state, min-mailbox
// (a count), stuck (a duration such as 30s).
func actorFilterFrom(q url.Values) (actors.ActorFilter, error) {
	var f actors.ActorFilter
	for key, vals := range q {
		v := vals[0]
		switch key {
		case "kind":
			f.Kind = v
		case "state":
			f.State = v
		case "min-mailbox":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return f, badRequest(fmt.Sprintf("query parameter \"min-mailbox\": %q is not a count", v))
			}
			f.MinMailbox = n
		case "stuck":
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return f, badRequest(fmt.Sprintf("query parameter \"stuck\": %q is not a duration such as 30s", v))
			}
			f.StuckFor = d
		default:
			return f, badRequest(fmt.Sprintf("unknown query parameter %q (want kind, state, min-mailbox, stuck)", key))
		}
	}
	return f, nil
}

// listActors answers the actor tree from the snapshots the actors
// publish; no mailbox is asked.
func (s *Server) listActors(w http.ResponseWriter, r *http.Request) {
	f, err := actorFilterFrom(r.URL.Query())
	if err != nil {
		writeError(w, err)
		return
	}
	now := time.Now()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	// Encoded by hand into a reused 64 KiB buffer, straight from the
	// snapshots: the same JSON as []models.Actor, without a list.
	buf := make([]byte, 0, 64<<10)
	buf = append(buf, '[')
	first, failed := true, false
	s.sys.Registry().Visit(f, now, func(snap *actors.ActorSnapshot) {
		if failed {
			return
		}
		if !first {
			buf = append(buf, ',')
		}
		first = false
		buf = appendActorJSON(buf, snap, now)
		if len(buf) > 60<<10 {
			_, err := w.Write(buf)
			failed, buf = err != nil, buf[:0]
		}
	})
	if row := s.l7ProxyRow(f); row != nil && !failed {
		if !first {
			buf = append(buf, ',')
		}
		b, _ := json.Marshal(row)
		buf = append(buf, b...)
	}
	if !failed {
		_, _ = w.Write(append(buf, "]\n"...))
	}
}

// l7ProxyPath is the L7 proxy's row in GET /v1/actors.
const l7ProxyPath = "agent/l7-proxy"

// l7ProxyRow is the L7 proxy's row (nil when L7 is off or f excludes
// it): the process the agent supervises, with the configuration
// versions it acknowledged, per endpoint too. It has no mailbox.
func (s *Server) l7ProxyRow(f actors.ActorFilter) *models.Actor {
	st := l7Status(s.sys.Datapath)
	if st == nil {
		return nil
	}
	row := &models.Actor{Path: l7ProxyPath, Kind: "l7-proxy", State: "running", Restarts: int64(st.Restarts), L7Proxy: st}
	if st.PID == 0 {
		row.State, row.LastError = "down", st.LastExit
	}
	if st.LastNack != "" {
		row.LastError = "rejected: " + st.LastNack
	}
	if (f.Kind != "" && f.Kind != row.Kind) || (f.State != "" && f.State != row.State) || f.MinMailbox > 0 || f.StuckFor > 0 {
		return nil
	}
	return row
}

// getActor answers one actor by path ("agent/endpoints/ep-12"); "ep-12"
// and "endpoint/12" are accepted for endpoint actors.
func (s *Server) getActor(w http.ResponseWriter, r *http.Request) {
	path := strings.Trim(r.PathValue("path"), "/")
	if path == l7ProxyPath || path == "l7-proxy" {
		if row := s.l7ProxyRow(actors.ActorFilter{}); row != nil {
			writeJSON(w, http.StatusOK, row)
			return
		}
	}
	reg := s.sys.Registry()
	snap, ok := reg.Get(path)
	if !ok {
		if id, isEP := strings.CutPrefix(path, "endpoint/"); isEP {
			path = "ep-" + id
		}
		if strings.HasPrefix(path, "ep-") {
			snap, ok = reg.Get(s.sys.EndpointActorPath(path))
		}
	}
	if !ok {
		writeError(w, notFound(fmt.Sprintf("actor %q not found", path)))
		return
	}
	var out models.Actor
	actorModel(&out, &snap, time.Now())
	writeJSON(w, http.StatusOK, &out)
}

func actorModel(out *models.Actor, s *actors.ActorSnapshot, now time.Time) {
	*out = models.Actor{Path: s.Path, Kind: s.Kind, State: s.State, StateSince: timeOrNil(s.StateSince),
		Operation: s.Operation, OperationSince: timeOrNil(s.OperationSince), MailboxDepth: s.MailboxDepth,
		Processed: s.Processed, Restarts: s.Restarts, LastError: s.LastError}
	if since := s.BusySince(); !since.IsZero() {
		out.BusySeconds = now.Sub(since).Seconds()
	}
	if e := s.Endpoint; e != nil {
		out.Endpoint = &models.ActorEndpoint{ID: int64(e.ID), DesiredRevision: e.DesiredRevision, RealizedRevision: e.RealizedRevision,
			RegenerationsRun: e.RegenerationsRun, RegenerationsCoalesced: e.RegenerationsCoalesced,
			RegenerationsFailed: e.RegenerationsFailed, LastRegeneration: timeOrNil(e.LastRegeneration)}
		if !e.LastRegeneration.IsZero() {
			out.Endpoint.LastPhasesMs = make(map[string]float64, len(actors.RegenPhases))
			for i, name := range actors.RegenPhases {
				out.Endpoint.LastPhasesMs[name] = float64(e.LastPhases[i].Microseconds()) / 1000
			}
		}
	}
	if r := s.Reconciler; r != nil {
		out.Reconciler = &models.ActorReconciler{Pending: r.Pending, Failed: r.Failed, Failures: r.Failures, LastError: r.LastError}
	}
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
