package api

import (
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"strings"

	"github.com/membrane-cni/membrane/pkg/agent/metrics"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// eventsRoute is the streaming route, left out of the latency histogram.
const eventsRoute = "GET /v1/events"

// CodeReadOnly is the error code of a mutating request on the read-only
// HTTP listener (403).
const CodeReadOnly = "read-only-listener"

// CodeHostNotAllowed is the error code of a request on the read-only HTTP
// listener whose Host header is not allowed (403).
const CodeHostNotAllowed = "host-not-allowed"

// operatorRoutes adds the operator surfaces: actor snapshots, the event
// stream, metrics and, with Config.Pprof, the profiler.
func (s *Server) operatorRoutes(m *http.ServeMux) {
	m.HandleFunc("GET /v1/actors", s.listActors)
	m.HandleFunc("GET /v1/actors/{path...}", s.getActor)
	m.HandleFunc(eventsRoute, s.streamEvents)
	m.Handle("GET /metrics", s.cfg.Metrics.Handler())
	if s.cfg.Pprof {
		m.HandleFunc("GET /debug/pprof/", pprof.Index)
		m.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		m.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		m.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		m.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
}

// Metrics returns the server's metrics (the agent installs the sampler).
func (s *Server) Metrics() *metrics.Metrics { return s.cfg.Metrics }

// ReadOnly returns the handler of the TCP listener (--http-addr): the
// same routes, but only GET and HEAD; anything else is refused with 403
// read-only-listener before it reaches a handler, so the listener can
// never change the agent. A Host header naming neither a loopback host
// nor one of Config.AllowedHosts is refused with 403 host-not-allowed
// first: a web page whose name an attacker rebinds to 127.0.0.1 must not
// read the agent's answers.
func (s *Server) ReadOnly() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.hostAllowed(r.Host) {
			writeError(w, &apiError{http.StatusForbidden, CodeHostNotAllowed,
				fmt.Sprintf("Host %q refused: this listener answers loopback hosts and those of --http-allowed-hosts", labels.Clip(r.Host))})
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, &apiError{http.StatusForbidden, CodeReadOnly,
				fmt.Sprintf("%s %s refused: this listener is read-only; use the unix socket", r.Method, r.URL.Path)})
			return
		}
		s.ServeHTTP(w, r)
	})
}

// ReadOnlyServer returns the server of the TCP listener (ReadOnly, with
// the API's deadlines) and l bounded to Config.MaxHTTPConns connections.
func (s *Server) ReadOnlyServer(l net.Listener) (*http.Server, net.Listener) {
	return s.newHTTPServer(s.ReadOnly()), LimitListener(l, s.cfg.MaxHTTPConns)
}

// hostAllowed reports whether the read-only listener answers a request
// for host (the Host header, port optional): "localhost", a loopback
// address, or a name of Config.AllowedHosts ("*": any host).
func (s *Server) hostAllowed(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	if host == "" {
		return false
	}
	if host == "localhost" {
		return true
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsLoopback() {
		return true
	}
	for _, h := range s.cfg.AllowedHosts {
		if h == "*" || strings.EqualFold(h, host) {
			return true
		}
	}
	return false
}

// codeWriter records the status code for the latency histogram and
// passes Flush through. While req has no pattern (the mux found no
// route and answers 404 or 405 itself) it records that answer in
// unmatched instead of sending it; ServeHTTP sends a JSON error instead.
type codeWriter struct {
	http.ResponseWriter
	req       *http.Request
	status    int
	unmatched statusRecorder
	// answering is set once the JSON error for an unmatched request is
	// being written: from then on writes pass through.
	answering bool
}

// swallow reports whether the write is the mux's own 404/405 answer.
func (c *codeWriter) swallow() bool { return c.req.Pattern == "" && !c.answering }

func (c *codeWriter) Header() http.Header {
	if c.swallow() {
		if c.unmatched.header == nil {
			c.unmatched.header = http.Header{}
		}
		return c.unmatched.header
	}
	return c.ResponseWriter.Header()
}

func (c *codeWriter) WriteHeader(code int) {
	if c.swallow() {
		c.unmatched.WriteHeader(code)
		return
	}
	if c.status == 0 {
		c.status = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *codeWriter) Write(b []byte) (int, error) {
	if c.swallow() {
		return c.unmatched.Write(b)
	}
	if c.status == 0 {
		c.status = http.StatusOK
	}
	return c.ResponseWriter.Write(b)
}

func (c *codeWriter) Flush() { _ = c.FlushError() }

// FlushError flushes and reports a failed write (an event stream's write
// deadline), which http.Flusher cannot.
func (c *codeWriter) FlushError() error {
	if c.swallow() {
		return nil
	}
	return http.NewResponseController(c.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the connection.
func (c *codeWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

func (c *codeWriter) code() int {
	if c.status == 0 {
		return http.StatusOK
	}
	return c.status
}

// statusRecorder captures the mux's own 404/405 answers.
type statusRecorder struct {
	header http.Header
	status int
}

func (r *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *statusRecorder) WriteHeader(code int)        { r.status = code }
