// Command membrane-agent is Membrane's node daemon: the actor system, the
// index and the REST API on a unix socket that membrane-cni, membranectl
// and the simulator talk to. It is the only place (with the other cmd/
// programs) that reads flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/membrane-cni/membrane/actors"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// version is the agent's version, set at build time (make image:
// -ldflags "-X main.version=..."); reported by `membrane-agent version`,
// in the start log and in GET /v1/status.
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	if len(args) > 0 {
		if sub, ok := subcommands[args[0]]; ok {
			return sub(args[1:], stderr)
		}
	}
	cfg, log, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "membrane-agent: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log.Info("membrane-agent starting", "version", version)
	a, err := agent.Start(cfg, log)
	if err != nil {
		log.Error("agent failed to start", "err", err)
		return 1
	}
	<-ctx.Done()
	log.Info("signal received; stopping (endpoints, IPs and identities are kept for restore)")
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.Stop(sctx); err != nil {
		log.Error("stop", "err", err)
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (agent.Config, *slog.Logger, error) {
	fs := flag.NewFlagSet("membrane-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg agent.Config
	cfg.API.Version = version
	var v4, v6, strategy, level, format, devices string
	var expiry time.Duration
	fs.StringVar(&cfg.Socket, "socket", "/var/run/membrane/membrane.sock", "unix socket of the REST API")
	fs.StringVar(&cfg.StateDir, "state-dir", "/var/run/membrane/state", "directory of per-endpoint state")
	fs.StringVar(&cfg.ProcFS, "procfs", "", "where the host's /proc is mounted, for sysctls (a container's own /proc/sys is read-only; \"\" is /proc)")
	fs.StringVar(&v4, "ipv4-range", "10.200.0.0/16", "IPv4 pod CIDR (\"\" disables IPv4)")
	fs.StringVar(&v6, "ipv6-range", "", "IPv6 pod CIDR, e.g. fd00:200::/112 (at most 2^24 addresses)")
	fs.StringVar(&cfg.IPAM, "ipam", agent.IPAMStatic, "where the pod CIDRs come from: static (--ipv4-range, --ipv6-range) or kubernetes (this node's spec.podCIDRs; Kubernetes mode only)")
	fs.StringVar(&strategy, "ipam-strategy", "sequential", "address allocation: sequential or random")
	fs.DurationVar(&expiry, "ipam-expiry", 10*time.Minute, "release an address allocated through the API that no endpoint claimed within this long (0 disables; at least 1s)")
	fs.StringVar(&cfg.Datapath, "datapath", "linux", "datapath: linux (needs root: CAP_NET_ADMIN) or fake (in memory, for demos and tests)")
	fs.StringVar(&cfg.DeleteQueueDir, "delete-queue-dir", "/var/run/membrane/delete-queue", "directory of CNI DELs queued while the agent was unreachable (\"\" disables draining)")
	fs.StringVar(&cfg.Linux.GatewayDevice, "gateway-device", "membrane_host", "linux datapath: dummy device holding the pods' gateway addresses")
	fs.DurationVar(&cfg.Linux.TeardownDelay, "teardown-delay", 2*time.Second, "linux datapath: delay before a deleted endpoint's host veth (down and renamed to its tombstone lxc-<index> at once) is deleted if its netns has not taken it (negative: at once, on the DEL's path)")
	fs.IntVar(&cfg.Linux.MaxPendingTeardowns, "teardown-max-pending", datapath.DefaultMaxPendingTeardowns, "linux datapath: most deferred host veth deletions waiting; past that a DEL deletes the pair on its own path")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", "127.0.0.1:9890", "read-only HTTP listener: GET API calls, /metrics and (with --pprof) /debug/pprof; mutating calls are refused (\"\" disables)")
	fs.BoolVar(&cfg.API.Pprof, "pprof", false, "serve /debug/pprof on the socket and the HTTP listener")
	var allowedHosts string
	fs.StringVar(&allowedHosts, "http-allowed-hosts", "", "comma-separated Host names the HTTP listener answers besides localhost and loopback addresses (\"*\": any; guards against DNS rebinding)")
	fs.IntVar(&cfg.API.MaxHTTPConns, "http-max-connections", 64, "HTTP listener: most connections open at once; more are answered 503 and closed")
	fs.IntVar(&cfg.API.MaxConns, "max-connections", 1024, "unix socket: most connections open at once; more are answered 503 and closed")
	fs.IntVar(&cfg.Actors.Pool.Workers, "datapath-workers", actors.DefaultPoolWorkers, "goroutines running the datapath's blocking calls (netlink, BPF, disk) for the actors, 1..1024: more let slow calls wait side by side, each costs a parked goroutine")
	fs.IntVar(&cfg.GCPercent, "gc-percent", agent.DefaultGCPercent, "Go garbage collector target: collect when the heap has grown by this percentage of the live heap (25..1000; the GOGC environment variable, when set, wins): higher costs memory and saves CPU")
	var memLimitMiB int64
	fs.Int64Var(&memLimitMiB, "memory-limit-mib", agent.DefaultMemoryLimitMiB, "soft limit of the Go runtime's memory (heap, stacks, runtime structures; not the executable's pages) in MiB: the garbage collector runs earlier than --gc-percent asks when the heap would grow past it, but never more often than when the heap has grown by half the live heap (0: no limit; the GOMEMLIMIT environment variable, when set, wins)")
	fs.DurationVar(&cfg.ReleaseStartupPages, "release-startup-pages", 10*time.Second, "this long after start, ask the kernel to reclaim the pages of the agent's executable that start-up read (package initialisers; most of the binary's resident pages), so the resident memory settles at what the agent uses; pages used later are read back on first touch (0: never)")
	fs.DurationVar(&cfg.GCInterval, "gc-interval", time.Minute, "garbage collector: time between passes deleting orphan host veths and BPF pins and endpoints whose host interface vanished (each needs two consecutive passes; negative disables)")
	fs.StringVar(&cfg.Linux.BPFFS, "bpffs", datapath.DefaultBPFFS, "linux datapath: bpffs directory for pinned BPF objects (per endpoint under <bpffs>/endpoints/<id>)")
	var attach string
	fs.StringVar(&attach, "bpf-attach", "auto", "linux datapath: how BPF programs attach: auto (endpoint veths, which the agent creates and owns, with clsact + cls_bpf filters, about 1 ms per CNI ADD; shared devices, uplinks and the tunnel device, with pinned TCX links that nothing else on the node can replace or detach), tcx (TCX everywhere; each endpoint attach waits for an RCU grace period per direction under the rtnl lock, about 10-30 ms of every CNI ADD) or tc (cls_bpf everywhere). TCX falls back to cls_bpf where the kernel lacks it")
	fs.StringVar(&cfg.Linux.L7.ProxyPath, "l7-proxy", "", "linux datapath: absolute path of membrane-proxy; enables L7 (HTTP) policy, the agent runs and restarts it")
	fs.StringVar(&cfg.Linux.L7.XDSSocket, "l7-xds-socket", "/var/run/membrane/xds.sock", "linux datapath: unix socket of the xDS server configuring the L7 proxy")
	fs.StringVar(&cfg.Linux.L7.Listen, "l7-proxy-listen", "127.0.0.1:15001", "linux datapath: the L7 proxy's listening address")
	fs.StringVar(&cfg.Linux.L7.KafkaListen, "l7-proxy-kafka-listen", "", "linux datapath: the L7 proxy's Kafka listening address (default: --l7-proxy-listen's address and port + 1)")
	fs.DurationVar(&cfg.Linux.PinCheckInterval, "bpffs-check-interval", datapath.DefaultPinCheckInterval, "linux datapath: how often the agent checks that its pins under --bpffs are there and pins missing ones again from the objects it holds (an operator's cleanup, a fresh bpffs mounted over /sys/fs/bpf); negative: never")
	fs.BoolVar(&cfg.EnableHealth, "enable-health", true, "linux datapath: run the health endpoint (own netns, identity health) and probe it; reported in GET /v1/status")
	fs.DurationVar(&cfg.HealthInterval, "health-interval", 10*time.Second, "how often the health endpoint is probed")
	fs.DurationVar(&cfg.HealthNodeInterval, "health-node-interval", 5*time.Second, "with --enable-health: how often every remote node is probed (ICMP echo and HTTP to its responder on port 4240, which this agent also runs); negative: no node probes, no responder; GET /v1/health")
	fs.IntVar(&cfg.Linux.Maps.PolicyMax, "policy-map-max", datapath.DefaultPolicyMapMax, fmt.Sprintf("linux datapath: entries of each endpoint's policy map and CIDR policy map (%d..%d, Cilium's bpf-policy-map-max); a policy that does not fit fails closed: the endpoint denies every new connection until it fits", datapath.MinPolicyMapMax, datapath.MaxPolicyMapMax))
	fs.IntVar(&cfg.Linux.Maps.IPCacheMax, "ipcache-max", datapath.DefaultIPCacheMax, fmt.Sprintf("linux datapath: entries of the ipcache (address or prefix -> identity; %d..%d)", datapath.MinIPCacheMax, datapath.MaxMapEntries))
	fs.IntVar(&cfg.Linux.Maps.CTMax, "ct-max", datapath.DefaultCTMax, fmt.Sprintf("linux datapath: entries of the conntrack table, an LRU map (%d..%d); a full table evicts the least recently used connection, whose next packet policy decides again", datapath.MinCTMax, datapath.MaxMapEntries))
	fs.BoolVar(&cfg.Linux.Flows, "flows", true, "linux datapath: the endpoint programs report every new connection with its verdict (GET /v1/flows, membranectl observe); off, only drops are recorded. Written to a BPF map at start: no pod is reloaded")
	fs.IntVar(&cfg.Flows.Capacity, "flows-buffer", 4096, "how many flows the node's flow log keeps (GET /v1/flows)")
	fs.IntVar(&cfg.Flows.Rate, "flows-rate", 5000, "at most this many flows per second enter the flow log; the rest are counted (rate-limited in GET /v1/flows and status)")
	fs.StringVar(&level, "log-level", "info", "log level: debug, info, warn, error")
	var kc k8s.Config
	var inCluster bool
	var labelPatterns, nodeLabelPatterns string
	policyGroups := "membrane.io"
	fs.StringVar(&policyGroups, "policy-api-groups", policyGroups, "Kubernetes mode: comma-separated API groups whose network policy kinds the agent reads besides NetworkPolicy: membrane.io (MembraneNetworkPolicy, MembraneClusterwideNetworkPolicy) and cilium.io (CiliumNetworkPolicy, CiliumClusterwideNetworkPolicy of cilium.io/v2, whose CRDs must be installed)")
	fs.StringVar(&labelPatterns, "labels", "", "Kubernetes mode: space-separated identity-relevant label patterns, Cilium's syntax \"[source:][!]regexp\" anchored at the key's start (\"k8s:app k8s:!team\"); added to the defaults, which leave out pod-template-hash, controller-revision-hash, statefulset.kubernetes.io/pod-name, apps.kubernetes.io/pod-index, job-name, controller-uid, batch.kubernetes.io/{job-name,controller-uid}, io.kubernetes, kubernetes.io and k8s.io keys (the namespace, namespace labels, service account and app.kubernetes.io stay). An include pattern keeps only what some include matches")
	fs.StringVar(&kc.Kubeconfig, "k8s-kubeconfig", "", "Kubernetes mode: kubeconfig of the API server to watch pods, namespaces and NetworkPolicies from (\"\": standalone unless --k8s)")
	fs.BoolVar(&inCluster, "k8s", false, "Kubernetes mode with the in-cluster configuration (service account, KUBERNETES_SERVICE_HOST)")
	fs.StringVar(&kc.APIServer, "k8s-api-server", "", "Kubernetes mode: https://host:port of the API server, instead of the kubeconfig's server or the kubernetes Service's ClusterIP (needed where nothing translates that address before the agent runs: kube-proxy-free clusters)")
	fs.StringVar(&kc.NodeName, "node-name", "", "Kubernetes mode: this node's name (default: the hostname)")
	fs.DurationVar(&kc.SyncTimeout, "k8s-sync-timeout", 2*time.Minute, "Kubernetes mode: longest wait at start for the caches before serving CNI ADDs")
	fs.DurationVar(&kc.PodCIDRWait, "k8s-pod-cidr-wait", 2*time.Minute, "--ipam kubernetes: longest wait at start for this node's Node object to have spec.podCIDRs (the agent then exits with an error)")
	fs.DurationVar(&kc.PodWait, "k8s-pod-wait", 10*time.Second, "Kubernetes mode: longest wait of a CNI ADD for its pod to be cached before the endpoint gets the init identity")
	fs.BoolVar(&kc.KubeProxyReplacement, "kube-proxy-replacement", false, "Kubernetes mode: translate NodePort and external addresses of Services too, host processes' connections (socket hooks on --socket-lb-cgroup) and NodePort traffic from outside (a program on --devices); no kube-proxy on the node. Cluster addresses from pods are always translated")
	fs.StringVar(&cfg.Linux.Services.Cgroup, "socket-lb-cgroup", "", "--kube-proxy-replacement: cgroup2 directory whose processes get socket-level service translation (default: the cgroup2 mount's root)")
	var nodePortRange string
	fs.StringVar(&nodePortRange, "node-port-range", "30000-32767", "--kube-proxy-replacement: the Services' NodePort range (the API server's --service-node-port-range), first-last or Cilium's first,last")
	fs.BoolVar(&cfg.Linux.Services.ProtectNodePortRange, "enable-auto-protect-node-port-range", true, "--kube-proxy-replacement: when the host's ephemeral ports (net.ipv4.ip_local_port_range) overlap --node-port-range, reserve the range (net.ipv4.ip_local_reserved_ports), so that no host connection's replies are taken for NodePort traffic (as Cilium's agent)")
	fs.StringVar(&devices, "devices", "", "--kube-proxy-replacement, --host-firewall, --routing native: comma-separated uplinks translating NodePort traffic from outside, enforcing host policies and, in native routing, delivering other nodes' pod traffic straight to the pods (default: the devices holding the node's addresses)")
	fs.StringVar(&nodeLabelPatterns, "node-labels", "", "--enable-node-selector-labels: space-separated patterns choosing the Node labels that make a node's identity, --labels' syntax without its defaults (\"topology.kubernetes.io !kubernetes.io/hostname\"; Cilium's flag); empty: every label")
	fs.BoolVar(&cfg.Actors.NodeSelectorLabels, "enable-node-selector-labels", false, "give every other node an identity of its own from its Node labels (source node), so that policies select nodes with fromNodes/toNodes (Cilium's flag); off: other nodes are remote-node and fromNodes/toNodes are refused")
	fs.BoolVar(&cfg.Linux.HostFirewall.Enabled, "host-firewall", false, "Kubernetes mode, linux datapath: enforce host policies (CiliumClusterwideNetworkPolicy and MembraneClusterwideNetworkPolicy with nodeSelector, matched against this node's Node labels) on the node's own traffic on --devices; the API server the agent uses, replies to the node's connections, node health probes and the tunnel port always pass (SECURITY.md)")
	fs.Float64Var(&kc.ClientQPS, "k8s-client-qps", k8s.DefaultClientQPS, "Kubernetes mode: queries per second the agent's clients of the API server may send (Cilium's flag and default; client-go's own default is 5)")
	fs.IntVar(&kc.ClientBurst, "k8s-client-burst", k8s.DefaultClientBurst, "Kubernetes mode: burst above --k8s-client-qps the agent's clients of the API server may send (Cilium's flag and default; client-go's own is 10)")
	fs.DurationVar(&kc.ProbeInterval, "k8s-probe-interval", 5*time.Second, "Kubernetes mode: how often the API server's /readyz is probed to report the connection state in GET /v1/status")
	fs.StringVar(&kc.Identity.Mode, "identity-allocation-mode", k8s.IdentityCRD, "Kubernetes mode: crd (one number per label set cluster-wide, MembraneIdentity objects) or local (numbered per node)")
	fs.DurationVar(&kc.Identity.GCGrace, "identity-gc-grace", 15*time.Minute, "Kubernetes mode, crd identities: how long an identity no node uses stays before it is deleted (also how late a node's heartbeat may be)")
	fs.DurationVar(&kc.Identity.GCInterval, "identity-gc-interval", time.Minute, "Kubernetes mode, crd identities: time between garbage collection passes (negative disables this agent's)")
	fs.StringVar(&kc.Identity.LeaseNamespace, "identity-lease-namespace", "kube-system", "Kubernetes mode, crd identities: namespace of the nodes' heartbeat leases")
	var secretsNS string
	fs.StringVar(&secretsNS, "policy-secrets-namespace", "membrane-secrets", "Kubernetes mode: the one namespace whose Secrets a policy's headerMatches[].secret may name (Cilium's flag; Cilium's chart uses cilium-secrets). The agent watches Secrets there only; a policy naming a Secret in another namespace is refused, the Secret never read. \"\": every secret is refused")
	fs.StringVar(&format, "log-format", "text", "log format: text or json")
	var kv kvstore.Config
	var kvMode, etcdEndpoints, nodeAddrs string
	fs.StringVar(&kvMode, "kvstore", "", "kvstore mode: \"etcd\" shares identities, endpoints and nodes through etcd (\"\": off)")
	fs.StringVar(&etcdEndpoints, "etcd-endpoints", "", "kvstore mode: comma-separated etcd client URLs (http:// or https://)")
	fs.StringVar(&kv.CAFile, "etcd-ca", "", "kvstore mode: CA file verifying etcd's certificate (turns TLS on; every --etcd-endpoints must then be https://)")
	fs.StringVar(&kv.CertFile, "etcd-cert", "", "kvstore mode: client certificate file (with --etcd-key)")
	fs.StringVar(&kv.KeyFile, "etcd-key", "", "kvstore mode: client key file (with --etcd-cert)")
	fs.DurationVar(&kv.LeaseTTL, "kvstore-lease-ttl", kvstore.DefaultLeaseTTL, "kvstore mode: node lease TTL: how long after this agent stops renewing it other nodes keep its endpoints (at least 2s)")
	fs.StringVar(&nodeAddrs, "kvstore-node-addrs", "", "kvstore mode: comma-separated underlay addresses of this node, published for other nodes to route to (default, linux datapath: the Node object's InternalIPs in Kubernetes mode, else per family the address of the default route's device or the source toward the etcd endpoints)")
	var clusterCIDRs string
	fs.StringVar(&cfg.Linux.Nodes.Routing, "routing", datapath.RoutingTunnel, "linux datapath: how pods reach other nodes' pods: tunnel (one VXLAN device, source identity in the VNI) or native (a route per remote pod CIDR via its node; pod-to-pod TCP and UDP go straight between the pods' veths and the uplinks of --devices)")
	fs.IntVar(&cfg.Linux.Nodes.TunnelPort, "tunnel-port", 8472, "tunnel routing: the VXLAN UDP port")
	fs.IntVar(&cfg.Linux.Nodes.TunnelMTU, "tunnel-mtu", 1450, "tunnel routing: the VXLAN device's MTU (the underlay's minus 50)")
	fs.BoolVar(&cfg.Linux.Nodes.Masquerade, "masquerade", true, "linux datapath: SNAT pod traffic leaving the cluster's pod CIDRs to the node's address (nftables); the cluster's pod CIDRs are this node's, every other node's (from the Node objects, the kvstore or the nodes file) and --cluster-cidr")
	fs.StringVar(&clusterCIDRs, "cluster-cidr", "", "comma-separated pod CIDRs of the whole cluster (Cilium's native-routing CIDR), never masqueraded to; optional: the nodes' pod CIDRs are learned")
	fs.StringVar(&cfg.NodesFile, "nodes-file", "", "standalone mode: JSON or YAML list of the other nodes (name, addresses, podCIDRs), re-read when it changes")
	dnsFlags := addDNSFlags(fs)
	if err := fs.Parse(args); err != nil {
		return cfg, nil, err
	}
	if err := dnsFlags.apply(&cfg); err != nil {
		return cfg, nil, err
	}
	if fs.NArg() > 0 {
		return cfg, nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if memLimitMiB < 0 || memLimitMiB > 1<<30 {
		return cfg, nil, fmt.Errorf("--memory-limit-mib %d: want 0..%d", memLimitMiB, 1<<30)
	}
	cfg.MemoryLimit = memLimitMiB << 20
	for _, s := range strings.Split(clusterCIDRs, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := parsePrefix("--cluster-cidr", s)
		if err != nil {
			return cfg, nil, err
		}
		cfg.Linux.Nodes.ClusterCIDRs = append(cfg.Linux.Nodes.ClusterCIDRs, p)
	}
	switch attach {
	case "auto":
	case "tcx":
		cfg.Linux.EndpointTCX = true
	case "tc":
		cfg.Linux.ForceLegacyTC = true
	default:
		return cfg, nil, fmt.Errorf("--bpf-attach %q: want auto, tcx or tc", attach)
	}
	if w := cfg.Actors.Pool.Workers; w < 1 || w > 1024 {
		return cfg, nil, fmt.Errorf("--datapath-workers %d: want 1..1024", w)
	}
	if allowedHosts != "" {
		cfg.API.AllowedHosts = strings.Split(allowedHosts, ",")
	}
	var err error
	if cfg.IPv4Range, err = parsePrefix("--ipv4-range", v4); err != nil {
		return cfg, nil, err
	}
	if cfg.IPv6Range, err = parsePrefix("--ipv6-range", v6); err != nil {
		return cfg, nil, err
	}
	if cfg.IPAMStrategy, err = ipam.ParseStrategy(strategy); err != nil {
		return cfg, nil, fmt.Errorf("--ipam-strategy: %w", err)
	}
	if cfg.Actors.IPAM.Expiry, err = parseExpiry(expiry); err != nil {
		return cfg, nil, err
	}
	if kc.Kubeconfig != "" || inCluster {
		kc.InCluster = kc.Kubeconfig == ""
		if kc.NodeName == "" {
			// kubelet names the node after the lowercased hostname.
			host, err := os.Hostname()
			if err != nil {
				return cfg, nil, fmt.Errorf("--node-name: hostname: %w", err)
			}
			kc.NodeName = strings.ToLower(host)
		}
		cfg.K8s = &kc
		if secretsNS != "" && (len(secretsNS) > 63 || !dnsLabel.MatchString(secretsNS)) {
			return cfg, nil, fmt.Errorf("--policy-secrets-namespace: %q is not a namespace name (a DNS label)", secretsNS)
		}
		cfg.Actors.PolicySecretsNamespace = secretsNS
	} else if flagGiven(fs, "policy-secrets-namespace") && secretsNS != "" {
		return cfg, nil, fmt.Errorf("--policy-secrets-namespace: only with --k8s-kubeconfig or --k8s (outside Kubernetes mode the agent reads no Secrets: give headerMatches a value)")
	} else if kc.KubeProxyReplacement {
		return cfg, nil, fmt.Errorf("--kube-proxy-replacement: only with --k8s-kubeconfig or --k8s")
	} else if kc.APIServer != "" {
		return cfg, nil, fmt.Errorf("--k8s-api-server: only with --k8s-kubeconfig or --k8s")
	}
	cfg.Linux.Services.KubeProxyReplacement = kc.KubeProxyReplacement
	kc.Labels = strings.Fields(labelPatterns)
	if p := strings.Fields(nodeLabelPatterns); len(p) > 0 {
		if !cfg.Actors.NodeSelectorLabels {
			return cfg, nil, fmt.Errorf("--node-labels: only with --enable-node-selector-labels")
		}
		f, err := labels.NewPatternFilter(p)
		if err != nil {
			return cfg, nil, fmt.Errorf("--node-labels: %w", err)
		}
		cfg.Actors.NodeLabels = f
	}
	for _, g := range strings.Split(policyGroups, ",") {
		if g = strings.TrimSpace(g); g != "" {
			kc.PolicyAPIGroups = append(kc.PolicyAPIGroups, g)
		}
	}
	if devices != "" {
		cfg.Linux.Services.Devices = strings.Split(devices, ",")
	}
	r, err := parsePortRange(nodePortRange)
	if err != nil {
		return cfg, nil, fmt.Errorf("--node-port-range: %w", err)
	}
	cfg.Linux.Services.NodePortRange = r
	if !kc.KubeProxyReplacement && cfg.Linux.Services.Cgroup != "" {
		return cfg, nil, fmt.Errorf("--socket-lb-cgroup: only with --kube-proxy-replacement")
	}
	if !kc.KubeProxyReplacement && !cfg.Linux.HostFirewall.Enabled && cfg.Linux.Nodes.Routing != datapath.RoutingNative && devices != "" {
		return cfg, nil, fmt.Errorf("--devices: only with --kube-proxy-replacement, --host-firewall or --routing native")
	}
	if cfg.Linux.HostFirewall.Enabled && cfg.K8s == nil {
		return cfg, nil, fmt.Errorf("--host-firewall: only with --k8s-kubeconfig or --k8s (host policies select nodes by their Node labels)")
	}
	if err := kvstoreFlags(&cfg, kv, kvMode, etcdEndpoints, nodeAddrs, kc.NodeName); err != nil {
		return cfg, nil, err
	}
	if kc.NodeName != "" && cfg.K8s == nil && cfg.Kvstore == nil {
		return cfg, nil, fmt.Errorf("--node-name: only with --k8s-kubeconfig, --k8s or --kvstore")
	}
	cfg.NodeName = kc.NodeName
	if cfg.Flows.Capacity < 1 || cfg.Flows.Capacity > 1<<20 {
		return cfg, nil, fmt.Errorf("--flows-buffer %d: want 1..%d", cfg.Flows.Capacity, 1<<20)
	}
	if cfg.Flows.Rate < 1 {
		return cfg, nil, fmt.Errorf("--flows-rate %d: want at least 1", cfg.Flows.Rate)
	}
	log, err := newLogger(level, format, stderr)
	if err != nil {
		return cfg, nil, err
	}
	return cfg, log, cfg.Validate()
}

// kvstoreFlags fills cfg.Kvstore from the kvstore flags.
func kvstoreFlags(cfg *agent.Config, kv kvstore.Config, mode, endpoints, nodeAddrs, nodeName string) error {
	switch mode {
	case "":
		if endpoints != "" || kv.CAFile != "" || kv.CertFile != "" || kv.KeyFile != "" || nodeAddrs != "" {
			return fmt.Errorf("--etcd-*, --kvstore-node-addrs: only with --kvstore etcd")
		}
		return nil
	case "etcd":
	default:
		return fmt.Errorf("--kvstore: %q: want etcd or \"\"", mode)
	}
	if endpoints != "" {
		kv.Endpoints = strings.Split(endpoints, ",")
	}
	kv.NodeName = nodeName
	if kv.NodeName == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("--node-name: hostname: %w", err)
		}
		kv.NodeName = strings.ToLower(host)
	}
	if nodeAddrs != "" {
		for _, s := range strings.Split(nodeAddrs, ",") {
			a, err := netip.ParseAddr(s)
			if err != nil {
				return fmt.Errorf("--kvstore-node-addrs: %q: %w", s, err)
			}
			cfg.NodeAddrs = append(cfg.NodeAddrs, a)
		}
	}
	cfg.Kvstore = &kv
	return nil
}

// parseExpiry maps --ipam-expiry to the IPAM config: 0 disables expiry
// (the config's negative), anything below a second is refused (it would
// release addresses between a CNI ADD's allocation and its endpoint).
func parseExpiry(d time.Duration) (time.Duration, error) {
	switch {
	case d == 0:
		return -1, nil
	case d < time.Second:
		return 0, fmt.Errorf("--ipam-expiry: %s: want 0 (disabled) or at least 1s", d)
	}
	return d, nil
}

func parsePrefix(flagName, s string) (netip.Prefix, error) {
	if s == "" {
		return netip.Prefix{}, nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return p, fmt.Errorf("%s: %q is not a CIDR: %w", flagName, s, err)
	}
	if p != p.Masked() {
		return p, fmt.Errorf("%s: %s has host bits set (did you mean %s?)", flagName, p, p.Masked())
	}
	return p, nil
}

func newLogger(level, format string, w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format: %q: want text or json", format)
}

// dnsLabel is a Kubernetes namespace name (RFC 1123 label).
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// flagGiven reports whether the command line set the flag name.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// parsePortRange parses "first-last" or "first,last" (Cilium's form):
// 1 <= first <= last <= 65535.
func parsePortRange(s string) ([2]uint16, error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		a, b, ok = strings.Cut(s, ",")
	}
	if !ok {
		return [2]uint16{}, fmt.Errorf("%q: want first-last", s)
	}
	lo, err1 := strconv.ParseUint(strings.TrimSpace(a), 10, 16)
	hi, err2 := strconv.ParseUint(strings.TrimSpace(b), 10, 16)
	if err1 != nil || err2 != nil || lo == 0 || lo > hi {
		return [2]uint16{}, fmt.Errorf("%q: want first-last, port numbers with 1 <= first <= last", s)
	}
	return [2]uint16{uint16(lo), uint16(hi)}, nil
}
