package api

import (
	"encoding/json"
	"math"
	"sort"
	"strconv"
	"time"

	"github.com/membrane-cni/membrane/actors"
)

// appendActorJSON appends the JSON of the snapshot's models.Actor to b,
// byte for byte what encoding/json produces for it (a test checks this).
// GET /v1/actors encodes up to 65,000 actors; reflection-based encoding
// took most of its time.
func appendActorJSON(b []byte, s *actors.ActorSnapshot, now time.Time) []byte {
	b = append(b, `{"path":`...)
	b = appendJSONString(b, s.Path)
	b = append(b, `,"kind":`...)
	b = appendJSONString(b, s.Kind)
	b = append(b, `,"state":`...)
	b = appendJSONString(b, s.State)
	b = appendJSONTime(b, `,"state-since":`, s.StateSince)
	if s.Operation != "" {
		b = append(b, `,"operation":`...)
		b = appendJSONString(b, s.Operation)
	}
	b = appendJSONTime(b, `,"operation-since":`, s.OperationSince)
	if since := s.BusySince(); !since.IsZero() {
		if f := now.Sub(since).Seconds(); f != 0 {
			b = append(b, `,"busy-seconds":`...)
			b = appendJSONFloat(b, f)
		}
	}
	b = append(b, `,"mailbox-depth":`...)
	b = strconv.AppendInt(b, s.MailboxDepth, 10)
	b = append(b, `,"processed":`...)
	b = strconv.AppendInt(b, s.Processed, 10)
	b = append(b, `,"restarts":`...)
	b = strconv.AppendInt(b, s.Restarts, 10)
	if s.LastError != "" {
		b = append(b, `,"last-error":`...)
		b = appendJSONString(b, s.LastError)
	}
	if e := s.Endpoint; e != nil {
		b = append(b, `,"endpoint":{"id":`...)
		b = strconv.AppendInt(b, int64(e.ID), 10)
		for _, f := range []struct {
			key string
			v   uint64
		}{{`,"desired-revision":`, e.DesiredRevision}, {`,"realized-revision":`, e.RealizedRevision},
			{`,"regenerations-run":`, e.RegenerationsRun}, {`,"regenerations-coalesced":`, e.RegenerationsCoalesced},
			{`,"regenerations-failed":`, e.RegenerationsFailed}} {
			b = append(b, f.key...)
			b = strconv.AppendUint(b, f.v, 10)
		}
		b = appendJSONTime(b, `,"last-regeneration":`, e.LastRegeneration)
		if !e.LastRegeneration.IsZero() {
			b = appendPhases(b, e.LastPhases)
		}
		b = append(b, '}')
	}
	if r := s.Reconciler; r != nil {
		b = append(b, `,"reconciler":{"pending":`...)
		b = strconv.AppendInt(b, int64(r.Pending), 10)
		b = append(b, `,"failed":`...)
		b = strconv.AppendInt(b, int64(r.Failed), 10)
		b = append(b, `,"failures":`...)
		b = strconv.AppendInt(b, int64(r.Failures), 10)
		if r.LastError != "" {
			b = append(b, `,"last-error":`...)
			b = appendJSONString(b, r.LastError)
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

// phaseOrder is RegenPhases' indexes in key order, as encoding/json
// writes map keys.
var phaseOrder = func() []int {
	idx := []int{0, 1, 2, 3}
	sort.Slice(idx, func(i, j int) bool { return actors.RegenPhases[idx[i]] < actors.RegenPhases[idx[j]] })
	return idx
}()

// appendPhases writes last-phases-ms with its keys sorted.
func appendPhases(b []byte, phases [4]time.Duration) []byte {
	b = append(b, `,"last-phases-ms":{`...)
	for n, i := range phaseOrder {
		if n > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, actors.RegenPhases[i])
		b = append(b, ':')
		b = appendJSONFloat(b, float64(phases[i].Microseconds())/1000)
	}
	return append(b, '}')
}

func appendJSONTime(b []byte, key string, t time.Time) []byte {
	if t.IsZero() {
		return b
	}
	b = append(b, key...)
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

// appendJSONFloat writes f as encoding/json does for ordinary values,
// falling back to it for exponents.
func appendJSONFloat(b []byte, f float64) []byte {
	if a := math.Abs(f); a != 0 && (a < 1e-6 || a >= 1e21) {
		q, _ := json.Marshal(f)
		return append(b, q...)
	}
	return strconv.AppendFloat(b, f, 'f', -1, 64)
}
