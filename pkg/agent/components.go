package agent

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent/api"
	"github.com/membrane-cni/membrane/pkg/agent/cnidrain"
	"github.com/membrane-cni/membrane/pkg/agent/flows"
	"github.com/membrane-cni/membrane/pkg/agent/health"
	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/agent/metrics"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// component is one part of the agent. Start starts the components in
// order; when one fails, the started ones stop again (stopComponents).
type component struct {
	name string
	// start starts it; on an error it leaves nothing of itself running.
	start func() error
	// stop stops it, bounded by ctx; nil when it owns nothing to stop.
	stop func(ctx context.Context) error
}

// starter holds what the components hand on to each other while the agent
// starts: the actor system's Config and the datapath.
type starter struct {
	a     *Agent
	ac    actors.Config
	dp    datapath.Datapath
	linux *datapath.Linux // nil unless the datapath is "linux"
}

// components is the agent, in start order.
func (s *starter) components() []component {
	a := s.a
	return []component{
		// The datapath (Linux or fake), initialised before anything uses
		// it, and the host's own addresses (the host identity, as the
		// gateways are: kubelet probes come from them).
		{"datapath", s.startDatapath, func(context.Context) error { _ = s.dp.Close(); return nil }},
		// The per-endpoint state directory, journal and checkpoints.
		{"state-store", s.openStore, func(context.Context) error { a.store.Close(); return nil }},
		// The actor system's Config: IPAM ranges, state store, the rules
		// import refuses, the persisted policies, events and metrics.
		{"actors-config", s.configureActors, nil},
		// The etcd connection (kvstore mode) and, unless the caller gave
		// one, the identity backend on it; the actors take that backend.
		// Once the API serves, it stops in stopFirst's phase.
		{"kvstore", s.connectKvstore, stopWith(&a.kvstore, (*kvstoreMode).close)},
		// The MembraneIdentity backend (Kubernetes mode, CRD identities).
		{"identity-backend", s.startIdentityBackend, func(context.Context) error {
			if a.idBackend != nil {
				_ = a.idBackend.Close()
			}
			return nil
		}},
		// The actors: endpoints, IPAM, identities, policy, ipcache, GC.
		{"actors", s.startActors, func(context.Context) error {
			if a.stopFlows != nil {
				a.stopFlows()
			}
			a.System.Stop()
			return nil
		}},
		// The REST API on the unix socket. Reads are served from now on,
		// mutating calls get 503 until ready. Its stop also stops the
		// read-only HTTP listener, after the API server (whose Shutdown
		// ends the event streams).
		{"api", s.serveAPI, a.stopAPI},
		// The read-only TCP listener (--http-addr); stopped by "api".
		{"http", a.startHTTP, nil},
		// Every endpoint in the state directory back, with its IPs and
		// identity, before the delete queue is drained.
		{"restore", a.restoreAtStart, nil},
		// The CNI delete queue: drained once now, then periodically.
		{"delete-queue", func() error { a.stopCNI = a.startDeleteQueue(); return nil }, stopFunc(&a.stopCNI)},
		// The host netns's addresses followed into the ipcache (Linux).
		{"host-addresses", func() error { a.watchHostAddrs(s.linux); return nil }, stopFunc(&a.stopAddrs)},
		// The collector, once the index holds every restored endpoint.
		// Standalone, the kernel ipcache is pruned now, once every
		// restored endpoint claimed its addresses (entries of endpoints
		// deleted while no agent ran go); with other nodes' endpoints
		// from Kubernetes or the kvstore, by "ipcache-prune". Both
		// belong to the actors.
		{"gc", func() error {
			a.System.StartGC()
			if a.cfg.K8s == nil && a.cfg.Kvstore == nil {
				a.System.PruneIPCache()
			}
			return nil
		}, nil},
		// The health endpoint (--enable-health), set up in the background.
		{"health", func() error { a.startHealth(s.linux); return nil }, stopWith(&a.health, (*health.Manager).Stop)},
		// The nodes file watcher (--nodes-file, standalone mode).
		{"nodes-file", func() error { a.watchNodesFile(); return nil }, stopFunc(&a.stopNodes)},
		// The DNS proxy (--dns-proxy, Linux datapath).
		{"dns-proxy", func() error { return a.startDNSProxy(s.linux) }, stopFunc(&a.stopDNS)},
		// The Kubernetes watchers: pods, namespaces, policies, nodes.
		// CNI ADDs are served once their caches synced (or the bounded
		// wait ended), so a pod's endpoint starts with the pod's labels.
		{"kubernetes", a.startK8s, stopWith(&a.k8s, (*k8s.Watcher).Stop)},
		// The Services and EndpointSlices feeding the service table; in
		// standalone mode, what an earlier agent left there is pruned.
		{"services", func() error { return a.startServices(s.linux) }, stopWith(&a.k8sSvc, (*k8s.ServiceWatcher).Stop)},
		// The pods' hostPort services resynced periodically.
		{"hostport-sync", func() error { a.startHostPortSync(); return nil }, stopFunc(&a.stopHostPorts)},
		// This node's endpoints published to etcd, the others' mirrored.
		{"kvstore-publish", a.startKvstorePublish, stopWith(&a.kvstore, (*kvstoreMode).stopPublishing)},
		// Kubernetes and kvstore modes: the kernel ipcache pruned once the
		// other nodes' endpoints first reached it from every source (the
		// watcher's first sync, the etcd mirror's first full sync; or the
		// bounded wait passed): a prune before would drop their entries
		// from the map an earlier agent left, and in native routing their
		// traffic would be taken for world until the source put them back
		// (an upgrade of the DaemonSet lost datagrams to policy).
		{"ipcache-prune", a.startIPCachePrune, stopFunc(&a.stopPrune)},
		// Mutating calls answered from now on.
		{"ready", a.setReady, nil},
		// Start-up's pages of the executable given back (--release-startup-pages).
		{"release-startup-pages", func() error { a.releaseStartupPages(); return nil }, stopFunc(&a.stopRelease)},
	}
}

