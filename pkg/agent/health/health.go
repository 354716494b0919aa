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
	// NodeInterval is the time between probe rounds of the remote nodes
	// (default 5 s; negative: no node probes and no node responder).
	NodeInterval time.Duration
	// NodeMetrics receives the node probes' results (may be nil).
	NodeMetrics NodeMetrics
}

// Manager runs the health endpoint and its prober.
type Manager struct {
	cfg  Config
	sys  *actors.System
	dp   datapath.HealthDatapath
	log  *slog.Logger
	spec datapath.HealthSpec
	http *http.Client

	stop  context.CancelFunc
	done  chan struct{}
	nodes *nodeProber
	ndone <-chan struct{}

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
	if cfg.NodeInterval == 0 {
		cfg.NodeInterval = 5 * time.Second
	}
	m.cfg = cfg
	ctx, cancel := context.WithCancel(context.Background())
	m.stop = cancel
	go m.loop(ctx)
	if cfg.NodeInterval > 0 {
		m.nodes, m.ndone = startNodeProber(ctx, cfg, sys.Index, dp, sys.Events(), m.log)
	}
	return m
}

// Nodes returns the remote nodes' reachability (the last probe round of
// each; empty without node probes).
func (m *Manager) Nodes() []models.NodeHealth {
	if m.nodes == nil {
		return []models.NodeHealth{}
	}
	return m.nodes.Matrix()
}

