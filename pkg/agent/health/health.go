package health

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/ifname"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// Names of the health endpoint.
const (
	// ContainerID identifies the health endpoint in the index.
	ContainerID = "membrane-health"
	// HostIfName is the host side of its veth (Cilium: lxc_health).
	HostIfName = ifname.Health
	// Namespace and Pod make its IPAM owner, "membrane/membrane-health",
	// which stays the same across replacements.
	Namespace = "membrane"
	Pod       = "membrane-health"
	// Port is the responder's TCP port (Cilium's health port).
	Port = 4240
	// Path is what the responder answers (200, body "ok").
	Path = "/hello"
)

// Status states.
const (
	StateOK       = "ok"
	StateFailing  = "failing"
	StateStarting = "starting"
	StateDisabled = "disabled"
)

// opTimeout bounds the health endpoint's setup steps.
const opTimeout = 30 * time.Second

// Config configures the health endpoint.
type Config struct {
	// Dir holds health.json and the namespace's bind mount ("netns").
	Dir string
	// Interval is the time between probes (default 10 s); a failed setup
	// is retried at the same pace.
	Interval time.Duration
	// ProbeTimeout bounds one probe (default 2 s).
	ProbeTimeout time.Duration
}

// Manager runs the health endpoint and its prober.
type Manager struct {
	cfg  Config
	sys  *actors.System
	dp   datapath.HealthDatapath
	log  *slog.Logger
	spec datapath.HealthSpec
	http *http.Client

	stop context.CancelFunc
	done chan struct{}

	// mu guards status, ep and srv.
	mu     sync.Mutex
	status models.HealthStatus
	ep     endpoint.ID
	srv    *http.Server
}

// Disabled is the status reported when the agent runs no health endpoint.
func Disabled() *models.HealthStatus { return &models.HealthStatus{State: StateDisabled} }

// Start sets the health endpoint up in the background (replacing the
// previous agent's), then probes it every Interval until Stop. A failure
// does not fail the agent: it is reported in Status and the setup is
// retried. The status is "starting" until the first probe.
func Start(cfg Config, sys *actors.System, dp datapath.HealthDatapath, log *slog.Logger) *Manager {
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Second
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = 2 * time.Second
	}
	m := &Manager{cfg: cfg, sys: sys, dp: dp, log: log.With("component", "health"), done: make(chan struct{}),
		status: models.HealthStatus{State: StateStarting}}
	m.spec = datapath.HealthSpec{Netns: filepath.Join(cfg.Dir, "netns"), HostIfName: HostIfName}
	m.http = &http.Client{Timeout: cfg.ProbeTimeout, Transport: &http.Transport{
		DialContext: dp.DialHost, DisableKeepAlives: true}}
	ctx, cancel := context.WithCancel(context.Background())
	m.stop = cancel
	go m.loop(ctx)
	return m
}

// Stop stops the prober and the responder. The namespace, the veth and
// the endpoint stay (the next agent replaces them, keeping the address).
func (m *Manager) Stop() {
	m.stop()
	<-m.done
	m.closeServer()
}

// closeServer stops the responder (its listener closes).
func (m *Manager) closeServer() {
	m.mu.Lock()
	srv := m.srv
	m.srv = nil
	m.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// Status returns a copy of the current status.
func (m *Manager) Status() *models.HealthStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.status
	return &st
}

func (m *Manager) loop(ctx context.Context) {
	defer close(m.done)
	m.tick(ctx)
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.tick(ctx)
		}
	}
}

// tick sets the endpoint up if it is not (or no longer: the garbage
// collector deletes it when its veth vanished), then probes it.
func (m *Manager) tick(ctx context.Context) {
	m.mu.Lock()
	up, id := m.srv != nil, m.ep
	m.mu.Unlock()
	if up {
		if ep, ok := m.sys.Index.Endpoint(id); !ok || ep.ContainerID != ContainerID {
			m.log.Warn("health endpoint is gone; setting it up again", "endpoint", id)
			m.closeServer()
			up = false
		}
	}
	if !up {
		if err := m.setup(ctx); err != nil {
			m.log.Error("health endpoint setup failed; retrying", "err", err, "retry-in", m.cfg.Interval)
			m.setStatus(StateFailing, err)
			return
		}
	}
	m.probe(ctx)
}