// stopFirst is Stop's first phase once the API serves: what feeds the
// actors and the API from outside stops, in this order, before the API
// server shuts down. It is the order Agent.stop always had, not the
// reverse of start; the kvstore connection, started before the actors,
// stops here rather than after them. Before the API serves (a start
// failing early), every started component stops in reverse order.
var stopFirst = []string{"hostport-sync", "services", "ipcache-prune", "kubernetes", "kvstore-publish", "kvstore",
	"delete-queue", "host-addresses", "nodes-file", "health", "dns-proxy"}

// run starts cs in order. On a failure, once the API serves, it stops
// the agent as Stop does (the socket goes, "agent stopped" is logged);
// before, the started components stop in reverse order.
func (a *Agent) run(cs []component) error {
	for i, c := range cs {
		if err := c.start(); err != nil {
			a.started = cs[:i]
			if a.served != nil {
				_ = a.Stop(context.Background())
			} else {
				_ = a.stopComponents(context.Background())
			}
			return fmt.Errorf("start agent: %w", err)
		}
	}
	a.started = cs
	return nil
}

// stopComponents stops the started components, the ones in stopFirst
// first while the API serves, then the rest in reverse start order, and
// returns the first error.
func (a *Agent) stopComponents(ctx context.Context) error {
	var first error
	stopped := make(map[string]bool, len(a.started))
	stop := func(c component) {
		stopped[c.name] = true
		if c.stop == nil {
			return
		}
		if err := c.stop(ctx); err != nil && first == nil {
			first = err
		}
	}
	if a.served != nil {
		for _, name := range stopFirst {
			for _, c := range a.started {
				if c.name == name {
					stop(c)
				}
			}
		}
	}
	for i := len(a.started) - 1; i >= 0; i-- {
		if c := a.started[i]; !stopped[c.name] {
			stop(c)
		}
	}
	return first
}

