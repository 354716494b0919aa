// Package agent assembles membrane-agent: the index, the datapath, the
// actor system and the REST API on the unix socket. cmd/membrane-agent
// turns flags into a Config; tests, benchmarks and the simulator start
// agents in-process with the same code.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/datapath/sysctl"
	"github.com/membrane-cni/membrane/pkg/agent/api"
	"github.com/membrane-cni/membrane/pkg/agent/cnidrain"
	"github.com/membrane-cni/membrane/pkg/agent/dnsproxy"
	"github.com/membrane-cni/membrane/pkg/agent/flows"
	"github.com/membrane-cni/membrane/pkg/agent/health"
	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/agent/nodesfile"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/restore"
)

// ErrInvalidConfig is wrapped by Config validation errors, which name the
// bad field by its flag.
var ErrInvalidConfig = errors.New("invalid agent config")

// Config is the agent's configuration.
type Config struct {
	// Socket is the API's unix socket path (--socket).
	Socket string
	// SocketMode is the socket file's mode (0660).
	SocketMode os.FileMode
	// StateDir holds per-endpoint state (--state-dir).
	StateDir string
	// ProcFS is where the host's /proc is reachable (--procfs; "" is
	// /proc). A containerised agent gets the host's /proc/sys/net at
	// <ProcFS>/sys/net, writable where the container's /proc/sys is not.
	// Process-wide: Start applies it to every sysctl the agent writes.
	ProcFS string
	// IPv4Range and IPv6Range are the pod CIDRs (--ipv4-range, --ipv6-range).
	IPv4Range, IPv6Range netip.Prefix
	// IPAMStrategy is sequential or random.
	IPAMStrategy ipam.Strategy
	// IPAM is where the ranges come from (--ipam): IPAMStatic (""
	// too) takes IPv4Range and IPv6Range; IPAMKubernetes takes this
	// node's spec.podCIDRs from its Node object (Kubernetes mode only),
	// waiting for them at start up to K8s.PodCIDRWait.
	IPAM string
	// Datapath is "fake" or "linux" (--datapath).
	Datapath string
	// Fake is used (and may be pre-configured by tests) when Datapath is "fake".
	Fake *datapath.Fake
	// Linux configures the datapath when Datapath is "linux"; its gateways
	// are filled from the IPAM ranges.
	Linux datapath.LinuxConfig
	// DeleteQueueDir is where membrane-cni queues DELs while the agent is
	// unreachable (--delete-queue-dir); drained at start and every
	// HostPortSyncInterval is how often the pods' hostPort services are
	// made those of the endpoints again (default 30 s), so that those of
	// endpoints deleted without the API (the delete queue's drain, the
	// garbage collector) go; attach and API deletes resync at once.
	HostPortSyncInterval time.Duration
	// DeleteQueueInterval (default 30 s). "" disables draining.
	DeleteQueueDir      string
	DeleteQueueInterval time.Duration
	// GCInterval is the time between garbage collector passes (--gc-interval,
	// default 1 min; negative disables): orphan host veths and pin
	// directories go, endpoints whose host interface vanished are deleted.
	GCInterval time.Duration
	// GCPercent is the Go garbage collector's target (--gc-percent,
	// default DefaultGCPercent): Start applies it process-wide unless it
	// is 0 or the GOGC environment variable is set (GOGC wins).
	GCPercent int
	// MemoryLimit is the soft limit of the Go runtime's memory in bytes
	// (--memory-limit-mib, default DefaultMemoryLimitMiB; procmem.SetSoftLimit):
	// the collector runs earlier than GCPercent asks when the heap would
	// pass it, never more often than at procmem.MinGCPercent. Start applies
	// it process-wide unless it is 0 or the GOMEMLIMIT environment variable
	// is set (GOMEMLIMIT wins).
	MemoryLimit int64
	// ReleaseStartupPages is how long after start the agent asks the
	// kernel to reclaim its executable's resident pages, which start-up
	// read and steady state mostly does not (--release-startup-pages,
	// default 10 s; 0 never; pkg/agent/procmem). Process-wide, like
	// GCPercent: the simulator's many agents in one process leave it 0.
	ReleaseStartupPages time.Duration
	// EnableHealth runs the health endpoint (--enable-health; Linux
	// datapath only, else reported disabled), probed every HealthInterval
	// (default 10 s).
	EnableHealth   bool
	HealthInterval time.Duration
	// HealthNodeInterval is the time between probe rounds of every
	// remote node with the health endpoint on (--health-node-interval,
	// default 5 s; negative: none, and no node responder on port 4240).
	HealthNodeInterval time.Duration
	// Actors tunes the actor system; IPAM ranges are filled from above.
	Actors actors.Config
	// API tunes the REST server (API.Pprof: --pprof).
	API api.Config
	// K8s turns the Kubernetes mode on (nil: standalone): pods, namespaces
	// and NetworkPolicies come from the API server.
	K8s *k8s.Config
	// Kvstore turns the kvstore mode on (--kvstore etcd; nil: off): this
	// node and its endpoints are published in etcd, the other nodes'
	// are mirrored into the agent.
	Kvstore *kvstore.Config
	// KvstoreObserver (the simulator's convergence clock; nil: none) is
	// told of every set of remote endpoints the kvstore mirror handed to
	// the ipcache, once the front door returned: the index holds them.
	KvstoreObserver func(eps []endpoint.Remote)
	// NodeAddrs are this node's underlay addresses
	// (--kvstore-node-addrs), published for other nodes to route to; in
	// kvstore mode on the Linux datapath, empty means derived at start
	// (deriveNodeAddrs).
	NodeAddrs []netip.Addr
	// HTTPAddr is the read-only TCP listener (--http-addr): reads,
	// /metrics and, with API.Pprof, /debug/pprof. "" disables it.
	HTTPAddr string
	// NodesFile lists the remote nodes in standalone mode (--nodes-file;
	// "" none): polled every NodesFileInterval (default 1 s).
	NodesFile         string
	NodesFileInterval time.Duration
	// DNSProxy runs the DNS proxy (--dns-proxy; nil: off, and toFQDNs
	// and rules.dns are refused at import); Linux datapath only.
	DNSProxy *dnsproxy.Config
	// FQDN bounds the names learned from DNS answers (--tofqdns-min-ttl,
	// --tofqdns-endpoint-max-ips).
	FQDN fqdn.CacheConfig
	// Flows sizes the flow log (--flows-buffer, --flows-rate); with the
	// Linux datapath, Linux.Flows (--flows) says whether the programs
	// report connections (drops are recorded either way). Node, Index,
	// Metrics, DatapathStats and Enabled are the agent's to fill.
	Flows flows.Config
	// NodeName names the node in flows ("" : the hostname).
	NodeName string
}

