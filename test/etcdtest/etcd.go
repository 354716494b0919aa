// Package etcdtest runs a real etcd (go.etcd.io/etcd/server/v3/embed) for
// tests, on loopback ports of its own, with a data directory that survives
// Stop so that Restart brings the same store back, optionally with TLS
// (client certificates required), and a TCP Proxy that a test can cut to
// make etcd unreachable for one client only. Only tests import it: the
// agent binary never links the etcd server (test/arch checks that).
package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/testutil"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Options configure a Server.
type Options struct {
	// TLS serves clients over TLS and requires client certificates; the
	// files are Server.TLS.
	TLS bool
}

// Server is one embedded etcd member.
type Server struct {
	tb  testing.TB
	cfg *embed.Config
	// mu guards e.
	mu sync.Mutex
	e  *embed.Etcd
	// Endpoint is the client URL (http:// or https://).
	Endpoint string
	// DataDir is the member's data directory.
	DataDir string
	// TLS holds the certificate files when Options.TLS is set.
	TLS *Certs
}

// Start starts an etcd member and registers its Stop with tb.Cleanup.
func Start(tb testing.TB, opts Options) *Server {
	tb.Helper()
	dir := tb.TempDir()
	cfg := embed.NewConfig()
	cfg.Name = "etcdtest"
	cfg.Dir = filepath.Join(dir, "data")
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.UnsafeNoFsync = true
	scheme := "http"
	s := &Server{tb: tb, cfg: cfg, DataDir: cfg.Dir}
	if opts.TLS {
		s.TLS = WriteCerts(tb, filepath.Join(dir, "pki"))
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: s.TLS.ServerCert, KeyFile: s.TLS.ServerKey,
			TrustedCAFile: s.TLS.CA, ClientCertAuth: true}
		scheme = "https"
	}
	client, peer := freePort(tb), freePort(tb)
	cu := url.URL{Scheme: scheme, Host: client}
	pu := url.URL{Scheme: "http", Host: peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	s.Endpoint = cu.String()
	if err := s.start(); err != nil {
		tb.Fatalf("start etcd: %v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

func (s *Server) start() error {
	e, err := embed.StartEtcd(s.cfg)
	if err != nil {
		return err
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		e.Close()
		return fmt.Errorf("etcd not ready after 60 s")
	}
	s.mu.Lock()
	s.e = e
	s.mu.Unlock()
	return nil
}

// Stop stops the member (idempotent); its data directory stays.
func (s *Server) Stop() {
	s.mu.Lock()
	e := s.e
	s.e = nil
	s.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// Restart starts the member again on the same data directory and ports.
// The ports were free when Start chose them; an etcd that cannot bind
// them again fails the test.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Stop()
	s.cfg.ClusterState = embed.ClusterStateFlagExisting
	var err error
	for range 50 { // the old listener's port may linger for a moment
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.tb.Fatalf("restart etcd: %v", err)
}

// freePort returns a loopback host:port that was free a moment ago
// (testutil.FreePort: outside the ephemeral range, random).
func freePort(tb testing.TB) string {
	tb.Helper()
	port, err := testutil.FreePort("127.0.0.1")
	if err != nil {
		tb.Fatalf("free port: %v", err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}
