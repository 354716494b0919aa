package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/pkg/agent/flows"
	"github.com/membrane-cni/membrane/pkg/agent/metrics"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

var (
	// ErrSocketInUse is returned by Listen when another process serves the socket.
	ErrSocketInUse = errors.New("socket in use by another process")
	// ErrNotSocket is returned by Listen when the path names something
	// other than a unix socket (a regular file, a directory, a symlink),
	// which Listen never removes.
	ErrNotSocket = errors.New("exists and is not a unix socket")
	// ErrInvalidConfig is wrapped by Config validation errors.
	ErrInvalidConfig = errors.New("invalid api config")
)

// Config configures the API server.
type Config struct {
	// HostPorts translates pods' hostPorts (POST /v1/attach's
	// port-mappings) as HostPort services on NodeAddrs: kube-proxy
	// replacement on the Linux datapath. Off, mappings are refused.
	HostPorts bool
	// NodeAddrs are the node's addresses a hostPort without host-ip is
	// served on (the host netns's global unicast addresses at start).
	NodeAddrs []netip.Addr
	// MaxInFlight bounds concurrent mutating requests; more wait (default 512).
	MaxInFlight int
	// RequestTimeout bounds one request's wait for the actors (default 60 s).
	RequestTimeout time.Duration
	// Metrics records API latency and serves GET /metrics (nil: the
	// server creates its own).
	Metrics *metrics.Metrics
	// Pprof serves /debug/pprof/ (on the socket and the HTTP listener).
	Pprof bool
	// BodyTimeout bounds reading a mutating request's body, which happens
	// before the request takes an in-flight slot (default 10 s); a body
	// not received in time is answered 408 request-timeout.
	BodyTimeout time.Duration
	// WriteTimeout bounds writing one answer, or one batch of events to an
	// event stream, to a client (default 10 s). A connection's whole
	// request may take RequestTimeout + WriteTimeout.
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection idle for this long
	// (default 2 min).
	IdleTimeout time.Duration
	// MaxConns bounds the unix socket's open connections (default 1024,
	// negative: no cap); MaxHTTPConns the TCP listener's (default 64,
	// negative: no cap).
	// Each listener has its own cap, so that the TCP listener's clients
	// can never take the descriptors the socket needs.
	MaxConns, MaxHTTPConns int
	// AllowedHosts are the Host names, besides localhost and loopback
	// addresses, the TCP listener answers for ("*": any).
	AllowedHosts []string
	// HostNetns is the path of the netns in which POST /v1/attach creates
	// the host end of a pod's veth (the one the datapath works in); ""
	// is the agent's own.
	HostNetns string
	// TunnelMTU caps the MTU of the routes POST /v1/attach installs in a
	// pod (0: no cap, native routing): in tunnel mode the tunnel device's
	// MTU, so that the pod's packets leave room for the encapsulation
	// whatever the veth's MTU (Cilium's route MTU).
	TunnelMTU int
	// Version is the agent's version, reported in GET /v1/status.
	Version string
}

// Server is the REST API.
type Server struct {
	cfg Config
	sys *actors.System
	ix  *index.Index
	log *slog.Logger
	// hostPortMu serialises the attaches with port mappings from their
	// conflict check to their services (acceptHostPorts).
	hostPortMu sync.Mutex
	// attaching serialises the attaches of one attachment (attachLocks).
	attaching attachLocks
	// nodeAddrMu guards nodeAddrs, the node addresses hostPorts without
	// a host-ip are on (Config.NodeAddrs, then NodeAddrChanged).
	nodeAddrMu sync.Mutex
	nodeAddrs  []netip.Addr
	// hostPortKick asks the agent's hostPort resync for a pass now (a
	// node address came or went); capacity 1, never blocks.
	hostPortKick chan struct{}
	ready        atomic.Bool
	closing      atomic.Bool
	sem          chan struct{}
	started      time.Time
	ranges       map[ipam.Family]*ipam.Range // read-only geometry: size, gateway
	text         rangesText                  // ranges spelled for answers
	mux          *http.ServeMux
	http         *http.Server
	// streamsDone is closed by Shutdown to end event streams, which
	// http.Server.Shutdown would otherwise wait for.
	streamsDone chan struct{}
	closeOnce   sync.Once
	health      atomic.Pointer[func() *models.HealthStatus]
	nodeHealth  atomic.Pointer[func() []models.NodeHealth]
	restore     atomic.Pointer[models.RestoreStatus]
	k8s         atomic.Pointer[func() *models.K8sStatus]
	kvstore     atomic.Pointer[func() *models.KvstoreStatus]
	stateDir    atomic.Pointer[func() *models.StateDirStatus]
	labeler     atomic.Pointer[EndpointLabeler]
	flowLog     atomic.Pointer[flows.Store]
}