// Validate names the bad field by its flag.
func (c *Config) Validate() error {
	switch {
	case c.Socket == "":
		return fmt.Errorf("--socket: empty path: %w", ErrInvalidConfig)
	case c.StateDir == "":
		return fmt.Errorf("--state-dir: empty path: %w", ErrInvalidConfig)
	case c.ProcFS != "" && !filepath.IsAbs(c.ProcFS):
		return fmt.Errorf("--procfs: %q is not an absolute path: %w", c.ProcFS, ErrInvalidConfig)
	case c.GCPercent != 0 && (c.GCPercent < 25 || c.GCPercent > 1000):
		return fmt.Errorf("--gc-percent %d: want 25..1000: %w", c.GCPercent, ErrInvalidConfig)
	case c.MemoryLimit < 0:
		return fmt.Errorf("--memory-limit-mib %d: want 0 or more: %w", c.MemoryLimit>>20, ErrInvalidConfig)
	case c.IPAM != "" && c.IPAM != IPAMStatic && c.IPAM != IPAMKubernetes:
		return fmt.Errorf("--ipam: %q: want %s or %s: %w", c.IPAM, IPAMStatic, IPAMKubernetes, ErrInvalidConfig)
	case c.IPAM == IPAMKubernetes && c.K8s == nil:
		return fmt.Errorf("--ipam: %s needs the Kubernetes mode (--k8s-kubeconfig or --k8s): %w", IPAMKubernetes, ErrInvalidConfig)
	case c.IPAM == IPAMKubernetes && !c.IPv4Range.IsValid() && !c.IPv6Range.IsValid():
		// The ranges come from the Node object at start.
	case !c.IPv4Range.IsValid() && !c.IPv6Range.IsValid():
		return fmt.Errorf("--ipv4-range, --ipv6-range: at least one range is required (--ipv4-range \"\" turns IPv4 off only with an --ipv6-range): %w", ErrInvalidConfig)
	case c.IPv4Range.IsValid() && !c.IPv4Range.Addr().Is4():
		return fmt.Errorf("--ipv4-range: %s is not an IPv4 prefix: %w", c.IPv4Range, ErrInvalidConfig)
	case c.IPv6Range.IsValid() && (!c.IPv6Range.Addr().Is6() || c.IPv6Range.Addr().Is4In6()):
		return fmt.Errorf("--ipv6-range: %s is not an IPv6 prefix: %w", c.IPv6Range, ErrInvalidConfig)
	}
	if c.IPv4Range.IsValid() {
		if _, err := ipam.NewRange(c.IPv4Range, c.IPAMStrategy, nil); err != nil {
			return fmt.Errorf("--ipv4-range: %w", err)
		}
	}
	if c.IPv6Range.IsValid() {
		if _, err := ipam.NewRange(c.IPv6Range, c.IPAMStrategy, nil); err != nil {
			return fmt.Errorf("--ipv6-range: %w", err)
		}
	}
	if c.HTTPAddr != "" {
		if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
			return fmt.Errorf("--http-addr: %q: want host:port: %w", c.HTTPAddr, ErrInvalidConfig)
		}
	}
	if c.K8s != nil {
		if err := c.K8s.Validate(); err != nil {
			return err
		}
	}
	if c.Kvstore != nil {
		if err := c.Kvstore.Validate(); err != nil {
			return err
		}
	}
	for _, a := range c.NodeAddrs {
		if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() {
			return fmt.Errorf("--kvstore-node-addrs: %s: not a node address: %w", a, ErrInvalidConfig)
		}
	}
	if err := c.validateListeners(); err != nil {
		return err
	}
	switch c.Datapath {
	case "fake", "linux":
	default:
		return fmt.Errorf("--datapath: %q: want fake or linux: %w", c.Datapath, ErrInvalidConfig)
	}
	return c.validateDNS()
}

