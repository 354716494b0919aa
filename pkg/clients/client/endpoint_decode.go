package client

import (
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// Endpoint answers (PUT, regenerate, GET, PATCH labels) are decoded by
// hand when they have the shape the agent writes: known keys, each once,
// in any order; strings without escapes or non-ASCII bytes; integers;
// no nulls. Anything else is left to encoding/json, whose result the
// hand decoder must equal whenever it accepts (TestDecodeEndpoint,
// FuzzDecodeEndpoint): reflection made decoding the largest part of a
// call's client-side cost.

// decodeEndpoint decodes data into *out and reports true, or reports
// false and leaves *out alone.
func decodeEndpoint(data []byte, out *models.Endpoint) bool {
	p := parser{b: data}
	var m models.Endpoint
	if !p.endpoint(&m) {
		return false
	}
	p.ws()
	if p.i != len(p.b) {
		return false
	}
	*out = m
	return true
}

// parser reads JSON from b at i; every method reports false on input it
// does not take.
type parser struct {
	b []byte
	i int
}

// endpoint fields, one bit each, to refuse duplicate keys.
const (
	fID = 1 << iota
	fState
	fContainerID
	fContainerName
	fContainerIfName
	fNamespace
	fPodName
	fUID
	fLabels
	fIdentity
	fAddressing
	fIfName
	fIfIndex
	fMAC
	fHostMAC
	fNetns
	fRevision
	fRegenerations
	fLastError
	fCreated
	fStateChanged
	fChained
	fPolicyAuditMode
)

func (p *parser) endpoint(m *models.Endpoint) bool {
	var seen uint32
	return p.object(func(key []byte) (uint32, bool) {
		var bit uint32
		ok := false
		switch string(key) { // compared in place, no allocation
		case "id":
			bit, ok = fID, p.int64(&m.ID)
		case "state":
			bit, ok = fState, p.str(&m.State)
		case "container-id":
			bit, ok = fContainerID, p.str(&m.ContainerID)
		case "container-name":
			bit, ok = fContainerName, p.str(&m.ContainerName)
		case "container-interface-name":
			bit, ok = fContainerIfName, p.str(&m.ContainerInterfaceName)
		case "k8s-namespace":
			bit, ok = fNamespace, p.str(&m.K8sNamespace)
		case "k8s-pod-name":
			bit, ok = fPodName, p.str(&m.K8sPodName)
		case "k8s-uid":
			bit, ok = fUID, p.str(&m.K8sUID)
		case "labels":
			bit, ok = fLabels, p.strs(&m.Labels)
		case "identity":
			m.Identity = &models.Identity{}
			bit, ok = fIdentity, p.identity(m.Identity)
		case "addressing":
			m.Addressing = &models.AddressPair{}
			bit, ok = fAddressing, p.addressing(m.Addressing)
		case "interface-name":
			bit, ok = fIfName, p.str(&m.InterfaceName)
		case "interface-index":
			bit, ok = fIfIndex, p.int64(&m.InterfaceIndex)
		case "mac":
			bit, ok = fMAC, p.str(&m.Mac)
		case "host-mac":
			bit, ok = fHostMAC, p.str(&m.HostMac)
		case "netns":
			bit, ok = fNetns, p.str(&m.Netns)
		case "policy-revision":
			bit, ok = fRevision, p.uint64(&m.PolicyRevision)
		case "regenerations":
			bit, ok = fRegenerations, p.uint64(&m.Regenerations)
		case "last-error":
			bit, ok = fLastError, p.str(&m.LastError)
		case "created":
			bit, ok = fCreated, p.time(&m.Created)
		case "state-changed":
			bit, ok = fStateChanged, p.time(&m.StateChanged)
		case "chained":
			bit, ok = fChained, p.bool(&m.Chained)
		case "policy-audit-mode":
			bit, ok = fPolicyAuditMode, p.bool(&m.PolicyAuditMode)
		}
		return bit, ok
	}, &seen)
}

func (p *parser) identity(id *models.Identity) bool {
	var seen uint32
	return p.object(func(key []byte) (uint32, bool) {
		switch string(key) { // compared in place, no allocation
		case "id":
			return 1, p.int64(&id.ID)
		case "labels":
			return 2, p.strs(&id.Labels)
		case "ref-count":
			var n int64
			ok := p.int64(&n) && int64(int(n)) == n
			id.RefCount = int(n)
			return 4, ok
		case "reserved":
			return 8, p.bool(&id.Reserved)
		case "scope":
			return 16, p.str(&id.Scope)
		}
		return 0, false
	}, &seen)
}

func (p *parser) addressing(a *models.AddressPair) bool {
	var seen uint32
	return p.object(func(key []byte) (uint32, bool) {
		switch string(key) { // compared in place, no allocation
		case "ipv4":
			return 1, p.str(&a.IPv4)
		case "ipv6":
			return 2, p.str(&a.IPv6)
		}
		return 0, false
	}, &seen)
}

// object reads {"key": value, ...}; field reads the value of key and
// returns its bit in *seen (a key seen twice is refused).
func (p *parser) object(field func(key []byte) (uint32, bool), seen *uint32) bool {
	p.ws()
	if !p.byte('{') {
		return false
	}
	p.ws()
	if p.byte('}') {
		return true
	}
	for {
		p.ws()
		key, ok := p.raw()
		if !ok {
			return false
		}
		p.ws()
		if !p.byte(':') {
			return false
		}
		p.ws()
		bit, ok := field(key)
		if !ok || bit == 0 || *seen&bit != 0 {
			return false
		}
		*seen |= bit
		p.ws()
		if p.byte('}') {
			return true
		}
		if !p.byte(',') {
			return false
		}
	}
}

func (p *parser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) byte(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// raw reads a string's bytes between its quotes: printable ASCII
// without escapes only.
func (p *parser) raw() ([]byte, bool) {
	if !p.byte('"') {
		return nil, false
	}
	start := p.i
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return p.b[start : p.i-1], true
		case c < 0x20 || c == '\\' || c >= 0x80:
			return nil, false
		}
		p.i++
	}
	return nil, false
}