// Stop stops the prober and the responder. The namespace, the veth and
// the endpoint stay (the next agent replaces them, keeping the address).
func (m *Manager) Stop() {
	m.stop()
	<-m.done
	if m.ndone != nil {
		<-m.ndone // the node responder closes with it
	}
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

// probe asks the responder over HTTP from the host netns, on each of
// its addresses: one family failing fails the endpoint.
func (m *Manager) probe(ctx context.Context) {
	m.mu.Lock()
	ips := []string{m.status.IP, m.status.IPv6}
	m.mu.Unlock()
	for _, ip := range ips {
		if ip == "" {
			continue
		}
		if err := m.probeOne(ctx, "http://"+net.JoinHostPort(ip, strconv.Itoa(Port))+Path); err != nil {
			if ctx.Err() != nil {
				return // stopping
			}
			m.log.Warn("health endpoint does not answer", "ip", ip, "err", err)
			m.setStatus(StateFailing, err)
			return
		}
	}
	m.setStatus(StateOK, nil)
}

func (m *Manager) probeOne(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := m.http.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("probe %s: status %d", url, resp.StatusCode)
	}
	return nil
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
// with a new one on the recorded addresses and starts the responder.
func (m *Manager) setup(ctx context.Context) (retErr error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	prev := m.replacePrevious(ctx)
	addrs, err := m.addresses(ctx, prev)
	if err != nil {
		return err
	}
	spec := m.spec
	spec.Addrs = addrs
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
	var rec record
	for _, a := range addrs {
		if a.IP.Is4() {
			rec.IP = a.IP.String()
		} else {
			rec.IPv6 = a.IP.String()
		}
	}
	if err := writeRecord(m.cfg.Dir, rec); err != nil {
		m.log.Warn("recording the health endpoint's addresses failed; a restart may change them", "err", err)
	}
	return m.serve(spec, id)
}

// replacePrevious deletes the health endpoint a previous agent left (its
// addresses stay allocated, for the new one) and returns its addresses
// or the recorded ones, by family.
func (m *Manager) replacePrevious(ctx context.Context) map[ipam.Family]netip.Addr {
	prev := map[ipam.Family]netip.Addr{}
	if rec, err := readRecord(m.cfg.Dir); err == nil {
		for _, ip := range rec.addrs() {
			prev[familyOf(ip)] = ip
		}
	} else if !errors.Is(err, errNoRecord) {
		m.log.Warn("unreadable health record ignored", "err", err)
	}
	old, ok := m.sys.Index.EndpointByContainerID(ContainerID)
	if !ok {
		return prev
	}
	for _, ip := range []netip.Addr{old.IPv4, old.IPv6} {
		if ip.IsValid() {
			prev[familyOf(ip)] = ip
		}
	}
	_, err := m.sys.DeleteEndpoint(ctx, old.ID, endpoint.DeleteOptions{NoIPRelease: true})
	if err != nil && !errors.Is(err, actors.ErrEndpointNotFound) {
		m.log.Warn("deleting the previous health endpoint failed", "endpoint", old.ID, "err", err)
	} else {
		m.log.Info("previous health endpoint replaced", "endpoint", old.ID, "ipv4", old.IPv4, "ipv6", old.IPv6)
	}
	return prev
}

func familyOf(ip netip.Addr) ipam.Family {
	if ip.Is4() {
		return ipam.IPv4
	}
	return ipam.IPv6
}

// owner is the health endpoint's IPAM owner.
const owner = Namespace + "/" + Pod

// addresses returns the health endpoint's address of every configured
// family (prev's if it is still ours or free) with its gateway.
func (m *Manager) addresses(ctx context.Context, prev map[ipam.Family]netip.Addr) ([]datapath.HealthAddr, error) {
	var out []datapath.HealthAddr
	for _, fam := range []ipam.Family{ipam.IPv4, ipam.IPv6} {
		pfx := m.sys.Config.IPAM.IPv4
		if fam == ipam.IPv6 {
			pfx = m.sys.Config.IPAM.IPv6
		}
		if !pfx.IsValid() {
			continue
		}
		ip, err := m.address(ctx, fam, pfx, prev[fam])
		if err != nil {
			return nil, err
		}
		gw, err := ipam.Gateways(pfx)
		if err != nil {
			return nil, fmt.Errorf("health endpoint gateway: %w", err)
		}
		out = append(out, datapath.HealthAddr{IP: ip, Gateway: gw[0]})
	}
	return out, nil
}

// address returns the health endpoint's address of family fam: prev if
// it is still ours or free, else a new one.
func (m *Manager) address(ctx context.Context, fam ipam.Family, pfx netip.Prefix, prev netip.Addr) (netip.Addr, error) {
	if !prev.IsValid() || !pfx.Contains(prev) {
		prev = netip.Addr{}
		// A setup that failed after the allocation left it unclaimed.
		for _, row := range m.sys.Index.IPsByOwner(owner) {
			if row.Endpoint == 0 && pfx.Contains(row.IP) {
				prev = row.IP
				break
			}
		}
	}
	if prev.IsValid() {
		row, held := m.sys.Index.IP(prev)
		switch {
		case held && row.Endpoint == 0 && row.Owner == owner:
			return prev, nil
		case !held:
			if ip, err := m.allocated(m.sys.AllocateSpecificIP(ctx, prev, owner)); err == nil {
				return ip, nil
			}
		}
	}
	return m.allocated(m.sys.AllocateIP(ctx, fam, owner))
}

func (m *Manager) allocated(r actors.Allocation, err error) (netip.Addr, error) {
	if err != nil {
		return netip.Addr{}, fmt.Errorf("allocate health address: %w", err)
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
		IfName: link.HostIfName, IfIndex: link.HostIfIndex, HostMAC: link.HostMAC, MAC: link.PodMAC, Netns: spec.Netns}
	for _, a := range spec.Addrs {
		if a.IP.Is4() {
			ep.IPv4 = a.IP
		} else {
			ep.IPv6 = a.IP
		}
	}
	got, err := m.sys.CreateEndpoint(ctx, ep, true)
	if err == nil {
		return got.ID, nil
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
	m.status.IP, m.status.IPv6, m.status.Endpoint = "", "", int64(id)
	for _, a := range spec.Addrs {
		switch {
		case a.IP.Is6() && m.status.IP != "":
			m.status.IPv6 = a.IP.String()
		default: // IPv4, or IPv6 on a node without IPv4
			m.status.IP = a.IP.String()
		}
	}
	m.mu.Unlock()
	m.log.Info("health endpoint ready", "endpoint", id, "addresses", spec.Addrs, "netns", spec.Netns)
	return nil
}

// inPool runs fn in the datapath worker pool and waits for it.
func (m *Manager) inPool(ctx context.Context, op string, fn func(context.Context) error) error {
	_, err := m.sys.RunBlocking(ctx, op, 0, func(c context.Context) (any, error) { return nil, fn(c) })
	return err
}
