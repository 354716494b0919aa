package agent_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/api"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// agentConfig returns a valid fake-datapath config in dir.
func agentConfig(dir string) agent.Config {
	return agent.Config{
		Socket:    filepath.Join(dir, "run", "a.sock"),
		StateDir:  filepath.Join(dir, "state"),
		IPv4Range: netip.MustParsePrefix("10.204.0.0/24"),
		Datapath:  "fake",
		Fake:      datapath.NewFake(1),
	}
}

// startAgentT starts an agent; stop (idempotent) stops it and runs at
// cleanup. Agent.Stop itself must be called once only.
func startAgentT(tb testing.TB, cfg agent.Config) (a *agent.Agent, c *client.Client, stop func()) {
	tb.Helper()
	a, err := agent.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		tb.Fatalf("agent.Start: %v", err)
	}
	c = client.New(cfg.Socket)
	var once sync.Once
	stop = func() {
		once.Do(func() {
			c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := a.Stop(ctx); err != nil {
				tb.Errorf("agent stop: %v", err)
			}
		})
	}
	tb.Cleanup(stop)
	return a, c, stop
}

func ctx10(tb testing.TB) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

func TestConfigValidate(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name   string
		mutate func(*agent.Config)
		flag   string // the message names the bad field by its flag
	}{
		{"no socket", func(c *agent.Config) { c.Socket = "" }, "--socket"},
		{"no state dir", func(c *agent.Config) { c.StateDir = "" }, "--state-dir"},
		{"no range", func(c *agent.Config) { c.IPv4Range = netip.Prefix{} }, "--ipv4-range"},
		{"ipv6 as ipv4", func(c *agent.Config) { c.IPv4Range = netip.MustParsePrefix("fd00::/120") }, "--ipv4-range"},
		{"ipv4 as ipv6", func(c *agent.Config) { c.IPv6Range = netip.MustParsePrefix("10.0.0.0/24") }, "--ipv6-range"},
		{"mapped ipv6", func(c *agent.Config) { c.IPv6Range = netip.MustParsePrefix("::ffff:10.0.0.0/120") }, "--ipv6-range"},
		{"ipv4 too small", func(c *agent.Config) { c.IPv4Range = netip.MustParsePrefix("10.0.0.0/31") }, "--ipv4-range"},
		{"ipv6 too big", func(c *agent.Config) { c.IPv6Range = netip.MustParsePrefix("fd00::/64") }, "--ipv6-range"},
		{"unknown datapath", func(c *agent.Config) { c.Datapath = "ebpf" }, "--datapath"},
		{"empty datapath", func(c *agent.Config) { c.Datapath = "" }, "--datapath"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := agentConfig(dir)
			tt.mutate(&cfg)
			err := cfg.Validate()
			if err == nil {
				t.Fatalf("Validate() = nil")
			}
			if !strings.Contains(err.Error(), tt.flag) {
				t.Errorf("Validate() = %q, want it to name %s", err, tt.flag)
			}
			if _, err := agent.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil {
				t.Fatalf("Start with an invalid config succeeded")
			}
		})
	}
	t.Run("valid", func(t *testing.T) {
		cfg := agentConfig(dir)
		cfg.IPv6Range = netip.MustParsePrefix("fd00:204::/120")
		if err := cfg.Validate(); err != nil {
			t.Fatalf("Validate() = %v", err)
		}
	})
	t.Run("invalid wraps ErrInvalidConfig", func(t *testing.T) {
		cfg := agentConfig(dir)
		cfg.Datapath = "x"
		if err := cfg.Validate(); !errors.Is(err, agent.ErrInvalidConfig) {
			t.Fatalf("Validate() = %v, want ErrInvalidConfig", err)
		}
	})
}

func TestStartServeStop(t *testing.T) {
	cfg := agentConfig(t.TempDir())
	a, c, stop := startAgentT(t, cfg)
	ctx := ctx10(t)
	if err := c.Healthz(ctx); err != nil {
		t.Fatalf("healthz: %v", err)
	}
	st, err := c.Status(ctx)
	if err != nil || st.State != "ok" || st.Datapath != "fake" {
		t.Fatalf("status = %+v, %v", st, err)
	}
	// Mutating calls are served once Start returned.
	ep, err := c.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{ContainerID: "c1", Labels: []string{"k8s:app=a"}, SyncBuild: true})
	if err != nil || ep.State != "ready" {
		t.Fatalf("create = %+v, %v", ep, err)
	}
	if _, ok := a.Index.Endpoint(1); !ok && ep.ID == 1 {
		t.Errorf("agent index does not hold the endpoint")
	}
	for _, dir := range []string{filepath.Dir(cfg.Socket), cfg.StateDir} {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			t.Errorf("directory %s not created: %v", dir, err)
		}
	}
	fi, err := os.Stat(cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode %v, want a socket with 0660", fi.Mode())
	}

	stop()
	if _, err := os.Stat(cfg.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket still there after Stop: %v", err)
	}
	if err := c.Healthz(ctx); err == nil {
		t.Errorf("healthz answered after Stop")
	}
}

func TestSocketModeConfigurable(t *testing.T) {
	cfg := agentConfig(t.TempDir())
	cfg.SocketMode = 0o600
	startAgentT(t, cfg)
	fi, err := os.Stat(cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Fatalf("socket mode %o, want 600", perm)
	}
}

func TestSocketInUse(t *testing.T) {
	dir := t.TempDir()
	cfg := agentConfig(dir)
	startAgentT(t, cfg)
	second := agentConfig(filepath.Join(dir, "second"))
	second.Socket = cfg.Socket
	_, err := agent.Start(second, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if !errors.Is(err, api.ErrSocketInUse) {
		t.Fatalf("second agent on the same socket: %v, want ErrSocketInUse", err)
	}
	// The first agent still serves.
	if err := client.New(cfg.Socket).Healthz(ctx10(t)); err != nil {
		t.Fatalf("first agent after the refused start: %v", err)
	}
}

func TestStaleSocketReplaced(t *testing.T) {
	cfg := agentConfig(t.TempDir())
	if err := os.MkdirAll(filepath.Dir(cfg.Socket), 0o750); err != nil {
		t.Fatal(err)
	}
	// A socket file nobody listens on, as a crashed agent leaves it.
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: cfg.Socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	if _, err := os.Stat(cfg.Socket); err != nil {
		t.Fatalf("stale socket not left behind: %v", err)
	}
	_, c, _ := startAgentT(t, cfg)
	if err := c.Healthz(ctx10(t)); err != nil {
		t.Fatalf("agent on a stale socket: %v", err)
	}
}

func TestStartAgainAfterStop(t *testing.T) {
	cfg := agentConfig(t.TempDir())
	_, _, stop := startAgentT(t, cfg)
	stop()
	cfg.Fake = datapath.NewFake(2)
	_, c, _ := startAgentT(t, cfg)
	if err := c.Healthz(ctx10(t)); err != nil {
		t.Fatalf("second start on the same socket and state dir: %v", err)
	}
}