// stopFunc stops by calling *f, if set when the stop runs.
func stopFunc[F ~func()](f *F) func(context.Context) error {
	return func(context.Context) error {
		if *f != nil {
			(*f)()
		}
		return nil
	}
}

// stopWith stops by calling f on *p, if set when the stop runs.
func stopWith[T any](p **T, f func(*T)) func(context.Context) error {
	return func(context.Context) error {
		if *p != nil {
			f(*p)
		}
		return nil
	}
}

func (s *starter) startDatapath() error {
	dp, linux, err := newDatapath(&s.a.cfg, s.a.log)
	if err != nil {
		return err
	}
	if err := dp.Init(context.Background()); err != nil {
		_ = dp.Close()
		return fmt.Errorf("datapath init: %w", err)
	}
	if linux != nil {
		if s.ac.HostAddrs, err = linux.HostAddrs(context.Background()); err != nil {
			_ = dp.Close()
			return err
		}
		if err := s.a.deriveNodeAddrs(linux); err != nil {
			_ = dp.Close()
			return err
		}
	}
	s.dp, s.linux = dp, linux
	return nil
}

func (s *starter) openStore() (err error) {
	s.a.store, err = openStateStore(s.a.cfg.StateDir, s.a.log)
	return err
}

func (s *starter) configureActors() error {
	cfg, ac := &s.a.cfg, &s.ac
	ac.IPAM.IPv4, ac.IPAM.IPv6, ac.IPAM.Strategy = cfg.IPv4Range, cfg.IPv6Range, cfg.IPAMStrategy
	ac.State = s.a.store
	ac.NoL7 = noL7(*cfg, ac.NoL7)
	// Likewise DNS rules and toFQDNs need the DNS proxy (the fake
	// datapath takes them: nothing is redirected, nothing learned).
	ac.NoDNSProxy = ac.NoDNSProxy || (cfg.Datapath == "linux" && cfg.DNSProxy == nil)
	// Policies from the API server may select namespaces by any label;
	// rules no proxy of this agent can enforce are refused parts (the
	// file is read with policy.ParseOptions.PartialRefusal).
	opts := policy.ParseOptions{NamespaceLabels: cfg.K8s != nil, NoL7: ac.NoL7, NoDNSProxy: ac.NoDNSProxy,
		NodeSelectorLabels: ac.NodeSelectorLabels, SecretsNamespace: ac.PolicySecretsNamespace}
	ac.Policy = loadPolicies(cfg.StateDir, opts, s.a.log)
	ac.Policy.FQDN = cfg.FQDN
	if cfg.API.Metrics == nil {
		cfg.API.Metrics = metrics.New()
	}
	ac.Events, ac.Observer = events.New(0), cfg.API.Metrics
	s.a.events = ac.Events
	ac.GC.Interval = cfg.GCInterval
	return nil
}

func (s *starter) connectKvstore() error {
	kv, err := connectKvstore(s.a.cfg.Kvstore, s.a.log)
	if err != nil || kv == nil {
		return err
	}
	if s.ac.IdentityBackend == nil { // kvstore mode: identities through etcd
		kv.identities = kvstore.NewIdentityBackend(kv.client)
		s.ac.IdentityBackend = kv.identities
	}
	s.a.kvstore = kv
	return nil
}

func (s *starter) startIdentityBackend() (err error) {
	s.a.idBackend, err = startIdentityBackend(&s.a.cfg, &s.ac, s.a.log)
	return err
}

