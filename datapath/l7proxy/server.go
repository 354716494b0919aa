package l7proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	xds "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"

	"github.com/membrane-cni/membrane/datapath/l7proxy/xdsapi"
)

// maxStreams bounds the concurrent xDS streams (one proxy process, and
// a restart's overlap); maxNonces the nonces remembered per stream.
const (
	maxStreams = 4
	maxNonces  = 64
)

// Server is the agent's xDS server for the proxy, on a unix socket. Every
// change of the configuration is a new version; Tracker learns which
// versions the proxy acknowledged or rejected.
type Server struct {
	tracker *Tracker
	log     *slog.Logger
	cache   *cache.LinearCache
	grpc    *grpc.Server
	lis     *peerListener
	path    string

	mu      sync.Mutex // serialises cache updates, so version mirrors the cache's counter
	version uint64
	nonces  map[int64]map[string]uint64 // stream -> nonce -> version sent
	streams int
}

// NewServer listens on the unix socket path (replacing a stale one) and
// serves xDS until Close.
func NewServer(path string, tracker *Tracker, log *slog.Logger) (*Server, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("xds socket %s: %w", path, err)
	}
	raw, err := listenPrivate(path)
	if err != nil {
		return nil, fmt.Errorf("xds listen %s: %w", path, err)
	}
	lis := &peerListener{Listener: raw, log: log}
	same := PeerCheck(SameUser)
	lis.check.Store(&same)
	s := &Server{tracker: tracker, log: log, lis: lis, path: path, nonces: map[int64]map[string]uint64{},
		cache: cache.NewLinearCache(xdsapi.TypeURL, cache.WithVersionPrefix(xdsapi.VersionPrefix))}
	cb := xds.CallbackFuncs{
		StreamOpenFunc:     s.streamOpen,
		StreamClosedFunc:   s.streamClosed,
		StreamRequestFunc:  s.streamRequest,
		StreamResponseFunc: s.streamResponse,
	}
	s.grpc = grpc.NewServer(grpc.MaxConcurrentStreams(maxStreams))
	discovery.RegisterAggregatedDiscoveryServiceServer(s.grpc, xds.NewServer(context.Background(), s.cache, cb))
	go func() {
		if err := s.grpc.Serve(lis); err != nil {
			log.Warn("xds server stopped", "err", err)
		}
	}()
	return s, nil
}

// SetPeerCheck replaces the check of new connections' peers (SameUser
// until then). The Linux datapath accepts only the process its
// supervisor runs, so no other process can take the proxy's streams or
// acknowledge a version for it.
func (s *Server) SetPeerCheck(check PeerCheck) { s.lis.check.Store(&check) }

// Path returns the socket's path.
func (s *Server) Path() string { return s.path }

// Close stops the server and removes its socket.
func (s *Server) Close() {
	s.grpc.Stop()
	_ = os.Remove(s.path)
}

// The resources the server publishes (xdsapi).
type (
	EndpointPolicy = xdsapi.EndpointPolicy
	IPCache        = xdsapi.IPCache
	Resource       = xdsapi.Resource
	Secrets        = xdsapi.Secrets
)

// Tracker returns the tracker of the proxy's acknowledgements.
func (s *Server) Tracker() *Tracker { return s.tracker }

// Streams returns how many xDS streams are open.
func (s *Server) Streams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams
}

// Version returns the current configuration version.
func (s *Server) Version() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version
}

// SetEndpoint publishes p (nil: removes endpoint id's configuration)
// and returns the version that holds it.
func (s *Server) SetEndpoint(id uint64, p *EndpointPolicy) (uint64, error) {
	if p == nil {
		return s.update(xdsapi.EndpointName(id), nil)
	}
	return s.update(xdsapi.EndpointName(id), &Resource{Endpoint: p})
}

// SetIPCache publishes the whole ipcache c.Entries (every shard) and
// returns the version holding it.
func (s *Server) SetIPCache(c IPCache) (uint64, error) {
	shards := xdsapi.SplitIPCache(c.Entries)
	return s.SetIPCacheShards(shards[:]...)
}

// SetIPCacheShards publishes the ipcache shards given (the others keep
// what they held) in one version and returns it.
func (s *Server) SetIPCacheShards(shards ...IPCache) (uint64, error) {
	res := make(map[string]types.Resource, len(shards))
	for i := range shards {
		c := &shards[i]
		if err := c.Check(); err != nil {
			return 0, err
		}
		enc, err := xdsapi.Encode(&Resource{IPCache: c})
		if err != nil {
			return 0, err
		}
		res[xdsapi.IPCacheShardName(c.Shard)] = enc
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.cache.UpdateResources(res, nil); err != nil {
		return 0, fmt.Errorf("xds update ipcache: %w", err)
	}
	s.version++
	return s.version, nil
}

// SetSecrets publishes the header secrets' values and returns the
// version holding them.
func (s *Server) SetSecrets(v Secrets) (uint64, error) {
	return s.update(xdsapi.SecretsResource, &Resource{Secrets: &v})
}

func (s *Server) update(name string, v *Resource) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v == nil {
		if _, ok := s.cache.GetResources()[name]; !ok {
			return s.version, nil
		}
		if err := s.cache.DeleteResource(name); err != nil {
			return 0, fmt.Errorf("xds delete %s: %w", name, err)
		}
		s.version++
		return s.version, nil
	}
	res, err := xdsapi.Encode(v)
	if err != nil {
		return 0, err
	}
	if err := s.cache.UpdateResource(name, types.Resource(res)); err != nil {
		return 0, fmt.Errorf("xds update %s: %w", name, err)
	}
	s.version++
	return s.version, nil
}

func (s *Server) streamOpen(_ context.Context, id int64, typ string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.streams >= maxStreams {
		return fmt.Errorf("xds: %d streams open, limit reached", s.streams)
	}
	s.streams++
	s.nonces[id] = map[string]uint64{}
	s.log.Info("proxy connected", "stream", id)
	return nil
}

func (s *Server) streamClosed(id int64, _ *core.Node) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.nonces[id]; ok {
		s.streams--
		delete(s.nonces, id)
	}
	s.log.Info("proxy disconnected", "stream", id)
}

func (s *Server) streamResponse(_ context.Context, id int64, _ *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
	v, err := xdsapi.ParseVersion(resp.GetVersionInfo())
	if err != nil {
		s.log.Warn("xds response with a foreign version", "err", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nonces[id]
	if n == nil {
		return
	}
	if len(n) >= maxNonces {
		clear(n) // older nonces answered long ago: acknowledgements name the newest
	}
	n[resp.GetNonce()] = v
}

// streamRequest sees every request: the first one (no nonce) opens the
// subscription; the others acknowledge (no error_detail) or reject the
// version sent with their response_nonce.
func (s *Server) streamRequest(id int64, req *discovery.DiscoveryRequest) error {
	if req.GetTypeUrl() != xdsapi.TypeURL {
		return fmt.Errorf("xds: type %q is not served (want %s)", req.GetTypeUrl(), xdsapi.TypeURL)
	}
	if req.GetResponseNonce() == "" {
		return nil
	}
	s.mu.Lock()
	v, ok := s.nonces[id][req.GetResponseNonce()]
	s.mu.Unlock()
	if !ok {
		return nil // a stale nonce: a newer response is on its way
	}
	if d := req.GetErrorDetail(); d != nil {
		s.log.Warn("proxy rejected configuration", "version", v, "reason", d.GetMessage())
		s.tracker.Nack(v, d.GetMessage())
		return nil
	}
	s.tracker.Ack(v)
	return nil
}