// EndpointLabeler gives a pod's endpoint its labels and named ports
// before it is created (Kubernetes mode): it returns spec's labels with
// the pod's own, and the named ports of the pod's containers (spec's own
// when the pod is not known). It may wait (bounded) for the pod and must
// honour ctx.
type EndpointLabeler func(ctx context.Context, spec *endpoint.Endpoint) (labels.Labels, policy.NamedPorts, error)

// SetLabeler installs the labeler PUT /v1/endpoint calls for endpoints
// that name a pod.
func (s *Server) SetLabeler(fn EndpointLabeler) { s.labeler.Store(&fn) }

// SetK8s installs the Kubernetes connection's status for GET /v1/status.
func (s *Server) SetK8s(fn func() *models.K8sStatus) { s.k8s.Store(&fn) }

// SetStateDir installs the state directory's health for GET /v1/status.
func (s *Server) SetStateDir(fn func() *models.StateDirStatus) { s.stateDir.Store(&fn) }

// SetKvstore installs the kvstore connection's status for GET /v1/status.
func (s *Server) SetKvstore(fn func() *models.KvstoreStatus) { s.kvstore.Store(&fn) }

// SetHealth installs the health endpoint's status for GET /v1/status.
func (s *Server) SetHealth(fn func() *models.HealthStatus) { s.health.Store(&fn) }

// SetNodeHealth installs the remote nodes' reachability for GET
// /v1/health and the status's summary.
func (s *Server) SetNodeHealth(fn func() []models.NodeHealth) { s.nodeHealth.Store(&fn) }

// SetRestore installs what the restore at start did, for GET /v1/status.
func (s *Server) SetRestore(st models.RestoreStatus) { s.restore.Store(&st) }

// New creates a server for sys. It refuses mutating calls until SetReady.
func New(cfg Config, sys *actors.System, log *slog.Logger) (*Server, error) {
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 512
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = 60 * time.Second
	}
	if cfg.BodyTimeout == 0 {
		cfg.BodyTimeout = 10 * time.Second
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = 2 * time.Minute
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = 1024
	}
	if cfg.MaxHTTPConns == 0 {
		cfg.MaxHTTPConns = 64
	}
	if cfg.MaxInFlight < 0 || cfg.RequestTimeout < 0 || cfg.BodyTimeout < 0 || cfg.WriteTimeout < 0 || cfg.IdleTimeout < 0 {
		return nil, fmt.Errorf("api config: MaxInFlight and the timeouts must not be negative: %w", ErrInvalidConfig)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	s := &Server{cfg: cfg, sys: sys, ix: sys.Index, log: log.With("component", "api"),
		sem: make(chan struct{}, cfg.MaxInFlight), started: time.Now(), ranges: map[ipam.Family]*ipam.Range{},
		streamsDone: make(chan struct{}), nodeAddrs: slices.Clone(cfg.NodeAddrs), hostPortKick: make(chan struct{}, 1)}
	for fam, p := range map[ipam.Family]netip.Prefix{ipam.IPv4: sys.Config.IPAM.IPv4, ipam.IPv6: sys.Config.IPAM.IPv6} {
		if p.IsValid() {
			r, err := ipam.NewRange(p, ipam.Sequential, nil)
			if err != nil {
				return nil, fmt.Errorf("api: %s range: %w", fam, err)
			}
			s.ranges[fam] = r
		}
	}
	s.text = newRangesText(s.ranges)
	s.routes()
	s.http = s.newHTTPServer(s)
	return s, nil
}

