package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/ifname"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// maxBody bounds request bodies.
const maxBody = 1 << 20

// decodeStrict decodes exactly one JSON value into v, refusing unknown
// fields and trailing data, with an error that names the problem.
func decodeStrict(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return badRequest("request body is empty; want a JSON object")
	}
	if !utf8.Valid(body) {
		return badRequest(fmt.Sprintf("request body is not valid UTF-8 (at byte %d)", invalidUTF8At(body)))
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest(describeJSONError(err))
	}
	if !jsonSpace(body[dec.InputOffset():]) {
		return badRequest("request body has data after the JSON object")
	}
	return nil
}

// invalidUTF8At returns the offset of the first invalid UTF-8 sequence in b.
func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return len(b)
}

// jsonSpace reports whether b is only JSON whitespace (RFC 8259: space,
// tab, line feed, carriage return), what a decoder skips before EOF.
func jsonSpace(b []byte) bool {
	for _, c := range b {
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return false
		}
	}
	return true
}

// decodeBody decodes r's body with decodeStrict: the body mutating read
// already, else read here into a pooled buffer (bounded).
func decodeBody(r *http.Request, v any) error {
	if p, ok := r.Body.(*prereadBody); ok {
		return decodeStrict(p.buf.Bytes(), v) // decoding copies what it keeps
	}
	buf := bodyBuffers.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= maxPooledBody {
			bodyBuffers.Put(buf)
		}
	}()
	buf.Reset()
	if err := readBodyInto(buf, r); err != nil {
		return err
	}
	return decodeStrict(buf.Bytes(), v) // decoding copies what it keeps
}

// bodyBuffers holds the buffers request bodies are read into.
var bodyBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledBody is the largest body buffer kept in bodyBuffers.
const maxPooledBody = 64 << 10

func describeJSONError(err error) string {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		return fmt.Sprintf("field %q: want %s, got JSON %s", typeErr.Field, typeErr.Type, typeErr.Value)
	case errors.As(err, &syntaxErr):
		return fmt.Sprintf("malformed JSON at byte %d: %v", syntaxErr.Offset, err)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return "unknown field " + strings.TrimPrefix(err.Error(), "json: unknown field ")
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "malformed JSON: unexpected end of body"
	}
	return "malformed JSON: " + err.Error()
}

// prereadBody is a request body read whole before the handler ran; it
// replaces the request's Body. buf returns to bodyBuffers on release.
type prereadBody struct {
	buf *bytes.Buffer
	*bytes.Reader
}

func (p *prereadBody) Close() error { return nil }

func (p *prereadBody) release() {
	if p.buf.Cap() <= maxPooledBody {
		bodyBuffers.Put(p.buf)
	}
}

// readBody reads r's body (at most limit bytes) within cfg.BodyTimeout.
// Returns a 408 request-timeout apiError when the body does not arrive in
// time, 413 when it is larger than limit.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, limit int) (*prereadBody, error) {
	buf := bodyBuffers.Get().(*bytes.Buffer)
	buf.Reset()
	p := &prereadBody{buf: buf}
	rc := http.NewResponseController(w)
	// Not every ResponseWriter supports deadlines (httptest's does not):
	// then the body is read without one.
	timed := rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout)) == nil
	_, err := buf.ReadFrom(io.LimitReader(r.Body, int64(limit)+1))
	if timed {
		// A deadline left in place would fire while the handler waits for
		// the actors, and the server would cancel the request's context.
		_ = rc.SetReadDeadline(time.Time{})
	}
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		p.release()
		w.Header().Set("Connection", "close")
		return nil, &apiError{http.StatusRequestTimeout, CodeBodyTimeout, fmt.Sprintf("request body not received within %s", s.cfg.BodyTimeout)}
	case err != nil:
		p.release()
		return nil, badRequest("reading body: " + err.Error())
	case buf.Len() > limit:
		p.release()
		return nil, &apiError{http.StatusRequestEntityTooLarge, CodeRequestTooLarge, fmt.Sprintf("body larger than %d bytes", limit)}
	}
	p.Reader = bytes.NewReader(buf.Bytes())
	return p, nil
}