// probe asks the responder over HTTP from the host netns.
func (m *Manager) probe(ctx context.Context) {
	m.mu.Lock()
	url := "http://" + net.JoinHostPort(m.status.IP, strconv.Itoa(Port)) + Path
	m.mu.Unlock()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		m.setStatus(StateFailing, err)
		return
	}
	resp, err := m.http.Do(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("probe %s: status %d", url, resp.StatusCode)
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return // stopping
		}
		m.log.Warn("health endpoint does not answer", "url", url, "err", err)
		m.setStatus(StateFailing, err)
		return
	}
	m.setStatus(StateOK, nil)
}

func (m *Manager) setStatus(state string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.status.State, m.status.LastProbe, m.status.Error = state, time.Now().UTC(), ""
	if err != nil {
		m.status.Error = err.Error()
	}
}

// setup replaces the previous health endpoint (deleted with NoIPRelease)
// with a new one on the recorded address and starts the responder.
func (m *Manager) setup(ctx context.Context) (retErr error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	prev := m.replacePrevious(ctx)
	ip, gw, err := m.address(ctx, prev)
	if err != nil {
		return err
	}
	spec := m.spec
	spec.IP, spec.Gateway = ip, gw
	var link datapath.HealthLink
	if err := m.inPool(ctx, "health-create", func(c context.Context) (err error) {
		link, err = m.dp.CreateHealth(c, spec)
		return err
	}); err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			_ = m.inPool(context.Background(), "health-delete", func(c context.Context) error { return m.dp.DeleteHealth(c, spec) })
		}
	}()
	id, err := m.createEndpoint(ctx, spec, link)
	if err != nil {
		return err
	}
	if err := writeRecord(m.cfg.Dir, record{IP: ip.String()}); err != nil {
		m.log.Warn("recording the health endpoint's address failed; a restart may change it", "err", err)
	}
	return m.serve(spec, id)
}

// replacePrevious deletes the health endpoint a previous agent left (its
// address stays allocated, for the new one) and returns its address or
// the recorded one.
func (m *Manager) replacePrevious(ctx context.Context) netip.Addr {
	var prev netip.Addr
	if rec, err := readRecord(m.cfg.Dir); err == nil {
		prev, _ = netip.ParseAddr(rec.IP)
	} else if !errors.Is(err, errNoRecord) {
		m.log.Warn("unreadable health record ignored", "err", err)
	}
	old, ok := m.sys.Index.EndpointByContainerID(ContainerID)
	if !ok {
		return prev
	}
	if old.IPv4.IsValid() {
		prev = old.IPv4
	} else if old.IPv6.IsValid() {
		prev = old.IPv6
	}
	res, err := m.sys.Ask(ctx, m.sys.Endpoints, &messages.DeleteEndpoint{ID: old.ID, Options: endpoint.DeleteOptions{NoIPRelease: true}})
	if err == nil {
		if r, ok := res.(*messages.EndpointResult); ok {
			err = r.Err
		}
	}
	if err != nil && !errors.Is(err, actors.ErrEndpointNotFound) {
		m.log.Warn("deleting the previous health endpoint failed", "endpoint", old.ID, "err", err)
	} else {
		m.log.Info("previous health endpoint replaced", "endpoint", old.ID, "ip", prev)
	}
	return prev
}

// owner is the health endpoint's IPAM owner.
const owner = Namespace + "/" + Pod