// readHeaderTimeout bounds reading a request's headers.
const readHeaderTimeout = 10 * time.Second

// newHTTPServer returns an http.Server for h with the API's deadlines:
// headers within readHeaderTimeout, a mutating call's body within
// BodyTimeout (set by mutating), the answer written within
// RequestTimeout + WriteTimeout of the headers (event streams move their
// own deadline forward per batch), idle keep-alive connections closed
// after IdleTimeout.
func (s *Server) newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: readHeaderTimeout,
		WriteTimeout: s.cfg.RequestTimeout + s.cfg.WriteTimeout, IdleTimeout: s.cfg.IdleTimeout,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
}

// SetReady lets mutating calls through (after restore).
func (s *Server) SetReady() { s.ready.Store(true) }

func (s *Server) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /v1/healthz", s.healthz)
	m.HandleFunc("GET /v1/health", s.healthReport)
	m.HandleFunc("GET /v1/status", s.status)
	m.HandleFunc("PUT /v1/endpoint/{id}", s.mutating(s.putEndpoint))
	m.HandleFunc("GET /v1/endpoint/{id}", s.getEndpoint)
	m.HandleFunc("GET /v1/endpoint", s.listEndpoints)
	m.HandleFunc("DELETE /v1/endpoint/{id}", s.mutating(s.deleteEndpoint))
	m.HandleFunc("DELETE /v1/endpoint", s.mutating(s.deleteEndpointBatch))
	m.HandleFunc("PATCH /v1/endpoint/{id}/labels", s.mutating(s.patchLabels))
	m.HandleFunc("POST /v1/endpoint/{id}/regenerate", s.mutating(s.regenerate))
	m.HandleFunc("GET /v1/endpoint/{id}/healthz", s.subresource("healthz", s.endpointHealth))
	m.HandleFunc("POST /v1/ipam", s.mutating(s.allocateIP))
	m.HandleFunc("DELETE /v1/ipam/{ip}", s.mutating(s.releaseIP))
	m.HandleFunc("GET /v1/ipam", s.ipamStatus)
	m.HandleFunc("POST /v1/gc", s.mutating(s.gc))
	m.HandleFunc("POST /v1/attach", s.mutating(s.attach))
	// pod-name:<ns>/<pod> references with an unescaped '/'.
	m.HandleFunc("PUT /v1/endpoint/{id}/{pod}", s.mutating(s.putEndpoint))
	m.HandleFunc("GET /v1/endpoint/{id}/{pod}", s.getEndpoint)
	m.HandleFunc("DELETE /v1/endpoint/{id}/{pod}", s.mutating(s.deleteEndpoint))
	m.HandleFunc("PATCH /v1/endpoint/{id}/{pod}/labels", s.mutating(s.patchLabels))
	m.HandleFunc("POST /v1/endpoint/{id}/{pod}/regenerate", s.mutating(s.regenerate))
	m.HandleFunc("GET /v1/endpoint/{id}/{pod}/healthz", s.endpointHealth)
	m.HandleFunc("GET /v1/identity", s.listIdentities)
	m.HandleFunc("GET /v1/identity/{id}", s.getIdentity)
	m.HandleFunc("PUT /v1/policy", s.mutatingLimit(maxPolicyBody, s.putPolicy))
	m.HandleFunc("GET /v1/policy", s.listPolicies)
	m.HandleFunc("DELETE /v1/policy", s.mutating(s.deletePolicy))
	m.HandleFunc("GET /v1/endpoint/{id}/policy", s.subresource("policy", s.getEndpointPolicy))
	m.HandleFunc("GET /v1/endpoint/{id}/{pod}/policy", s.getEndpointPolicy)
	m.HandleFunc("GET /v1/ipcache", s.listIPCache)
	m.HandleFunc("GET /v1/service", s.listServices)
	m.HandleFunc("GET /v1/nodes", s.listNodes)
	m.HandleFunc("GET /v1/drops", s.listDrops)
	m.HandleFunc("GET /v1/fqdn/cache", s.listFQDNCache)
	m.HandleFunc(flowsRoute, s.listFlows)
	s.operatorRoutes(m)
	s.uiRoutes(m)
	s.mux = m
}

