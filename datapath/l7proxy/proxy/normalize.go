package proxy

import (
	"net/http"
	"path"
	"strings"
)

// refusedRequest says why the proxy refuses r before any rule sees it
// ("" when it does not):
//   - a protocol upgrade (WebSocket, h2c) or CONNECT: after the switch the
//     connection carries bytes no rule checks, so an allowed request
//     would open an unchecked tunnel (Envoy, and so Cilium, allow
//     upgrades only where configured; Membrane has no such rule yet);
//   - an encoded slash or backslash in the path (%2F, %5C): servers differ
//     on whether it separates segments, so no single normalised path
//     stands for it (Envoy's path_with_escaped_slashes REJECT_REQUEST);
//   - a path that is not absolute, or holds a backslash or a NUL.
func refusedRequest(r *http.Request) string {
	if r.Method == http.MethodConnect {
		return "CONNECT is not allowed through L7 policy"
	}
	if r.Header.Get("Upgrade") != "" || headerHasToken(r.Header, "Connection", "upgrade") || r.Header.Get("HTTP2-Settings") != "" {
		return "protocol upgrades are not allowed through L7 policy"
	}
	raw := strings.ToLower(r.URL.RawPath)
	if strings.Contains(raw, "%2f") || strings.Contains(raw, "%5c") {
		return "encoded slashes are not allowed in the path"
	}
	if p := r.URL.Path; !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "\\\x00") {
		return "the path must be absolute, without backslashes or NUL"
	}
	return ""
}

// normalizePath removes dot segments and merges repeated slashes of the
// decoded path p (RFC 3986 5.2.4; Envoy's normalize_path and
// merge_slashes), keeping a trailing slash. "/public/../private",
// "/public/%2e%2e/private" (decoded before this) and "/public//../private"
// all become "/private".
func normalizePath(p string) string {
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c
}

func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}