func (p *parser) str(s *string) bool {
	b, ok := p.raw()
	*s = string(b)
	return ok
}

// strs reads an array of strings (never null: empty is [] as encoding/json
// decodes it).
func (p *parser) strs(ss *[]string) bool {
	if !p.byte('[') {
		return false
	}
	out := make([]string, 0, 4)
	p.ws()
	if p.byte(']') {
		*ss = out
		return true
	}
	for {
		p.ws()
		var s string
		if !p.str(&s) {
			return false
		}
		out = append(out, s)
		p.ws()
		if p.byte(']') {
			*ss = out
			return true
		}
		if !p.byte(',') {
			return false
		}
	}
}

// digits reads an unsigned JSON integer (no fraction or exponent, no
// leading zero) that fits in 64 bits.
func (p *parser) digits() (uint64, bool) {
	start := p.i
	var n uint64
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		d := uint64(p.b[p.i] - '0')
		if n > (1<<64-1-d)/10 {
			return 0, false
		}
		n = n*10 + d
		p.i++
	}
	switch {
	case p.i == start, p.b[start] == '0' && p.i-start > 1:
		return 0, false
	case p.i < len(p.b) && (p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E'):
		return 0, false
	}
	return n, true
}

func (p *parser) uint64(v *uint64) bool {
	n, ok := p.digits()
	*v = n
	return ok
}

func (p *parser) int64(v *int64) bool {
	neg := p.byte('-')
	n, ok := p.digits()
	switch {
	case !ok:
		return false
	case neg && n <= 1<<63:
		*v = -int64(n-1) - 1
	case !neg && n < 1<<63:
		*v = int64(n)
	default:
		return false
	}
	return true
}

func (p *parser) bool(v *bool) bool {
	for _, lit := range []string{"true", "false"} {
		if len(p.b)-p.i >= len(lit) && string(p.b[p.i:p.i+len(lit)]) == lit {
			p.i += len(lit)
			*v = lit == "true"
			return true
		}
	}
	return false
}

// time reads a string as time.Time.UnmarshalJSON does (encoding/json
// hands it the quoted literal).
func (p *parser) time(t *time.Time) bool {
	start := p.i
	if _, ok := p.raw(); !ok {
		return false
	}
	return t.UnmarshalJSON(p.b[start:p.i]) == nil
}