// subresource serves h, unless {id} is a pod-name reference without its
// pod ("pod-name:<ns>"): then the path names a pod called like the
// sub-resource (pod-name:default/healthz) and reads that endpoint.
func (s *Server) subresource(name string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if id := r.PathValue("id"); strings.HasPrefix(id, "pod-name:") && !strings.Contains(id, "/") {
			r.SetPathValue("pod", name)
			s.getEndpoint(w, r)
			return
		}
		h(w, r)
	}
}

// ServeHTTP implements http.Handler: JSON errors for unknown routes and
// methods, panics turned into 500s. The mux routes each request once;
// its own 404 and 405 answers are caught by the codeWriter (the request
// has no pattern then) and replaced by JSON errors here.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start, rec := time.Now(), &codeWriter{ResponseWriter: w, req: r}
	s.serve(rec, r)
	pattern := r.Pattern
	if pattern == eventsRoute || pattern == flowsRoute && r.URL.Query().Has("follow") {
		return
	}
	if pattern == "" {
		pattern = "unmatched"
	}
	s.cfg.Metrics.ObserveRequest(pattern, r.Method, rec.code(), time.Since(start))
}

// serve routes r and runs its handler.
func (s *Server) serve(w *codeWriter, r *http.Request) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("handler panicked", "method", r.Method, "path", r.URL.Path, "panic", p)
			w.answering = true
			writeError(w, &apiError{http.StatusInternalServerError, CodeInternal, "internal error"})
		}
	}()
	if r.RequestURI != "*" { // the mux would answer "*" with a bare 400
		if err := checkRequest(r); err != nil {
			w.answering = true
			writeError(w, err)
			return
		}
		s.mux.ServeHTTP(w, r) // sets r.Pattern and the path values
		if r.Pattern != "" {
			return
		}
	}
	w.answering = true
	if w.unmatched.status == http.StatusMethodNotAllowed {
		w.Header().Set("Allow", w.unmatched.header.Get("Allow"))
		writeError(w, &apiError{http.StatusMethodNotAllowed, CodeMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path)})
		return
	}
	writeError(w, notFound(fmt.Sprintf("no route %s %s", r.Method, r.URL.Path)))
}

// mutating refuses calls while starting or stopping and bounds how many
// run at once; callers beyond the bound wait (back-pressure). The body
// (at most maxBody bytes) is read before a slot is taken, within
// Config.BodyTimeout: a client that stalls its upload never holds a slot.
func (s *Server) mutating(h func(http.ResponseWriter, *http.Request) error) http.HandlerFunc {
	return s.mutatingLimit(maxBody, h)
}

// mutatingLimit is mutating for bodies of at most limit bytes.
func (s *Server) mutatingLimit(limit int, h func(http.ResponseWriter, *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		switch {
		case s.closing.Load():
			writeError(w, &apiError{http.StatusServiceUnavailable, CodeShuttingDown, "agent is shutting down"})
			return
		case !s.ready.Load():
			w.Header().Set("Retry-After", "1")
			writeError(w, &apiError{http.StatusServiceUnavailable, CodeStarting, "agent is starting (restoring endpoints); retry"})
			return
		}
		body, err := s.readBody(w, r, limit)
		if err != nil {
			writeError(w, err)
			return
		}
		defer body.release()
		r.Body = body
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
		defer cancel()
		if !s.acquire(ctx) {
			writeError(w, &apiError{http.StatusGatewayTimeout, CodeTimeout,
				fmt.Sprintf("too many requests in flight: no slot within %s", s.cfg.RequestTimeout)})
			return
		}
		defer func() { <-s.sem }()
		if err := h(w, r.WithContext(ctx)); err != nil {
			writeError(w, err)
		}
	}
}

// jsonContentType is the Content-Type header value of every JSON answer,
// assigned to response headers without a copy: nothing modifies it.
var jsonContentType = []string{"application/json"}

