package proxy

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// serverProtocols are the protocols the proxy's listener speaks:
// HTTP/1.x and HTTP/2 without TLS by prior knowledge (h2c, as gRPC
// clients speak in a cluster), told apart on each connection by its
// first bytes (the HTTP/2 preface), so one L7 port carries both. Each
// HTTP/2 stream is one request to ServeHTTP: the rules decide per
// stream, and a denied stream is answered on that stream alone. The
// HTTP/1.1 Upgrade to h2c stays refused (refusedRequest), as Envoy
// refuses upgrades it is not configured for.
func serverProtocols() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return p
}

// gRPC status codes the proxy answers with (grpc/codes).
const (
	grpcStatusPermissionDenied = 7
	grpcStatusInternal         = 13
)

// isGRPC reports whether r is a gRPC call (content-type application/grpc,
// with or without a +subtype).
func isGRPC(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	return ct == "application/grpc" || strings.HasPrefix(ct, "application/grpc+") || strings.HasPrefix(ct, "application/grpc;")
}

// grpcPermissionDenied is the gRPC status of a denied request: 7
// (PERMISSION_DENIED) for a gRPC call, 0 for any other request.
func grpcPermissionDenied(r *http.Request) int {
	if isGRPC(r) {
		return grpcStatusPermissionDenied
	}
	return 0
}

// deny answers a request the proxy does not forward: an HTTP status
// with msg as the body, or, to a gRPC call, a trailers-only gRPC answer
// (HTTP 200 with grpc-status and grpc-message) carrying the gRPC status
// Envoy's local replies map the HTTP status to (grpcStatusOf), so a
// gRPC client sees PERMISSION_DENIED rather than a transport error. On
// HTTP/2 either answer ends that stream only.
func deny(w http.ResponseWriter, r *http.Request, code int, msg string) {
	if !isGRPC(r) {
		http.Error(w, msg, code)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/grpc")
	h.Set("Grpc-Status", strconv.Itoa(grpcStatusOf(code)))
	h.Set("Grpc-Message", grpcEncodeMessage(msg))
	w.WriteHeader(http.StatusOK)
}

// grpcStatusOf maps the proxy's HTTP answer to a gRPC status as Envoy's
// Grpc::Utility::httpToGrpcStatus does for the two the proxy sends: 403
// is PERMISSION_DENIED, 400 INTERNAL.
func grpcStatusOf(code int) int {
	if code == http.StatusForbidden {
		return grpcStatusPermissionDenied
	}
	return grpcStatusInternal
}

// grpcEncodeMessage percent-encodes msg as grpc-message requires (every
// byte outside printable ASCII, and '%').
func grpcEncodeMessage(msg string) string {
	var b strings.Builder
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c < 0x20 || c > 0x7e || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