// address returns the health endpoint's address (prev if it is still ours
// or free) and its family's gateway.
func (m *Manager) address(ctx context.Context, prev netip.Addr) (ip, gw netip.Addr, err error) {
	if !prev.IsValid() {
		// A setup that failed after the allocation left it unclaimed.
		for _, row := range m.sys.Index.IPsByOwner(owner) {
			if row.Endpoint == 0 {
				prev = row.IP
				break
			}
		}
	}
	if prev.IsValid() {
		row, held := m.sys.Index.IP(prev)
		switch {
		case held && row.Endpoint == 0 && row.Owner == owner:
			ip = prev
		case !held:
			ip, _ = m.allocate(ctx, &messages.IPAMAllocateIP{IP: prev, Owner: owner})
		}
	}
	if !ip.IsValid() {
		fam := ipam.IPv4
		if !m.sys.Config.IPAM.IPv4.IsValid() {
			fam = ipam.IPv6
		}
		if ip, err = m.allocate(ctx, &messages.IPAMAllocate{Family: fam, Owner: owner}); err != nil {
			return ip, gw, err
		}
	}
	pfx := m.sys.Config.IPAM.IPv4
	if ip.Is6() {
		pfx = m.sys.Config.IPAM.IPv6
	}
	r, err := ipam.NewRange(pfx, ipam.Sequential, nil)
	if err != nil {
		return ip, gw, fmt.Errorf("health endpoint gateway: %w", err)
	}
	return ip, r.Gateway(), nil
}

func (m *Manager) allocate(ctx context.Context, msg any) (netip.Addr, error) {
	res, err := m.sys.Ask(ctx, m.sys.IPAM, msg)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("allocate health address: %w", err)
	}
	r := res.(*messages.IPAMAllocated)
	if r.Err != nil {
		return netip.Addr{}, fmt.Errorf("allocate health address: %w", r.Err)
	}
	if r.IPv4.IsValid() {
		return r.IPv4, nil
	}
	return r.IPv6, nil
}

// createEndpoint creates the endpoint (reserved:health) and waits for its
// first regeneration.
func (m *Manager) createEndpoint(ctx context.Context, spec datapath.HealthSpec, link datapath.HealthLink) (endpoint.ID, error) {
	ls, err := labels.ParseSet([]string{"reserved:health"})
	if err != nil {
		return 0, err
	}
	ep := &endpoint.Endpoint{ContainerID: ContainerID, Namespace: Namespace, PodName: Pod, Labels: ls,
		IfName: link.HostIfName, IfIndex: link.HostIfIndex, HostMAC: link.HostMAC, Netns: spec.Netns}
	if spec.IP.Is4() {
		ep.IPv4 = spec.IP
	} else {
		ep.IPv6 = spec.IP
	}
	res, err := m.sys.Ask(ctx, m.sys.Endpoints, &messages.CreateEndpoint{Spec: ep, Sync: true})
	if err == nil {
		if r, ok := res.(*messages.EndpointResult); ok {
			if err = r.Err; err == nil {
				return r.Endpoint.ID, nil
			}
		}
	}
	return 0, fmt.Errorf("create health endpoint: %w", err)
}

// serve starts the HTTP responder on a socket inside the namespace.
func (m *Manager) serve(spec datapath.HealthSpec, id endpoint.ID) error {
	lis, err := m.dp.ListenHealth(spec, Port)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+Path, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		ErrorLog: slog.NewLogLogger(m.log.Handler(), slog.LevelWarn)}
	go func() { _ = srv.Serve(lis) }()
	m.mu.Lock()
	m.srv, m.ep = srv, id
	m.status.IP, m.status.Endpoint = spec.IP.String(), int64(id)
	m.mu.Unlock()
	m.log.Info("health endpoint ready", "endpoint", id, "ip", spec.IP, "netns", spec.Netns)
	return nil
}

// inPool runs fn in the datapath worker pool and waits for it.
func (m *Manager) inPool(ctx context.Context, op string, fn func(context.Context) error) error {
	work := &messages.DatapathWork{Op: op, Run: func(c context.Context) (any, error) { return nil, fn(c) }}
	res, err := m.sys.Ask(ctx, m.sys.Pool, work)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return res.(*messages.DatapathResult).Err
}
