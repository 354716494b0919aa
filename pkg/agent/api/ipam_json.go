package api

import (
	"net/http"
	"strconv"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// POST /v1/ipam answers are encoded by hand like endpoint answers (see
// endpoint_json.go), byte for byte as json.Encoder encodes them
// (TestIPAMJSON, FuzzIPAMJSON).

// writeIPAM answers status with r, as writeJSON(w, status, r) does.
func writeIPAM(w http.ResponseWriter, status int, r *models.IPAMResponse) {
	bp := jsonBuffers.Get().(*[]byte)
	defer putJSONBuffer(bp)
	b := appendIPAMResponse((*bp)[:0], r)
	*bp = b
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func appendIPAMResponse(b []byte, r *models.IPAMResponse) []byte {
	if r == nil {
		return append(b, "null"...)
	}
	b = append(b, `{"address":`...)
	if a := r.Address; a == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '{')
		b = appendOptString(b, `"ipv4":`, a.IPv4)
		if a.IPv6 != "" {
			if a.IPv4 != "" {
				b = append(b, ',')
			}
			b = appendOptString(b, `"ipv6":`, a.IPv6)
		}
		b = append(b, '}')
	}
	b = append(b, `,"host-addressing":`...)
	if n := r.HostAddressing; n == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '{')
		if n.IPv4 != nil {
			b = appendNodeElement(append(b, `"ipv4":`...), n.IPv4)
		}
		if n.IPv6 != nil {
			if n.IPv4 != nil {
				b = append(b, ',')
			}
			b = appendNodeElement(append(b, `"ipv6":`...), n.IPv6)
		}
		b = append(b, '}')
	}
	if r.IPv4 != nil {
		b = appendIPAMAddress(append(b, `,"ipv4":`...), r.IPv4)
	}
	if r.IPv6 != nil {
		b = appendIPAMAddress(append(b, `,"ipv6":`...), r.IPv6)
	}
	return append(b, '}')
}

func appendNodeElement(b []byte, e *models.NodeAddressingElement) []byte {
	b = append(b, `{"enabled":`...)
	b = strconv.AppendBool(b, e.Enabled)
	b = appendOptString(b, `,"ip":`, e.IP)
	b = appendOptString(b, `,"alloc-range":`, e.AllocRange)
	return append(b, '}')
}

func appendIPAMAddress(b []byte, a *models.IPAMAddressResponse) []byte {
	b = append(b, `{"ip":`...)
	b = appendJSONString(b, a.IP)
	b = append(b, `,"gateway":`...)
	b = appendJSONString(b, a.Gateway)
	b = append(b, `,"cidrs":`...)
	if a.Cidrs == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, c := range a.Cidrs {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, c)
		}
		b = append(b, ']')
	}
	b = appendOptString(b, `,"owner":`, a.Owner)
	return append(b, '}')
}
