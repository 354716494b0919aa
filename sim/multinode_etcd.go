package sim

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// simEtcd is the embedded etcd the nodes of a multi-node run share; it
// can be stopped and started again on the same data directory.
type simEtcd struct {
	cfg      *embed.Config
	endpoint string
	// mu guards e.
	mu sync.Mutex
	e  *embed.Etcd
}

func startSimEtcd(dir string) (*simEtcd, error) {
	cfg := embed.NewConfig()
	cfg.Name = "membrane-sim"
	cfg.Dir = filepath.Join(dir, "etcd")
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.UnsafeNoFsync = true
	ports := make([]string, 2)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("etcd port: %w", err)
		}
		ports[i] = l.Addr().String()
		_ = l.Close()
	}
	cu, pu := url.URL{Scheme: "http", Host: ports[0]}, url.URL{Scheme: "http", Host: ports[1]}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	s := &simEtcd{cfg: cfg, endpoint: cu.String()}
	return s, s.start()
}

func (s *simEtcd) start() error {
	e, err := embed.StartEtcd(s.cfg)
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		e.Close()
		return fmt.Errorf("start etcd: not ready after 60 s")
	}
	s.mu.Lock()
	s.e = e
	s.mu.Unlock()
	return nil
}

func (s *simEtcd) stop() {
	s.mu.Lock()
	e := s.e
	s.e = nil
	s.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// restart stops etcd, waits down, and starts it on the same data
// directory and ports (retrying while the ports linger).
func (s *simEtcd) restart(down time.Duration) error {
	s.stop()
	time.Sleep(down)
	s.cfg.ClusterState = embed.ClusterStateFlagExisting
	var err error
	for range 50 {
		if err = s.start(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}
