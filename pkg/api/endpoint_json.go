package api

import (
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/membrane-cni/membrane/pkg/models"
)

// The endpoint answers (PUT, regenerate, DELETE, GET and lists of
// endpoints) are most of the API's traffic. They are encoded by hand,
// byte for byte as json.Encoder encodes models.Endpoint (field order,
// omitempty, HTML escaping, one trailing newline): reflection made
// encoding the largest part of an answer's cost. TestEndpointJSON and
// FuzzEndpointJSON compare both encodings.

// appendEndpointsJSON appends eps as json.Encoder.Encode writes it, or
// reports false if a value is one the hand encoder leaves to
// encoding/json (a time it refuses).
func appendEndpointsJSON(b []byte, eps []*models.Endpoint) ([]byte, bool) {
	if eps == nil {
		return append(b, "null\n"...), true
	}
	b = append(b, '[')
	for i, m := range eps {
		if i > 0 {
			b = append(b, ',')
		}
		var ok bool
		if b, ok = appendEndpoint(b, m); !ok {
			return b, false
		}
	}
	return append(b, ']', '\n'), true
}

// appendEndpointJSON appends m as json.Encoder.Encode writes it (see
// appendEndpointsJSON).
func appendEndpointJSON(b []byte, m *models.Endpoint) ([]byte, bool) {
	b, ok := appendEndpoint(b, m)
	return append(b, '\n'), ok
}

func appendEndpoint(b []byte, m *models.Endpoint) ([]byte, bool) {
	if m == nil {
		return append(b, "null"...), true
	}
	if !jsonTimeOK(m.Created) || !jsonTimeOK(m.StateChanged) {
		return b, false
	}
	b = append(b, `{"id":`...)
	b = strconv.AppendInt(b, m.ID, 10)
	b = append(b, `,"state":`...)
	b = appendJSONString(b, m.State)
	b = appendOptString(b, `,"container-id":`, m.ContainerID)
	b = appendOptString(b, `,"container-name":`, m.ContainerName)
	b = appendOptString(b, `,"container-interface-name":`, m.ContainerInterfaceName)
	b = appendOptString(b, `,"k8s-namespace":`, m.K8sNamespace)
	b = appendOptString(b, `,"k8s-pod-name":`, m.K8sPodName)
	b = appendOptString(b, `,"k8s-uid":`, m.K8sUID)
	b = append(b, `,"labels":`...)
	b = appendJSONStrings(b, m.Labels)
	if id := m.Identity; id != nil {
		b = append(b, `,"identity":{"id":`...)
		b = strconv.AppendInt(b, id.ID, 10)
		b = append(b, `,"labels":`...)
		b = appendJSONStrings(b, id.Labels)
		if id.RefCount != 0 {
			b = append(b, `,"ref-count":`...)
			b = strconv.AppendInt(b, int64(id.RefCount), 10)
		}
		if id.Reserved {
			b = append(b, `,"reserved":true`...)
		}
		b = append(b, '}')
	}
	if a := m.Addressing; a != nil {
		b = append(b, `,"addressing":{`...)
		b = appendOptString(b, `"ipv4":`, a.IPv4)
		if a.IPv6 != "" {
			if a.IPv4 != "" {
				b = append(b, ',')
			}
			b = appendOptString(b, `"ipv6":`, a.IPv6)
		}
		b = append(b, '}')
	}
	b = appendOptString(b, `,"interface-name":`, m.InterfaceName)
	if m.InterfaceIndex != 0 {
		b = append(b, `,"interface-index":`...)
		b = strconv.AppendInt(b, m.InterfaceIndex, 10)
	}
	b = appendOptString(b, `,"mac":`, m.Mac)
	b = appendOptString(b, `,"host-mac":`, m.HostMac)
	b = appendOptString(b, `,"netns":`, m.Netns)
	b = append(b, `,"policy-revision":`...)
	b = strconv.AppendUint(b, m.PolicyRevision, 10)
	b = append(b, `,"regenerations":`...)
	b = strconv.AppendUint(b, m.Regenerations, 10)
	b = appendOptString(b, `,"last-error":`, m.LastError)
	b = append(b, `,"created":"`...)
	b = m.Created.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","state-changed":"`...)
	b = m.StateChanged.AppendFormat(b, time.RFC3339Nano)
	return append(b, `"}`...), true
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

// appendJSONStrings appends ss as a JSON array (null if nil).
func appendJSONStrings(b []byte, ss []string) []byte {
	if ss == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, s)
	}
	return append(b, ']')
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s quoted as encoding/json does with HTML
// escaping on: <, > and & as \u003c, \u003e, \u0026; control characters
// as \b \f \n \r \t or \u00XX; invalid UTF-8 as \ufffd; U+2028 and
// U+2029 escaped.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
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
		r, size := utf8.DecodeRuneInString(s[i:])
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
	b = append(b, s[start:]...)
	return append(b, '"')
}

// jsonBuffers holds the buffers hand-encoded answers are built in.
var jsonBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

// maxPooledJSON is the largest answer buffer kept in jsonBuffers: a long
// endpoint list is not held on to.
const maxPooledJSON = 64 << 10
