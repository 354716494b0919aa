package restore

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// Write renders an endpoint's two files for every state write, so they are
// appended into pooled buffers by hand rather than through reflection and
// fmt: the bytes are exactly those of json.MarshalIndent(FromEndpoint(ep),
// "", "  ") plus a newline, and of the header as it always read (tests
// compare both with the reflective forms). What the fast path does not
// cover (a string needing escapes, a time outside RFC 3339) is encoded by
// encoding/json, byte for byte the same.

// encodeBufs recycles the buffers requests carry from Write to the file
// writes (finish returns them).
var encodeBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// encodeState appends ep.json (with its final newline) to b.
func encodeState(b []byte, ep *endpoint.Endpoint) ([]byte, error) {
	n0 := len(b)
	b = append(b, "{\n  \"version\": "...)
	b = strconv.AppendInt(b, Version, 10)
	b = append(b, ",\n  \"endpoint\": {\n    \"id\": "...)
	b = strconv.AppendUint(b, uint64(ep.ID), 10)
	b = appendField(b, "container-id", ep.ContainerID)
	b = appendField(b, "container-name", ep.ContainerName)
	b = appendField(b, "container-interface-name", ep.ContainerInterfaceName)
	b = appendField(b, "k8s-namespace", ep.Namespace)
	b = appendField(b, "k8s-pod-name", ep.PodName)
	b = appendField(b, "k8s-uid", ep.PodUID)
	b = append(b, ",\n    \"labels\": ["...)
	for i, l := range ep.Labels {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, "\n      "...)
		if plainJSON(l.Source) && plainJSON(l.Key) && plainJSON(l.Value) {
			b = append(b, '"')
			b = append(append(append(b, l.Source...), ':'), l.Key...)
			if l.Value != "" {
				b = append(append(b, '='), l.Value...)
			}
			b = append(b, '"')
		} else {
			b = appendJSONString(b, l.String())
		}
	}
	if len(ep.Labels) > 0 {
		b = append(b, "\n    "...)
	}
	b = append(b, ']')
	b = appendAddrField(b, "ipv4", ep.IPv4)
	b = appendAddrField(b, "ipv6", ep.IPv6)
	b = appendField(b, "interface-name", ep.IfName)
	if ep.IfIndex != 0 {
		b = append(b, ",\n    \"interface-index\": "...)
		b = strconv.AppendInt(b, int64(ep.IfIndex), 10)
	}
	b = appendField(b, "mac", ep.MAC)
	b = appendField(b, "host-mac", ep.HostMAC)
	b = appendField(b, "netns", ep.Netns)
	if len(ep.NamedPorts) > 0 {
		// Validated names and numbers: nothing to escape.
		b = append(b, ",\n    \"named-ports\": ["...)
		for i, p := range ep.NamedPorts {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(append(b, "\n      \""...), p.Name...)
			b = append(append(append(b, '/'), policy.ProtoName(p.Proto)...), '=')
			b = append(strconv.AppendUint(b, uint64(p.Port), 10), '"')
		}
		b = append(b, "\n    ]"...)
	}
	if ep.Chained {
		b = append(b, ",\n    \"chained\": true"...)
	}
	if ep.PolicyAudit {
		b = append(b, ",\n    \"policy-audit-mode\": true"...)
	}
	if len(ep.HostPorts) > 0 {
		// Validated addresses, names and numbers: nothing to escape.
		b = append(b, ",\n    \"host-ports\": ["...)
		for i, h := range ep.HostPorts {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(append(append(b, "\n      \""...), h.String()...), '"')
		}
		b = append(b, "\n    ]"...)
	}
	b = append(b, ",\n    \"identity\": "...)
	b = strconv.AppendUint(b, uint64(uint32(ep.Identity)), 10)
	b = append(b, ",\n    \"revision\": "...)
	b = strconv.AppendUint(b, ep.DesiredRevision, 10)
	b = append(b, ",\n    \"created\": \""...)
	t0 := len(b)
	b = ep.Created.AppendFormat(b, time.RFC3339Nano)
	if !strictRFC3339(b[t0:]) {
		// Time.MarshalJSON refuses it; let encoding/json say why.
		return encodeStateReflect(b[:n0], ep)
	}
	return append(b, "\"\n  }\n}\n"...), nil
}