// readBodyInto reads a bounded request body into buf. The content type
// is not checked (curl -d sends a form type); the body must parse as JSON.
func readBodyInto(buf *bytes.Buffer, r *http.Request) error {
	if _, err := buf.ReadFrom(io.LimitReader(r.Body, maxBody+1)); err != nil {
		return badRequest("reading body: " + err.Error())
	}
	if buf.Len() > maxBody {
		return &apiError{http.StatusRequestEntityTooLarge, CodeRequestTooLarge, fmt.Sprintf("body larger than %d bytes", maxBody)}
	}
	return nil
}

// specFromRequest validates an EndpointChangeRequest against the path
// reference and turns it into the endpoint's initial record. Errors name
// the offending field.
func specFromRequest(ref endpoint.Ref, req *models.EndpointChangeRequest) (*endpoint.Endpoint, error) {
	spec := &endpoint.Endpoint{
		ContainerID: req.ContainerID, ContainerName: req.ContainerName,
		ContainerInterfaceName: req.ContainerInterfaceName, Namespace: req.K8sNamespace,
		PodName: req.K8sPodName, PodUID: req.K8sUID, IfName: req.InterfaceName,
		Netns: req.Netns,
	}
	if err := applyRef(ref, req, spec); err != nil {
		return nil, err
	}
	ls, err := apiLabels("labels", req.Labels)
	if err != nil {
		return nil, err
	}
	spec.Labels = ls
	if spec.NamedPorts, err = apiNamedPorts("named-ports", req.NamedPorts); err != nil {
		return nil, err
	}
	if err := applyAddressing(req.Addressing, spec); err != nil {
		return nil, err
	}
	if req.InterfaceIndex < 0 || req.InterfaceIndex > 1<<31-1 {
		return nil, badRequest(fmt.Sprintf("field \"interface-index\": %d out of range", req.InterfaceIndex))
	}
	spec.IfIndex = int(req.InterfaceIndex)
	for field, v := range map[string]*string{"mac": &req.Mac, "host-mac": &req.HostMac} {
		if *v == "" {
			continue
		}
		hw, err := net.ParseMAC(*v)
		if err != nil {
			return nil, badRequest(fmt.Sprintf("field %q: %v", field, err))
		}
		*v = hw.String()
	}
	spec.MAC, spec.HostMAC = req.Mac, req.HostMac
	for field, v := range map[string]string{"container-id": spec.ContainerID, "k8s-namespace": spec.Namespace,
		"k8s-pod-name": spec.PodName, "interface-name": spec.IfName, "container-interface-name": spec.ContainerInterfaceName} {
		if err := checkName(field, v); err != nil {
			return nil, err
		}
	}
	for field, v := range map[string]string{"container-name": spec.ContainerName, "k8s-uid": spec.PodUID} {
		if err := checkText(field, v, maxTextField); err != nil {
			return nil, err
		}
	}
	if err := checkNetns(spec.Netns); err != nil {
		return nil, err
	}
	if (spec.Namespace == "") != (spec.PodName == "") {
		return nil, badRequest("fields \"k8s-namespace\" and \"k8s-pod-name\": give both or neither")
	}
	// Interface names reach sysctl paths and netlink deletions: the host
	// side must be one the plugin makes, the pod side a kernel name.
	if spec.IfName != "" && !ifname.ValidHost(spec.IfName) {
		return nil, badRequest(fmt.Sprintf("field \"interface-name\": %q: want %s followed by 1..12 lowercase letters or digits", spec.IfName, ifname.HostPrefix))
	}
	if spec.ContainerInterfaceName != "" && !ifname.Valid(spec.ContainerInterfaceName) {
		return nil, badRequest(fmt.Sprintf("field \"container-interface-name\": %q: want an interface name of 1..%d bytes without '/', ':', '%%' or spaces, other than ., .., all and default", spec.ContainerInterfaceName, ifname.MaxLen))
	}
	if len(spec.Labels) == 0 {
		return nil, badRequest("field \"labels\": at least one label is required (the identity derives from them)")
	}
	return spec, nil
}