func (s *starter) startActors() error {
	a := s.a
	sys, err := actors.Start(s.ac, a.Index, s.dp, a.log)
	if err != nil {
		return err
	}
	a.System = sys
	if s.linux != nil {
		m := a.cfg.API.Metrics
		fl, err := s.newFlowLog()
		if err != nil {
			sys.Stop()
			return err
		}
		drop := onDrop(a.events, m)
		s.linux.SetHooks(datapath.LinuxHooks{Submit: cnidrain.Submit(sys),
			OnDrop: func(ev datapath.DropEvent) { drop(ev); fl.OnDrop(ev) }, OnFlow: fl.OnFlow,
			Phase: m.DatapathPhase, OnL7Access: onL7Access(a.events, m), OnPinRepair: onPinRepair(a.events, m)})
	}
	return nil
}

// newFlowLog creates the flow log fed by the Linux datapath's flow
// reports and drop notifications, and starts its L7/DNS correlation.
func (s *starter) newFlowLog() (*flows.Store, error) {
	a := s.a
	cfg := a.cfg.Flows
	cfg.Enabled, cfg.Index, cfg.Metrics, cfg.DatapathStats = a.cfg.Linux.Flows, a.Index, a.cfg.API.Metrics, s.linux.FlowStats
	cfg.FQDNMinTTL = a.cfg.FQDN.MinTTL
	if cfg.Node = a.cfg.NodeName; cfg.Node == "" {
		cfg.Node, _ = os.Hostname()
	}
	fl, err := flows.New(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	go fl.Run(ctx, a.events)
	a.flowLog, a.stopFlows = fl, cancel
	return fl, nil
}

// serveAPI serves the REST API on the unix socket.
func (s *starter) serveAPI() error {
	a := s.a
	apiCfg := a.cfg.API
	apiCfg.HostNetns = a.cfg.Linux.HostNetns // where pods' veths get their host end
	if nodes := a.cfg.Linux.Nodes.WithDefaults(); a.cfg.Datapath == "linux" && nodes.Routing == datapath.RoutingTunnel {
		apiCfg.TunnelMTU = nodes.TunnelMTU // pods' routes leave room for the encapsulation
	}
	if a.cfg.Datapath == "linux" && a.cfg.Linux.Services.KubeProxyReplacement {
		// Pods' hostPorts become HostPort services on the node's addresses.
		apiCfg.HostPorts = true
		for _, ip := range s.ac.HostAddrs {
			if ip.IsGlobalUnicast() {
				apiCfg.NodeAddrs = append(apiCfg.NodeAddrs, ip)
			}
		}
	}
	srv, err := api.New(apiCfg, a.System, a.log)
	if err != nil {
		return err
	}
	if a.flowLog != nil {
		srv.SetFlows(a.flowLog)
	}
	lis, err := api.Listen(a.cfg.Socket, a.cfg.SocketMode)
	if err != nil {
		return err
	}
	a.Server, a.lis, a.served = srv, lis, make(chan error, 1)
	a.poolSizes = poolSizesOf(&a.cfg)
	a.cfg.API.Metrics.SetSampler(a.sample)
	a.watchStateDir()
	go func() { a.served <- srv.Serve(lis) }()
	return nil
}

// stopAPI stops accepting requests and waits for in-flight ones (bounded
// by ctx), then stops the read-only HTTP listener.
func (a *Agent) stopAPI(ctx context.Context) error {
	err := a.Server.Shutdown(ctx)
	if serr := <-a.served; serr != nil && err == nil {
		err = serr
	}
	if herr := a.stopHTTP(ctx); herr != nil && err == nil {
		err = herr
	}
	return err
}

// restoreAtStart restores the endpoints and reports what it did.
func (a *Agent) restoreAtStart() error {
	if err := a.restore(context.Background()); err != nil {
		return err
	}
	rs, m := a.restoreStats, a.cfg.API.Metrics
	m.SetRestoreDuration(rs.Leases)
	m.SetRestoreCounts(rs.Found, rs.Restored, rs.Invalid, rs.Refused, rs.Quarantined)
	a.Server.SetRestore(models.RestoreStatus{Found: rs.Found, Restored: rs.Restored, Invalid: rs.Invalid,
		Refused: rs.Refused, Quarantined: rs.Quarantined})
	return nil
}

func (a *Agent) startK8s() (err error) {
	if a.cfg.K8s == nil {
		return nil
	}
	kc := *a.cfg.K8s
	if ns, ok := any(a.System).(k8s.NodeSink); ok && kc.Nodes == nil {
		kc.Nodes = ns // the cross-node datapath's SyncNodes, where built in
	} else if kc.Nodes == nil {
		a.log.Info("other nodes are counted, not routed: the actor system has no SyncNodes")
	}
	// The Linux datapath hands the policy secrets to its L7 proxy; without
	// one (L7 rules refused) no Secret is watched.
	if ss, ok := a.System.Datapath.(k8s.SecretSink); ok && kc.Secrets == nil && !a.System.Config.NoL7 {
		kc.Secrets = ss
	}
	if a.k8s, err = k8s.Start(context.Background(), kc, a.System, a.log); err != nil {
		return err
	}
	a.Server.SetLabeler(a.k8s.Labels)
	a.Server.SetK8s(a.k8s.Status)
	return nil
}

// startIPCachePrune prunes the kernel ipcache once every source of other
// nodes' endpoints first synced (the Kubernetes watcher's remote
// endpoints, the etcd mirror), bounded by the Kubernetes sync timeout
// (default 2 minutes): a source that cannot sync (etcd away) does not
// keep the entries of endpoints gone meanwhile forever.
func (a *Agent) startIPCachePrune() error {
	var waits []<-chan struct{}
	limit := 2 * time.Minute
	if a.cfg.K8s != nil && a.k8s != nil {
		waits = append(waits, a.k8s.RemoteEndpointsSynced())
		limit = cmp.Or(a.cfg.K8s.SyncTimeout, limit)
	}
	if a.kvstore != nil && a.kvstore.mirror != nil {
		waits = append(waits, a.kvstore.mirror.FirstSync())
	}
	if len(waits) == 0 {
		return nil
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTimer(limit)
		defer t.Stop()
		for _, synced := range waits {
			select {
			case <-synced:
			case <-t.C:
				a.log.Warn("remote endpoints not synced in time: pruning the ipcache anyway", "timeout", limit)
				a.System.PruneIPCache()
				return
			case <-stop:
				return
			}
		}
		a.System.PruneIPCache()
	}()
	a.stopPrune = func() { close(stop); <-done }
	return nil
}

func (a *Agent) startServices(linux *datapath.Linux) (err error) {
	// The restored endpoints' hostPorts, before a prune drops them from
	// the service maps.
	if err := a.Server.SyncHostPorts(context.Background()); err != nil {
		a.log.Error("hostPort services of the restored endpoints", "err", err)
	}
	if a.cfg.K8s == nil {
		// No feeder: what an earlier agent left in the service maps goes.
		a.System.PruneServices()
		return nil
	}
	kc := *a.cfg.K8s
	if linux != nil {
		// The kube-proxy replacement answers the health check node
		// ports, on the node's addresses (the host netns).
		kc.HealthCheckNodePorts = true
		kc.HealthCheckListen = func(network, addr string) (l net.Listener, err error) {
			err = linux.InHost(func() (err error) {
				l, err = net.Listen(network, addr)
				return err
			})
			return l, err
		}
	}
	a.k8sSvc, err = k8s.StartServices(context.Background(), kc, a.System, a.log)
	return err
}

func (a *Agent) startKvstorePublish() error {
	if a.kvstore == nil {
		return nil
	}
	return a.startKvstore()
}

func (a *Agent) setReady() error {
	a.Server.SetReady()
	a.log.Info("agent ready", "socket", a.cfg.Socket, "datapath", a.System.Datapath.Name(),
		"ipv4-range", a.cfg.IPv4Range, "ipv6-range", a.cfg.IPv6Range)
	return nil
}