// Agent is a running agent.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	Index   *index.Index
	System  *actors.System
	Server  *api.Server
	lis     net.Listener
	served  chan error
	stopCNI context.CancelFunc // stops the delete queue drainer
	// stopAddrs stops following the host's addresses (nil: not followed).
	stopAddrs   context.CancelFunc
	stopNodes   func() // ends the nodes file watcher
	stopRelease func() // cancels the pending start-up page release
	store       *stateStore
	// stopOnce makes Stop idempotent (a second call returns the first's error).
	stopOnce sync.Once
	stopErr  error
	// restoreStats is what the restore at Start did.
	restoreStats RestoreStats
	// The read-only TCP listener (nil when Config.HTTPAddr is empty).
	httpLis    net.Listener
	httpSrv    *http.Server
	httpServed chan error
	poolSizes  map[ipam.Family]int
	health     *health.Manager // nil: disabled
	k8s        *k8s.Watcher    // nil: standalone
	kvstore    *kvstoreMode    // nil: no kvstore
	events     *events.Hub
	// flowLog is the flow log (Linux datapath; nil otherwise), stopFlows
	// ends its L7/DNS correlation.
	flowLog   *flows.Store
	stopFlows context.CancelFunc
	k8sSvc    *k8s.ServiceWatcher
	stopDNS   func() // stops the DNS proxy (nil: not running)
	// stopHostPorts stops the hostPort resync (nil: not running).
	stopHostPorts func()
	// stopPrune stops the wait for the ipcache prune (nil: not running).
	stopPrune func()
	// idBackend is the cluster identity backend the agent started (nil:
	// none, or one the caller passed in Actors.IdentityBackend).
	idBackend identity.ClusterBackend
	// started are the components Start started, in start order.
	started []component
}

// startIdentityBackend starts the MembraneIdentity backend in Kubernetes
// mode unless the identity allocation mode is local or the caller gave
// a backend (kvstore mode); nil when it started none.
func startIdentityBackend(cfg *Config, ac *actors.Config, log *slog.Logger) (identity.ClusterBackend, error) {
	if cfg.K8s == nil || !cfg.K8s.CRDIdentities() || ac.IdentityBackend != nil {
		return nil, nil
	}
	b, err := k8s.NewIdentityBackend(cfg.K8s, log)
	if err != nil {
		return nil, err
	}
	ac.IdentityBackend = b
	return b, nil
}

// Start validates cfg and starts the agent's components (components.go)
// in order: the datapath, the actor system, the API, restore, the feeds.
// The agent answers mutating calls once Start returns. On failure
// everything it started is stopped again (datapath closed, state store
// closed), leaving endpoints and kernel state in place.
func Start(cfg Config, log *slog.Logger) (*Agent, error) {
	if cfg.SocketMode == 0 {
		cfg.SocketMode = 0o660
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	applyGCPercent(cfg.GCPercent)
	applyMemoryLimit(cfg.MemoryLimit)
	if cfg.ProcFS != "" {
		sysctl.SetProcFS(cfg.ProcFS)
	}
	if cfg.IPAM == IPAMKubernetes {
		if err := podCIDRRanges(&cfg, log); err != nil {
			return nil, fmt.Errorf("start agent: %w", err)
		}
	}
	for _, dir := range []string{filepath.Dir(cfg.Socket), cfg.StateDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("start agent: %w", err)
		}
	}
	ix, err := index.New()
	if err != nil {
		return nil, err
	}
	if cfg.DNSProxy != nil {
		cfg.Linux.DNSProxyPort = cfg.DNSProxy.Port
	}
	a := &Agent{cfg: cfg, log: log, Index: ix}
	s := &starter{a: a, ac: cfg.Actors}
	if err := a.run(s.components()); err != nil {
		return nil, err
	}
	return a, nil
}