// jsonWriter is an encoder bound to a writer that can be re-pointed,
// pooled so that an answer does not allocate an encoder.
type jsonWriter struct {
	w   io.Writer
	enc *json.Encoder
}

func (jw *jsonWriter) Write(b []byte) (int, error) { return jw.w.Write(b) }

var jsonWriters = sync.Pool{New: func() any {
	jw := &jsonWriter{}
	jw.enc = json.NewEncoder(jw)
	return jw
}}

// acquire takes a slot of the in-flight bound, waiting until ctx ends.
// A free slot is taken without ctx.Done (which allocates a channel).
func (s *Server) acquire(ctx context.Context) bool {
	select {
	case s.sem <- struct{}{}:
		return true
	default:
	}
	select {
	case s.sem <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// writeJSON answers status with v encoded as json.Encoder does
// (HTML-escaped, one trailing newline). Endpoint answers have their
// own writer (writeEndpoint).
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(status)
	jw := jsonWriters.Get().(*jsonWriter)
	jw.w = w
	_ = jw.enc.Encode(v)
	jw.w = nil
	jsonWriters.Put(jw)
}

func writeError(w http.ResponseWriter, err error) {
	status, code := classify(err)
	if status == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
		// Every 503 is "busy or not yet: retry" (the identity store
		// unreachable, an attach in flight, starting, stopping): say when.
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, status, &models.Error{Code: code, Message: err.Error()})
}

// Listen opens the unix socket at path with the given mode, removing a
// stale socket file left by a previous agent. Returns ErrSocketInUse if
// another process answers on it and ErrNotSocket if path exists and is not
// a socket (it is left untouched).
func Listen(path string, mode os.FileMode) (net.Listener, error) {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("listen %s: %w", path, err)
	case fi.Mode().Type() != os.ModeSocket:
		return nil, fmt.Errorf("listen %s: a %s: %w", path, fileKind(fi.Mode()), ErrNotSocket)
	default:
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("listen %s: %w", path, ErrSocketInUse)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("listen %s: remove stale socket: %w", path, err)
		}
	}
	// The umask is process-wide: changing it around bind(2) would race
	// with every other file the process creates. The socket is made in a
	// private directory (0700), chmod-ed there and renamed into place, so
	// that it is never reachable with the umask's mode.
	tmpDir, err := os.MkdirTemp(filepath.Dir(path), ".s")
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	defer os.RemoveAll(tmpDir)
	tmp := filepath.Join(tmpDir, "s")
	if len(tmp) >= maxSocketPath {
		tmp = path // no room for the detour: bind in place, then chmod
	}
	l, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	// Stop and Crash decide whether the socket file goes; Close never
	// unlinks it (after the rename it would name the wrong file).
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("listen %s: chmod: %w", path, err)
	}
	if tmp != path {
		// A link, not a rename: whatever appeared at path since the check
		// above stays (EEXIST) instead of being replaced.
		if err := os.Link(tmp, path); err != nil {
			l.Close()
			return nil, fmt.Errorf("listen %s: %w", path, err)
		}
	}
	return l, nil
}

// fileKind names what a non-socket path is, for Listen's refusal.
func fileKind(m os.FileMode) string {
	switch {
	case m.IsRegular():
		return "regular file"
	case m.IsDir():
		return "directory"
	case m&os.ModeSymlink != 0:
		return "symlink"
	default:
		return "special file"
	}
}

// maxSocketPath is the size of sockaddr_un's sun_path on Linux,
// terminating NUL included.
const maxSocketPath = 108

// Serve serves on l (bounded to Config.MaxConns connections) until
// Shutdown.
func (s *Server) Serve(l net.Listener) error {
	err := s.http.Serve(LimitListener(l, s.cfg.MaxConns))
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops accepting connections and waits for in-flight requests.
func (s *Server) Shutdown(ctx context.Context) error {
	s.closing.Store(true)
	s.closeOnce.Do(func() { close(s.streamsDone) })
	return s.http.Shutdown(ctx)
}