func applyRef(ref endpoint.Ref, req *models.EndpointChangeRequest, spec *endpoint.Endpoint) error {
	if req.ID < 0 || req.ID > endpoint.MaxID {
		return badRequest(fmt.Sprintf("field \"id\": %d outside 0..%d", req.ID, endpoint.MaxID))
	}
	switch ref.Kind {
	case endpoint.RefID:
		if req.ID != 0 && req.ID != int64(ref.ID) {
			return badRequest(fmt.Sprintf("field \"id\": %d does not match the path's %d", req.ID, ref.ID))
		}
		spec.ID = ref.ID
	case endpoint.RefContainerID:
		if spec.ContainerID != "" && spec.ContainerID != ref.ContainerID {
			return badRequest("field \"container-id\": does not match the path")
		}
		spec.ContainerID = ref.ContainerID
		spec.ID = endpoint.ID(req.ID)
	case endpoint.RefAttachment:
		if (spec.ContainerID != "" && spec.ContainerID != ref.ContainerID) ||
			(spec.ContainerInterfaceName != "" && spec.ContainerInterfaceName != ref.IfName) {
			return badRequest("fields \"container-id\"/\"container-interface-name\": do not match the path")
		}
		spec.ContainerID, spec.ContainerInterfaceName = ref.ContainerID, ref.IfName
		spec.ID = endpoint.ID(req.ID)
	case endpoint.RefPodName:
		if (spec.Namespace != "" && spec.Namespace != ref.Namespace) || (spec.PodName != "" && spec.PodName != ref.PodName) {
			return badRequest("fields \"k8s-namespace\"/\"k8s-pod-name\": do not match the path")
		}
		spec.Namespace, spec.PodName = ref.Namespace, ref.PodName
		spec.ID = endpoint.ID(req.ID)
	}
	return nil
}

func applyAddressing(a *models.AddressPair, spec *endpoint.Endpoint) error {
	if a == nil {
		return nil
	}
	if a.IPv4 != "" {
		ip, err := netip.ParseAddr(a.IPv4)
		if err != nil || !ip.Unmap().Is4() {
			return badRequest(fmt.Sprintf("field \"addressing.ipv4\": %q is not an IPv4 address", a.IPv4))
		}
		spec.IPv4 = ip.Unmap()
	}
	if a.IPv6 != "" {
		ip, err := netip.ParseAddr(a.IPv6)
		if err != nil || !ip.Is6() || ip.Is4In6() || ip.Zone() != "" {
			return badRequest(fmt.Sprintf("field \"addressing.ipv6\": %q is not an IPv6 address", a.IPv6))
		}
		spec.IPv6 = ip
	}
	return nil
}

func checkName(field, v string) error {
	if len(v) > 253 {
		return badRequest(fmt.Sprintf("field %q: longer than 253 bytes", field))
	}
	for _, r := range v {
		if r <= ' ' || r == 0x7f || r == '/' {
			return badRequest(fmt.Sprintf("field %q: %q contains a space, control character or '/'", field, v))
		}
	}
	return nil
}

// apiNamedPorts validates the named ports of a request (field names the
// JSON field): names are IANA_SVC_NAMEs, ports 1..65535, protocols TCP,
// UDP or SCTP, one port per name and protocol.
func apiNamedPorts(field string, in []models.NamedPort) (policy.NamedPorts, error) {
	ps := make([]policy.NamedPort, 0, len(in))
	for i, p := range in {
		if err := policy.ValidatePortName(p.Name); err != nil {
			return nil, badRequest(fmt.Sprintf("field %q[%d].name: %v", field, i, err))
		}
		if p.Port < 1 || p.Port > 65535 {
			return nil, badRequest(fmt.Sprintf("field %q[%d].port: %d outside 1..65535", field, i, p.Port))
		}
		proto, err := policy.ParsePortProtocol(p.Protocol)
		if err != nil {
			return nil, badRequest(fmt.Sprintf("field %q[%d].protocol: %v", field, i, err))
		}
		ps = append(ps, policy.NamedPort{Name: p.Name, Proto: proto, Port: uint16(p.Port)})
	}
	out, err := policy.NewNamedPorts(ps)
	if err != nil {
		return nil, badRequest(fmt.Sprintf("field %q: %v", field, err))
	}
	return out, nil
}