// Stop stops accepting requests, waits for in-flight ones (bounded by
// ctx), and stops the actors without releasing anything: endpoints, IPs
// and identities stay for the next start to restore.
func (a *Agent) Stop(ctx context.Context) error {
	a.stopOnce.Do(func() { a.stopErr = a.stop(ctx) })
	return a.stopErr
}

// stop stops the components (stopComponents: the feeds, the API, then
// the actors, identity backend, state store and datapath).
func (a *Agent) stop(ctx context.Context) error {
	err := a.stopComponents(ctx)
	_ = os.Remove(a.cfg.Socket)
	a.log.Info("agent stopped")
	return err
}

// watchHostAddrs follows the host netns's addresses (Linux datapath): an
// address added later is the host identity in the ipcache, not world, and
// a removed one stops being the host's. The watcher's callback only sends
// a message, so it never blocks an actor or the watcher.
func (a *Agent) watchHostAddrs(linux *datapath.Linux) {
	if linux == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	sys, srv := a.System, a.Server
	if err := linux.WatchHostAddrs(ctx, func(c datapath.HostAddrChange) {
		sys.HostAddrChanged(c.Addr, c.Deleted)
		srv.NodeAddrChanged(c.Addr, c.Deleted) // hostPorts follow the node's addresses
	}); err != nil {
		cancel()
		a.log.Error("not following host addresses; addresses added from now on are world until restart", "err", err)
		return
	}
	a.stopAddrs = cancel
}

