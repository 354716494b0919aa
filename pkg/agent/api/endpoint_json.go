package api

import (
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// The endpoint answers (PUT, regenerate, DELETE, GET, PATCH labels and
// lists of endpoints) are most of the API's traffic. They are encoded by
// hand from the index record, byte for byte as json.Encoder encodes the
// record's model (endpoint.Endpoint.Model with the identity's model:
// field order, omitempty, HTML escaping, one trailing newline), without
// building the model: reflection and the model's strings made encoding
// the largest part of an answer's cost. TestEndpointJSON and
// FuzzEndpointJSON compare both encodings.

// identityView is what an endpoint answer shows of its identity: the
// fields of Server.identityModel, without building the model.
type identityView struct {
	id       int64
	labels   labels.Labels
	refCount int
	reserved bool
}

// identityView reads id as identityModel does.
func (s *Server) identityView(id identity.NumericIdentity) identityView {
	if ls, ok := identity.ReservedLabels(id); ok {
		return identityView{id: int64(id), labels: ls, reserved: true}
	}
	row, ok := s.ix.Identity(id)
	if !ok {
		return identityView{id: int64(id)}
	}
	return identityView{id: int64(row.ID), labels: row.Labels, refCount: row.RefCount}
}

// writeEndpoint answers status with the endpoint's model, as
// writeJSON(w, status, s.model(ep)) does.
func (s *Server) writeEndpoint(w http.ResponseWriter, status int, ep *endpoint.Endpoint) {
	var ident *identityView
	if ep.Identity != identity.IdentityUnknown {
		v := s.identityView(ep.Identity)
		ident = &v
	}
	bp := jsonBuffers.Get().(*[]byte)
	defer putJSONBuffer(bp)
	b, ok := appendEndpointRecord((*bp)[:0], ep, ident)
	*bp = b
	if !ok {
		writeJSON(w, status, s.model(ep))
		return
	}
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// writeEndpoints answers 200 with the endpoints' models, as writeJSON of
// the list of their models does. The answer is written as it is encoded,
// in pieces of about streamChunk bytes: a list of 10,000 endpoints does
// not grow a buffer to megabytes.
func (s *Server) writeEndpoints(w http.ResponseWriter, eps []*endpoint.Endpoint) {
	for _, ep := range eps {
		if !jsonTimeOK(ep.Created) || !jsonTimeOK(ep.StateChanged) {
			out := make([]*models.Endpoint, 0, len(eps))
			for _, ep := range eps {
				out = append(out, s.model(ep))
			}
			writeJSON(w, http.StatusOK, out) // encoding/json decides
			return
		}
	}
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(http.StatusOK)
	idents := map[identity.NumericIdentity]*identityView{} // a few, shared by many endpoints
	bp := jsonBuffers.Get().(*[]byte)
	defer putJSONBuffer(bp)
	b := append((*bp)[:0], '[')
	for i, ep := range eps {
		ident, seen := idents[ep.Identity]
		if !seen && ep.Identity != identity.IdentityUnknown {
			v := s.identityView(ep.Identity)
			ident = &v
			idents[ep.Identity] = ident
		}
		if i > 0 {
			b = append(b, ',')
		}
		b, _ = appendEndpointRecord(b, ep, ident) // times checked above
		if len(b) >= streamChunk {
			_, _ = w.Write(b)
			b = b[:0]
		}
	}
	b = append(b, ']', '\n')
	*bp = b
	_, _ = w.Write(b)
}

// streamChunk is the size at which writeEndpoints hands what it encoded
// to the connection.
const streamChunk = 32 << 10

// appendEndpointRecord appends the JSON of e's model with ident's
// identity (nil: none), or reports false if the record holds a time
// encoding/json refuses (then the caller encodes the model with it).
func appendEndpointRecord(b []byte, e *endpoint.Endpoint, ident *identityView) ([]byte, bool) {
	if !jsonTimeOK(e.Created) || !jsonTimeOK(e.StateChanged) {
		return b, false
	}
	b = append(b, `{"id":`...)
	b = strconv.AppendInt(b, int64(e.ID), 10)
	b = append(b, `,"state":`...)
	b = appendJSONString(b, string(e.State))
	b = appendOptString(b, `,"container-id":`, e.ContainerID)
	b = appendOptString(b, `,"container-name":`, e.ContainerName)
	b = appendOptString(b, `,"container-interface-name":`, e.ContainerInterfaceName)
	b = appendOptString(b, `,"k8s-namespace":`, e.Namespace)
	b = appendOptString(b, `,"k8s-pod-name":`, e.PodName)
	b = appendOptString(b, `,"k8s-uid":`, e.PodUID)
	b = append(b, `,"labels":`...)
	b = appendLabels(b, e.Labels)
	b = appendIdentity(b, e, ident)
	b = appendAddressing(b, e.IPv4, e.IPv6)
	b = appendOptString(b, `,"interface-name":`, e.IfName)
	if e.IfIndex != 0 {
		b = append(b, `,"interface-index":`...)
		b = strconv.AppendInt(b, int64(e.IfIndex), 10)
	}
	b = appendOptString(b, `,"mac":`, e.MAC)
	b = appendOptString(b, `,"host-mac":`, e.HostMAC)
	b = appendOptString(b, `,"netns":`, e.Netns)
	if e.Chained {
		b = append(b, `,"chained":true`...)
	}
	if e.PolicyAudit {
		b = append(b, `,"policy-audit-mode":true`...)
	}
	b = append(b, `,"policy-revision":`...)
	b = strconv.AppendUint(b, e.RealizedRevision, 10)
	b = append(b, `,"regenerations":`...)
	b = strconv.AppendUint(b, e.Regenerations, 10)
	b = appendOptString(b, `,"last-error":`, e.LastError)
	b = append(b, `,"created":"`...)
	b = e.Created.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","state-changed":"`...)
	b = e.StateChanged.AppendFormat(b, time.RFC3339Nano)
	return append(b, `"}`...), true
}

// appendIdentity appends the model's identity field: ident's, or the
// bare ID Model shows without one.
func appendIdentity(b []byte, e *endpoint.Endpoint, ident *identityView) []byte {
	if ident != nil {
		b = append(b, `,"identity":{"id":`...)
		b = strconv.AppendInt(b, ident.id, 10)
		b = append(b, `,"labels":`...)
		b = appendLabels(b, ident.labels)
		if ident.refCount != 0 {
			b = append(b, `,"ref-count":`...)
			b = strconv.AppendInt(b, int64(ident.refCount), 10)
		}
		if ident.reserved {
			b = append(b, `,"reserved":true`...)
		}
		b = append(b, '}')
	} else if e.Identity != identity.IdentityUnknown { // Model's fallback
		b = append(b, `,"identity":{"id":`...)
		b = strconv.AppendUint(b, uint64(e.Identity), 10)
		b = append(b, `,"labels":null}`...)
	}
	return b
}

// appendAddressing appends the model's addressing field, if any.
func appendAddressing(b []byte, v4, v6 netip.Addr) []byte {
	if v4.IsValid() || v6.IsValid() {
		b = append(b, `,"addressing":{`...)
		if v4.IsValid() {
			b = appendAddr(append(b, `"ipv4":`...), v4)
		}
		if v6.IsValid() {
			if v4.IsValid() {
				b = append(b, ',')
			}
			b = appendAddr(append(b, `"ipv6":`...), v6)
		}
		b = append(b, '}')
	}
	return b
}

// appendLabels appends ls as the JSON of ls.Strings() (never null).
func appendLabels(b []byte, ls labels.Labels) []byte {
	b = append(b, '[')
	for i, l := range ls {
		if i > 0 {
			b = append(b, ',')
		}
		// l.String() is source:key[=value]; the separators are ASCII, so
		// escaping each part escapes the whole.
		b = append(b, '"')
		b = appendJSONChars(b, l.Source)
		b = append(b, ':')
		b = appendJSONChars(b, l.Key)
		if l.Value != "" {
			b = append(b, '=')
			b = appendJSONChars(b, l.Value)
		}
		b = append(b, '"')
	}
	return append(b, ']')
}

// appendAddr appends the JSON of a.String().
func appendAddr(b []byte, a netip.Addr) []byte {
	var buf [64]byte
	b = append(b, '"')
	b = appendJSONChars(b, a.AppendTo(buf[:0]))
	return append(b, '"')
}

// jsonTimeOK reports whether time.Time.MarshalJSON accepts t (and then
// writes t.AppendFormat(RFC3339Nano) quoted): a four-digit year and a
// zone offset under 24 hours.
func jsonTimeOK(t time.Time) bool {
	if y := t.Year(); y < 0 || y > 9999 {
		return false
	}
	_, off := t.Zone()
	return off > -24*3600 && off < 24*3600
}

// appendOptString appends key and s unless s is empty (omitempty).
func appendOptString(b []byte, key, s string) []byte {
	if s == "" {
		return b
	}
	return appendJSONString(append(b, key...), s)
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s quoted as encoding/json does with HTML
// escaping on (see appendJSONChars).
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	b = appendJSONChars(b, s)
	return append(b, '"')
}

// appendJSONChars appends s escaped as encoding/json escapes a string's
// characters with HTML escaping on: <, > and & as \u003c, \u003e,
// \u0026; control characters as \b \f \n \r \t or \u00XX; invalid
// UTF-8 as \ufffd; U+2028 and U+2029 escaped.
func appendJSONChars[S []byte | string](b []byte, s S) []byte {
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(string(s[i:min(len(s), i+utf8.UTFMax)]))
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	return append(b, s[start:]...)
}

// jsonBuffers holds the buffers hand-encoded answers are built in.
var jsonBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

// maxPooledJSON is the largest answer buffer kept in jsonBuffers: a long
// endpoint list is not held on to.
const maxPooledJSON = 64 << 10

func putJSONBuffer(bp *[]byte) {
	if cap(*bp) <= maxPooledJSON {
		jsonBuffers.Put(bp)
	}
}