// encodeStateReflect appends ep.json as encoding/json writes it.
func encodeStateReflect(b []byte, ep *endpoint.Endpoint) ([]byte, error) {
	data, err := json.MarshalIndent(FromEndpoint(ep), "", "  ")
	if err != nil {
		return b, fmt.Errorf("encode state of endpoint %d: %w", ep.ID, err)
	}
	return append(append(b, data...), '\n'), nil
}

// strictRFC3339 reports whether Time.MarshalJSON accepts the time that
// AppendFormat(RFC3339Nano) rendered as t: a 4-digit year and a zone
// offset under 24 hours.
func strictRFC3339(t []byte) bool {
	if len(t) < len("2006-01-02T15:04:05Z") || t[4] != '-' {
		return false
	}
	if t[len(t)-1] == 'Z' {
		return true
	}
	z := t[len(t)-len("Z07:00"):]
	if (z[0] != '+' && z[0] != '-') || z[3] != ':' {
		return false
	}
	return 10*int(z[1]-'0')+int(z[2]-'0') < 24
}

// appendField appends `,\n    "name": "v"` unless v is empty (omitempty).
func appendField(b []byte, name, v string) []byte {
	if v == "" {
		return b
	}
	b = append(append(append(b, ",\n    \""...), name...), "\": "...)
	return appendJSONString(b, v)
}

func appendAddrField(b []byte, name string, a netip.Addr) []byte {
	if !a.IsValid() {
		return b
	}
	b = append(append(append(b, ",\n    \""...), name...), "\": "...)
	if a.Zone() != "" { // the zone may need escapes
		return appendJSONString(b, a.String())
	}
	return append(a.AppendTo(append(b, '"')), '"')
}

// appendJSONString appends s quoted as encoding/json quotes it.
func appendJSONString(b []byte, s string) []byte {
	if plainJSON(s) {
		return append(append(append(b, '"'), s...), '"')
	}
	q, err := json.Marshal(s)
	if err != nil { // a string always marshals
		panic(fmt.Sprintf("encode state: quote %q: %v", s, err))
	}
	return append(b, q...)
}

// plainJSON reports whether encoding/json writes s unchanged between
// quotes: printable ASCII without '"', '\\' or the HTML characters it
// escapes.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// appendHeader appends ep_config.h.
func appendHeader(b []byte, ep *endpoint.Endpoint) []byte {
	b = append(b, "/* Generated by membrane-agent; ep.json is authoritative. */\n#define LXC_ID "...)
	b = strconv.AppendUint(b, uint64(ep.ID), 10)
	b = append(b, "\n#define SECLABEL "...)
	b = strconv.AppendUint(b, uint64(uint32(ep.Identity)), 10)
	b = append(b, '\n')
	if ep.IPv4.IsValid() {
		b = append(b, "#define LXC_IPV4 0x"...)
		for _, x := range ep.IPv4.As4() {
			b = append(b, hexDigits[x>>4], hexDigits[x&0xf])
		}
		b = append(ep.IPv4.AppendTo(append(b, " /* "...)), " */\n"...)
	}
	if ep.IPv6.IsValid() {
		b = append(ep.IPv6.AppendTo(append(b, "#define LXC_IPV6 \""...)), "\"\n"...)
	}
	if ep.IfName != "" {
		b = append(b, "#define HOST_IFINDEX "...)
		b = strconv.AppendInt(b, int64(ep.IfIndex), 10)
		b = append(append(append(b, " /* "...), ep.IfName...), " */\n"...)
	}
	if ep.MAC != "" {
		b = append(append(append(b, "#define LXC_MAC \""...), ep.MAC...), "\"\n"...)
	}
	if ep.ContainerID != "" {
		b = append(append(b, "/* container "...), ep.ContainerID...)
		b = append(b, " pod "...)
		if ep.Namespace != "" || ep.PodName != "" {
			b = append(append(append(b, ep.Namespace...), '/'), ep.PodName...)
		}
		b = append(b, " */\n"...)
	}
	b = append(b, "#define POLICY_REVISION "...)
	b = strconv.AppendUint(b, ep.DesiredRevision, 10)
	return append(b, '\n')
}

const hexDigits = "0123456789abcdef"