// watchNodesFile starts polling the nodes file (standalone mode).
func (a *Agent) watchNodesFile() {
	if a.cfg.NodesFile == "" {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	var local []netip.Prefix
	for _, p := range []netip.Prefix{a.cfg.IPv4Range, a.cfg.IPv6Range} {
		if p.IsValid() {
			local = append(local, p)
		}
	}
	w := &nodesfile.Watcher{Path: a.cfg.NodesFile, Interval: a.cfg.NodesFileInterval, Local: local, Sink: a.System,
		Log: a.log.With("component", "nodes-file")}
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	a.stopNodes = func() { cancel(); <-done }
}

// PolicyFile is the name of the policy file in the state directory.
const PolicyFile = "policy.json"

// loadPolicies reads the policies persisted in the state directory with
// opts. An unreadable file is set aside (policy.json.corrupt) and the
// agent starts without policies, loudly.
func loadPolicies(stateDir string, opts policy.ParseOptions, log *slog.Logger) actors.PolicyConfig {
	path := filepath.Join(stateDir, PolicyFile)
	rev, pols, err := policy.ReadFileWith(path, opts)
	if err != nil {
		log.Error("policy file unreadable; set aside, starting without policies", "file", path, "err", err)
		if rerr := os.Rename(path, path+".corrupt"); rerr != nil {
			log.Error("setting the policy file aside failed", "file", path, "err", rerr)
		}
		rev, pols = 0, nil
	}
	for _, p := range pols {
		if p.Partial() {
			log.Warn("persisted policy partially refused: the refused parts allow nothing", "policy", p.Key(), "refused", p.RefusedSummary())
		}
	}
	return actors.PolicyConfig{File: path, Initial: pols, InitialRevision: rev, FQDNDir: stateDir,
		FQDNInitial: loadFQDN(stateDir, log)}
}

// loadFQDN reads the names learned from DNS answers persisted in the
// state directory, leaving out the expired ones. An unreadable file is
// set aside (fqdn.json.corrupt): the pods resolve again.
func loadFQDN(stateDir string, log *slog.Logger) []fqdn.Entry {
	data, err := restore.ReadFQDN(stateDir)
	if err == nil && data == nil {
		return nil
	}
	var es []fqdn.Entry
	if err == nil {
		es, err = fqdn.ParseFile(data, time.Now())
	}
	if err != nil {
		path := filepath.Join(stateDir, restore.FQDNFile)
		log.Error("learned names unreadable; set aside", "file", path, "err", err)
		if rerr := os.Rename(path, path+".corrupt"); rerr != nil {
			log.Error("setting the learned names aside failed", "file", path, "err", rerr)
		}
		return nil
	}
	return es
}

// startHealth sets the health endpoint up in the background: replacing
// the previous one waits for its restore regeneration, behind every
// restored endpoint's, which must not delay the API's readiness (the
// pods' ADDs). Its address stays reserved meanwhile (the previous
// endpoint is deleted with NoIPRelease).
func (a *Agent) startHealth(linux *datapath.Linux) {
	if !a.cfg.EnableHealth || linux == nil {
		a.Server.SetHealth(health.Disabled)
		return
	}
	a.health = health.Start(health.Config{Dir: filepath.Join(a.cfg.StateDir, "health"), Interval: a.cfg.HealthInterval,
		NodeInterval: a.cfg.HealthNodeInterval, NodeMetrics: a.Server.Metrics()}, a.System, linux, a.log)
	a.Server.SetHealth(a.health.Status)
	a.Server.SetNodeHealth(a.health.Nodes)
}

// newDatapath builds the configured datapath; linux is non-nil for "linux".
func newDatapath(cfg *Config, log *slog.Logger) (dp datapath.Datapath, linux *datapath.Linux, err error) {
	if cfg.Datapath != "linux" {
		if cfg.Fake == nil {
			return datapath.NewFake(uint64(time.Now().UnixNano())), nil, nil
		}
		return cfg.Fake, nil, nil
	}
	lc := cfg.Linux
	gws, err := ipam.Gateways(cfg.IPv4Range, cfg.IPv6Range)
	if err != nil {
		return nil, nil, err
	}
	lc.Gateways = append(lc.Gateways, gws...)
	if lc.HostFirewall.Enabled {
		peers, err := hostFirewallPeers(cfg)
		if err != nil {
			return nil, nil, err
		}
		lc.HostFirewall.SafePeers = append(lc.HostFirewall.SafePeers, peers...)
	}
	// Masquerading leaves traffic between the node's pods and the
	// cluster's alone; the node's own ranges are the IPAM's.
	for _, p := range []netip.Prefix{cfg.IPv4Range, cfg.IPv6Range} {
		if p.IsValid() {
			lc.Nodes.LocalPodCIDRs = append(lc.Nodes.LocalPodCIDRs, p)
		}
	}
	linux, err = datapath.NewLinux(lc, log)
	if err != nil {
		return nil, nil, err
	}
	return linux, linux, nil
}

// startDeleteQueue drains the CNI delete queue once (before the API turns
// ready, so queued DELs happen before new ADDs) and then periodically.
func (a *Agent) startDeleteQueue() context.CancelFunc {
	ctx, cancel := context.WithCancel(context.Background())
	dir := a.cfg.DeleteQueueDir
	if dir == "" {
		return cancel
	}
	if n, err := cnidrain.Drain(ctx, a.System, dir, a.Server.LockAttachment, a.log); err != nil {
		a.log.Warn("draining the delete queue", "err", err, "done", n)
	} else if n > 0 {
		a.log.Info("delete queue drained", "done", n)
	}
	interval := a.cfg.DeleteQueueInterval
	if interval <= 0 {
		interval = 30 * time.Second
	}
	go cnidrain.DrainLoop(ctx, a.System, dir, interval, a.Server.LockAttachment, a.log)
	return cancel
}

// startHostPortSync resyncs the pods' hostPort services every
// HostPortSyncInterval and whenever a node address comes or goes (with
// the kube-proxy replacement only); its stop waits for a sync in
// progress.
func (a *Agent) startHostPortSync() {
	if !a.Server.HostPorts() {
		return
	}
	interval := a.cfg.HostPortSyncInterval
	if interval <= 0 {
		interval = 30 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-a.Server.HostPortKick(): // a node address came or went
			}
			sctx, scancel := context.WithTimeout(ctx, max(interval, 10*time.Second))
			if err := a.Server.SyncHostPorts(sctx); err != nil && ctx.Err() == nil {
				a.log.Warn("hostPort services resync", "err", err)
			}
			scancel()
		}
	}()
	a.stopHostPorts = func() { cancel(); <-done }
}

// noL7 reports whether the agent refuses L7 rules at import (PUT
// /v1/policy and the Kubernetes policy watchers alike): L7 rules need a
// proxy, which the Linux datapath runs only with --l7-proxy (the fake
// datapath simulates it); refuse is the configured refusal.
func noL7(cfg Config, refuse bool) bool {
	return refuse || (cfg.Datapath == "linux" && cfg.Linux.L7.ProxyPath == "")
}
