// Package etcdtest runs a real etcd (go.etcd.io/etcd/server/v3/embed) for
// tests, on loopback ports of its own, with a data directory that survives
// Stop so that Restart brings the same store back, optionally with TLS
// (client certificates required), and a TCP Proxy that a test can cut to
// make etcd unreachable for one client only. Member, without a
// testing.TB, is what membrane-sim's multi-node runs embed too. Only tests
// and the simulator import it: the agent binary never links the etcd
// server (test/arch checks that).
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

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// Options configure a Server.
type Options struct {
	// TLS serves clients over TLS and requires client certificates; the
	// files are Server.TLS.
	TLS bool
}

// Member is one embedded etcd member, tuned for tests and simulations
// (fast ticks, no fsync, no logs), that can be stopped and started again
// on its data directory and ports.
type Member struct {
	cfg *embed.Config
	// mu guards e.
	mu sync.Mutex
	e  *embed.Etcd
	// Endpoint is the client URL (http:// or https://).
	Endpoint string
}

// NewMember configures (without starting) a single-member cluster named
// name with its data in dir, serving clients on cu and peers on pu;
// tlsInfo, when not nil, serves clients over TLS.
func NewMember(name, dir string, cu, pu url.URL, tlsInfo *transport.TLSInfo) *Member {
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = dir
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.UnsafeNoFsync = true
	if tlsInfo != nil {
		cfg.ClientTLSInfo = *tlsInfo
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	return &Member{cfg: cfg, Endpoint: cu.String()}
}

// Start starts the member and waits until it serves (at most 60 s).
func (m *Member) Start() error {
	e, err := embed.StartEtcd(m.cfg)
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		e.Close()
		return fmt.Errorf("start etcd: not ready after 60 s")
	}
	m.mu.Lock()
	m.e = e
	m.mu.Unlock()
	return nil
}

// Stop stops the member (idempotent); its data directory stays.
func (m *Member) Stop() {
	m.mu.Lock()
	e := m.e
	m.e = nil
	m.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// Restart stops the member, waits down, and starts it again on the same
// data directory and ports, retrying while the old listener's ports
// linger (up to 5 s).
func (m *Member) Restart(down time.Duration) error {
	m.Stop()
	time.Sleep(down)
	m.cfg.ClusterState = embed.ClusterStateFlagExisting
	var err error
	for range 50 {
		if err = m.Start(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// Server is one embedded etcd member of a test.
type Server struct {
	*Member
	tb testing.TB
	// DataDir is the member's data directory.
	DataDir string
	// TLS holds the certificate files when Options.TLS is set.
	TLS *Certs
}

// Start starts an etcd member and registers its Stop with tb.Cleanup.
func Start(tb testing.TB, opts Options) *Server {
	tb.Helper()
	dir := tb.TempDir()
	s := &Server{tb: tb, DataDir: filepath.Join(dir, "data")}
	scheme := "http"
	var tlsInfo *transport.TLSInfo
	if opts.TLS {
		s.TLS = WriteCerts(tb, filepath.Join(dir, "pki"))
		tlsInfo = &transport.TLSInfo{CertFile: s.TLS.ServerCert, KeyFile: s.TLS.ServerKey,
			TrustedCAFile: s.TLS.CA, ClientCertAuth: true}
		scheme = "https"
	}
	cu := url.URL{Scheme: scheme, Host: freePort(tb)}
	pu := url.URL{Scheme: "http", Host: freePort(tb)}
	s.Member = NewMember("etcdtest", s.DataDir, cu, pu, tlsInfo)
	if err := s.Member.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// Restart starts the member again on the same data directory and ports.
// The ports were free when Start chose them; an etcd that cannot bind
// them again fails the test.
func (s *Server) Restart() {
	s.tb.Helper()
	if err := s.Member.Restart(0); err != nil {
		s.tb.Fatalf("restart etcd: %v", err)
	}
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
