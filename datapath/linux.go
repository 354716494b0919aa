package datapath

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// ErrInvalidConfig is wrapped by LinuxConfig validation errors. (It
// belongs in datapath.go's sentinel block; kept here while that file has
// another owner.)
var (
	ErrInvalidConfig = errors.New("invalid datapath config")
	// ErrInvalidPolicy is returned by Realize for a policy the endpoint
	// programs cannot express (a reserved identity, a port without a
	// protocol).
	ErrInvalidPolicy = errors.New("invalid endpoint policy")
	// ErrMapFull is returned by Realize for an endpoint whose policy does
	// not fit its policy maps (MapSizes.PolicyMax) and by UpsertIPCache
	// when the ipcache is full. The endpoint then enforces deny-all
	// until its policy fits (fail closed).
	ErrMapFull = errors.New("bpf map full")
	// ErrNotBPFFS is returned by Init when LinuxConfig.BPFFS is not on a
	// bpffs and is not below /sys/fs/bpf (the one place Init mounts a
	// bpffs itself).
	ErrNotBPFFS = errors.New("not on a bpffs")
)

// LinuxConfig configures the Linux datapath (datapath.Linux).
type LinuxConfig struct {
	// HostNetns is the path of the network namespace holding the host side
	// of the veths; "" is the agent's own. Tests and benchmarks point it
	// at a namespace they made, so they never touch the machine's.
	HostNetns string
	// GatewayDevice is the dummy device that holds the pods' gateway
	// addresses (default "membrane_host").
	GatewayDevice string
	// Gateways are the gateway addresses of the pod CIDRs (the agent fills
	// them from its IPAM ranges).
	Gateways []netip.Addr
	// TeardownDelay is how long after an endpoint's removal its host veth
	// is deleted if it still exists (default 2 s; negative: at once, on
	// the removal's path). The removal itself sets the host veth down and
	// renames it to its tombstone (ifname.Tombstone), which cuts the pod
	// off and frees the attachment's name at once. The runtime deletes the
	// pod's netns right after CNI DEL, which removes the pair in the
	// kernel's own batch; deleting it ourselves first would put an RCU
	// barrier (~25-30 ms) on the DEL's path.
	TeardownDelay time.Duration
	// MaxPendingTeardowns bounds the deferred host veth deletions
	// (default DefaultMaxPendingTeardowns): a removal that finds that
	// many pending deletes its pair at once, on the removal's path.
	MaxPendingTeardowns int
	// BPFFS is the directory on a bpffs holding the pinned BPF objects
	// (default DefaultBPFFS): the shared maps (ipcache, ct, drops, events)
	// directly under it, each endpoint's links and policy map under
	// endpoints/<id>/. Init mounts a bpffs at its parent if there is none.
	BPFFS string
	// ForceLegacyTC attaches every program (endpoints, uplinks, tunnel
	// device) with clsact + cls_bpf (netlink) even where TCX works
	// (--bpf-attach tc).
	ForceLegacyTC bool
	// EndpointTCX attaches the endpoint programs with TCX links, as the
	// shared devices' (--bpf-attach tcx). By default (--bpf-attach auto)
	// the endpoint veths, which the agent creates and owns, use clsact +
	// cls_bpf: a TCX attach waits for an RCU grace period per direction
	// (BENCHMARKS.md, "Per-node endpoint programs"), and TCX's ownership
	// guarantees matter on the shared devices, not on our own veths.
	EndpointTCX bool
	// CTGC configures the conntrack garbage collector (CTGCConfig).
	CTGC CTGCConfig
	// PinCheckInterval is how often the agent checks that its BPF pins
	// under BPFFS are there and pins missing ones again from the objects
	// it holds (an operator's cleanup, a fresh bpffs mounted over the
	// directory); 0: DefaultPinCheckInterval, negative: never.
	PinCheckInterval time.Duration
	// Nodes configures the routes to other nodes' pods (NodeRouter).
	Nodes NodesConfig
	// L7 configures the L7 proxy (off unless ProxyPath is set).
	L7 L7Config
	// DNSProxyPort is the port of the agent's DNS proxy at 127.0.0.1 in
	// the host netns (0: no DNS proxy): the BPF programs redirect the
	// policy map entries with DNS rules to it.
	DNSProxyPort uint16
	// Services configures the kube-proxy-free mode's hooks.
	Services ServicesConfig
	// Flows makes the endpoint programs report each new connection with
	// its verdict (OnFlow; --flows). Written to the flow_config map at
	// Init and by SetFlows: nothing is reloaded.
	Flows bool
	// HostFirewall turns the host firewall on (host policies): the
	// programs on Services.Devices enforce the host endpoint's policy
	// (bpf/hostfw.h, RealizeHostPolicy).
	HostFirewall HostFirewallConfig
	// Maps sizes the BPF maps that grow with the cluster (MapSizes).
	Maps MapSizes
}

// MapSizes are the capacities of the BPF maps that fill with the
// cluster's load (0: the default). A map pinned by an agent with other
// sizes is replaced at start (conntrack starts empty, the others are
// written again).
type MapSizes struct {
	// PolicyMax is the entries of each endpoint's policy map and of its
	// CIDR policy map (--policy-map-max; DefaultPolicyMapMax, Cilium's
	// bpf-policy-map-max). Two of the policy map's are the enforcement
	// flags. A policy that does not fit fails closed (SECURITY.md).
	PolicyMax int
	// IPCacheMax is the ipcache's entries (--ipcache-max;
	// DefaultIPCacheMax): endpoint addresses, node addresses and policy
	// CIDR prefixes.
	IPCacheMax int
	// CTMax is the conntrack table's entries (--ct-max; DefaultCTMax).
	// An LRU: a full table evicts the least recently used connection,
	// whose next packet is decided by policy again.
	CTMax int
}

// MapUsage is a shared map's fill: Entries of MaxEntries
// ((*Linux).MapUsage).
type MapUsage struct {
	Entries, MaxEntries int
}

// Defaults and bounds of MapSizes.
const (
	DefaultPolicyMapMax = 16384
	DefaultIPCacheMax   = 65536
	DefaultCTMax        = 65536
	// MinPolicyMapMax and MaxPolicyMapMax bound PolicyMax: room for the
	// two enforcement flags and a few entries; at most the endpoint IDs'
	// range, which no policy needs.
	MinPolicyMapMax = 16
	MaxPolicyMapMax = 65536
	// MinIPCacheMax, MinCTMax and MaxMapEntries bound the shared maps. A
	// conntrack table below 1024 entries would be evicting under the
	// lightest load (an LRU map also keeps per-CPU free lists).
	MinIPCacheMax = 16
	MinCTMax      = 1024
	MaxMapEntries = 1 << 24
)

func (m MapSizes) withDefaults() MapSizes {
	m.PolicyMax = cmp.Or(m.PolicyMax, DefaultPolicyMapMax)
	m.IPCacheMax = cmp.Or(m.IPCacheMax, DefaultIPCacheMax)
	m.CTMax = cmp.Or(m.CTMax, DefaultCTMax)
	return m
}

func (m MapSizes) validate() error {
	for _, f := range []struct {
		name           string
		v, least, most int
	}{
		{"Maps.PolicyMax", m.PolicyMax, MinPolicyMapMax, MaxPolicyMapMax},
		{"Maps.IPCacheMax", m.IPCacheMax, MinIPCacheMax, MaxMapEntries},
		{"Maps.CTMax", m.CTMax, MinCTMax, MaxMapEntries},
	} {
		if f.v != 0 && (f.v < f.least || f.v > f.most) { // 0: the default
			return fmt.Errorf("linux datapath: %s %d: want %d..%d: %w", f.name, f.v, f.least, f.most, ErrInvalidConfig)
		}
	}
	return nil
}

// HostFirewallConfig configures the host firewall (Cilium's
// enable-host-firewall).
type HostFirewallConfig struct {
	// Enabled attaches from_netdev at ingress and to_netdev at egress of
	// Services.Devices (detected as for the kube-proxy replacement when
	// empty) whatever the kube-proxy replacement says.
	Enabled bool
	// SafePeers are the TCP peers (address and port; port 0: any) the
	// node exchanges traffic with whatever its host policy: the API
	// server the agent uses, etcd in kvstore mode (the safety net,
	// SECURITY.md). Written at Init.
	SafePeers []netip.AddrPort
}

// ServicesConfig configures the kube-proxy-free mode: socket-level
// translation for the processes of a cgroup (host processes) and the
// NodePort program on the node's uplinks (bpf/sock.c, bpf/nodeport.h).
type ServicesConfig struct {
	// KubeProxyReplacement attaches both; off (kube-proxy translates
	// those paths), Init detaches what a previous agent attached.
	KubeProxyReplacement bool
	// Cgroup is the cgroup2 directory the socket hooks attach to
	// (default: the root of the cgroup2 mount).
	Cgroup string
	// Devices are the uplinks from_netdev runs on (default: the host
	// netns's up devices holding a global unicast address, except the
	// gateway and tunnel devices), resolved at Init.
	Devices []string
	// NodePortRange is the Services' NodePort range (the API server's
	// --service-node-port-range; default 30000-32767). With
	// ProtectNodePortRange, Init reserves it in the host netns when the
	// ephemeral port range overlaps it (protectNodePortRange).
	NodePortRange        [2]uint16
	ProtectNodePortRange bool
}

func (c ServicesConfig) validate() error {
	if r := c.NodePortRange; r != [2]uint16{} && (r[0] == 0 || r[0] > r[1]) {
		return fmt.Errorf("linux datapath: Services.NodePortRange %d-%d: want 1 <= first <= last: %w", r[0], r[1], ErrInvalidConfig)
	}
	if c.Cgroup != "" && !filepath.IsAbs(c.Cgroup) {
		return fmt.Errorf("linux datapath: Services.Cgroup %q: want an absolute path: %w", c.Cgroup, ErrInvalidConfig)
	}
	for _, d := range c.Devices {
		if len(d) == 0 || len(d) > 15 || strings.ContainsAny(d, "/ ") {
			return fmt.Errorf("linux datapath: Services.Devices: %q: want an interface name: %w", d, ErrInvalidConfig)
		}
	}
	return nil
}

// L7Config configures the Linux datapath's L7 proxy: the agent serves
// xDS on XDSSocket and runs ProxyPath (cmd/membrane-proxy) listening on
// Listen (a loopback or unspecified address: the BPF programs redirect
// L7 traffic to the socket at 127.0.0.1 or ::1 and Listen's port),
// restarting it with a backoff between MinBackoff and MaxBackoff
// (reset after a run of StableAfter).
type L7Config struct {
	ProxyPath, XDSSocket, Listen string
	// KafkaListen is the proxy's Kafka listener (rules.kafka), an
	// address as Listen's (default: Listen's address, its port + 1).
	KafkaListen string
	// AccessSocket is the unixgram socket the proxy sends its access
	// records to (default: XDSSocket's name with "-access" before ".sock").
	AccessSocket string
	// ProxyArgs are appended to the proxy's command line (the
	// simulator's fault flags).
	ProxyArgs                           []string
	MinBackoff, MaxBackoff, StableAfter time.Duration
}

// DefaultTunnelDevice is NodesConfig.TunnelDevice's default.
const DefaultTunnelDevice = "membrane_vxlan"

// Routing modes (NodesConfig.Routing).
const (
	// RoutingTunnel sends other nodes' pod traffic through one VXLAN
	// device (external mode), the source identity in the VNI.
	RoutingTunnel = "tunnel"
	// RoutingNative routes each remote pod CIDR via its node's address.
	RoutingNative = "native"
)

// NodesConfig configures cross-node routing and masquerading.
type NodesConfig struct {
	// Routing is RoutingTunnel (default) or RoutingNative.
	Routing string
	// TunnelDevice is the VXLAN device's name (default "membrane_vxlan");
	// TunnelPort its UDP port (default 8472, as Cilium's).
	TunnelDevice string
	TunnelPort   int
	// TunnelMTU is the VXLAN device's MTU (default 1450: a 1500-byte
	// underlay minus the 50 bytes of VXLAN over IPv4).
	TunnelMTU int
	// Masquerade SNATs pod traffic to destinations outside the cluster's
	// pod CIDRs to the node's address on the way out (nftables): traffic
	// from LocalPodCIDRs or ClusterCIDRs to anything but ClusterCIDRs,
	// LocalPodCIDRs and every remote node's pod CIDRs (SyncNodes).
	Masquerade bool
	// ClusterCIDRs are the whole cluster's pod CIDRs (--cluster-cidr,
	// Cilium's native-routing CIDR), optional: remote nodes' pod CIDRs
	// are known from SyncNodes.
	ClusterCIDRs []netip.Prefix
	// LocalPodCIDRs are this node's pod CIDRs (the agent's IPAM ranges).
	LocalPodCIDRs []netip.Prefix
}

// WithDefaults fills zero fields.
func (c NodesConfig) WithDefaults() NodesConfig {
	if c.Routing == "" {
		c.Routing = RoutingTunnel
	}
	if c.TunnelDevice == "" {
		c.TunnelDevice = DefaultTunnelDevice
	}
	if c.TunnelPort == 0 {
		c.TunnelPort = 8472
	}
	if c.TunnelMTU == 0 {
		c.TunnelMTU = 1450
	}
	return c
}

// Validate names the bad field.
func (c NodesConfig) Validate() error {
	switch {
	case c.Routing != RoutingTunnel && c.Routing != RoutingNative:
		return fmt.Errorf("linux datapath: Routing %q: want %q or %q: %w", c.Routing, RoutingTunnel, RoutingNative, ErrInvalidConfig)
	case len(c.TunnelDevice) == 0 || len(c.TunnelDevice) > 15:
		return fmt.Errorf("linux datapath: TunnelDevice %q: want 1..15 bytes: %w", c.TunnelDevice, ErrInvalidConfig)
	case c.TunnelPort < 1 || c.TunnelPort > 65535:
		return fmt.Errorf("linux datapath: TunnelPort %d: want 1..65535: %w", c.TunnelPort, ErrInvalidConfig)
	case c.TunnelMTU < 1280 || c.TunnelMTU > 65485:
		return fmt.Errorf("linux datapath: TunnelMTU %d: want 1280..65485: %w", c.TunnelMTU, ErrInvalidConfig)
	case c.Masquerade && len(c.ClusterCIDRs) == 0 && len(c.LocalPodCIDRs) == 0:
		return fmt.Errorf("linux datapath: Masquerade needs LocalPodCIDRs or ClusterCIDRs: %w", ErrInvalidConfig)
	}
	for _, p := range slices.Concat(c.ClusterCIDRs, c.LocalPodCIDRs) {
		if !p.IsValid() || p != p.Masked() {
			return fmt.Errorf("linux datapath: ClusterCIDRs, LocalPodCIDRs: %s: want a masked prefix: %w", p, ErrInvalidConfig)
		}
	}
	return nil
}

// Defaults of LinuxConfig.
const (
	// DefaultGatewayDevice is LinuxConfig.GatewayDevice's default.
	DefaultGatewayDevice = "membrane_host"
	// DefaultBPFFS is LinuxConfig.BPFFS's default.
	DefaultBPFFS = "/sys/fs/bpf/membrane"
	// DefaultMaxPendingTeardowns is LinuxConfig.MaxPendingTeardowns's
	// default: a burst of pod deletions on one node (a 110-pod node
	// drained, several times over within TeardownDelay).
	DefaultMaxPendingTeardowns = 1024
)

// WithDefaults fills zero fields.
func (c LinuxConfig) WithDefaults() LinuxConfig {
	if c.GatewayDevice == "" {
		c.GatewayDevice = DefaultGatewayDevice
	}
	if c.TeardownDelay == 0 {
		c.TeardownDelay = 2 * time.Second
	}
	if c.MaxPendingTeardowns == 0 {
		c.MaxPendingTeardowns = DefaultMaxPendingTeardowns
	}
	if c.BPFFS == "" {
		c.BPFFS = DefaultBPFFS
	}
	if c.PinCheckInterval == 0 {
		c.PinCheckInterval = DefaultPinCheckInterval
	}
	c.CTGC = c.CTGC.WithDefaults()
	c.L7 = c.L7.withDefaults()
	c.Nodes = c.Nodes.WithDefaults()
	c.Maps = c.Maps.withDefaults()
	return c
}

// DefaultXDSSocket is the L7 proxy's xDS socket unless configured.
const DefaultXDSSocket = "/var/run/membrane/xds.sock"

// L7AccessSocket is the proxy's access log socket next to the xDS
// socket xds (the agent's, and cleanup's, default).
func L7AccessSocket(xds string) string {
	return strings.TrimSuffix(xds, ".sock") + "-access.sock"
}

func (c L7Config) withDefaults() L7Config {
	if c.ProxyPath == "" {
		return c
	}
	if c.XDSSocket == "" {
		c.XDSSocket = DefaultXDSSocket
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:15001"
	}
	if ap, err := netip.ParseAddrPort(c.Listen); err == nil && c.KafkaListen == "" && ap.Port() < 65535 {
		c.KafkaListen = netip.AddrPortFrom(ap.Addr(), ap.Port()+1).String()
	}
	if c.AccessSocket == "" {
		c.AccessSocket = L7AccessSocket(c.XDSSocket)
	}
	c.MinBackoff = cmp.Or(c.MinBackoff, 100*time.Millisecond)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, 10*time.Second)
	c.StableAfter = cmp.Or(c.StableAfter, 30*time.Second)
	return c
}

func (c L7Config) validate() error {
	if c.ProxyPath == "" {
		return nil
	}
	if !filepath.IsAbs(c.ProxyPath) || !filepath.IsAbs(c.XDSSocket) {
		return fmt.Errorf("linux datapath: L7 ProxyPath %q and XDSSocket %q: want absolute paths: %w", c.ProxyPath, c.XDSSocket, ErrInvalidConfig)
	}
	ap, err := netip.ParseAddrPort(c.Listen)
	if err != nil {
		return fmt.Errorf("linux datapath: L7 Listen %q: %w: %w", c.Listen, err, ErrInvalidConfig)
	}
	// The BPF programs find the proxy's socket at the loopback address.
	if !ap.Addr().IsLoopback() && !ap.Addr().IsUnspecified() || ap.Port() == 0 {
		return fmt.Errorf("linux datapath: L7 Listen %q: want a loopback or unspecified address and a port: %w", c.Listen, ErrInvalidConfig)
	}
	kp, err := netip.ParseAddrPort(c.KafkaListen)
	if err != nil || !kp.Addr().IsLoopback() && !kp.Addr().IsUnspecified() || kp.Port() == 0 || kp.Port() == ap.Port() {
		return fmt.Errorf("linux datapath: L7 KafkaListen %q: want a loopback or unspecified address and a port other than Listen's: %w", c.KafkaListen, ErrInvalidConfig)
	}
	if c.MinBackoff <= 0 || c.MaxBackoff < c.MinBackoff {
		return fmt.Errorf("linux datapath: L7 backoff %v..%v: %w", c.MinBackoff, c.MaxBackoff, ErrInvalidConfig)
	}
	return nil
}

// Validate names the bad field.
func (c LinuxConfig) Validate() error {
	if err := c.L7.validate(); err != nil {
		return err
	}
	if err := c.Services.validate(); err != nil {
		return err
	}
	if c.MaxPendingTeardowns < 0 {
		return fmt.Errorf("linux datapath: MaxPendingTeardowns %d: want >= 0: %w", c.MaxPendingTeardowns, ErrInvalidConfig)
	}
	if n := len(c.GatewayDevice); n == 0 || n > 15 {
		return fmt.Errorf("linux datapath: GatewayDevice %q: want 1..15 bytes: %w", c.GatewayDevice, ErrInvalidConfig)
	}
	if !filepath.IsAbs(c.BPFFS) || filepath.Clean(c.BPFFS) == "/" {
		return fmt.Errorf("linux datapath: BPFFS %q: want an absolute path below /: %w", c.BPFFS, ErrInvalidConfig)
	}
	if err := c.CTGC.Validate(); err != nil {
		return err
	}
	if err := c.Maps.validate(); err != nil {
		return err
	}
	if err := c.Nodes.Validate(); err != nil {
		return err
	}
	for _, gw := range c.Gateways {
		if !gw.IsValid() {
			return fmt.Errorf("linux datapath: Gateways: invalid address: %w", ErrInvalidConfig)
		}
	}
	return nil
}

// hasFamily reports whether a gateway of IP version v (4 or 6) is
// configured.
func (c LinuxConfig) hasFamily(v int) bool {
	for _, gw := range c.Gateways {
		if (v == 4) == gw.Is4() {
			return true
		}
	}
	return false
}

// LinuxHooks connect the Linux datapath to the agent once the actor
// system runs.
type LinuxHooks struct {
	// Submit runs fn in the agent's datapath worker pool without waiting
	// (deferred teardowns). It must not block.
	Submit func(op string, fn func(ctx context.Context) error)
	// OnL7Access receives the L7 proxy's access records, from one
	// goroutine; it must not block.
	OnL7Access func(L7AccessEvent)
	// OnDrop receives the drop notifications of the endpoint programs. It
	// is called from the ring-buffer reader goroutine and must not block
	// (a slow OnDrop delays later notifications; the kernel discards
	// notifications while the ring is full, the counters still count).
	OnDrop func(DropEvent)
	// OnFlow receives the flow reports of the endpoint programs (one per
	// new connection, LinuxConfig.Flows), from the flow ring's reader
	// goroutine; it must not block (the kernel discards reports while the
	// ring is full and counts them, FlowStats).
	OnFlow func(FlowEvent)
	// Phase receives how long each step of a Realize or Remove took
	// (LinuxPhases); it must not block.
	Phase func(phase string, d time.Duration)
	// OnPinRepair hears each pin check that found pins missing (and
	// pinned them again, or says why not); it must not block.
	OnPinRepair func(PinRepair)
}

// The steps of Linux.Realize and Linux.Remove reported to LinuxHooks.Phase.
const (
	// PhaseHostSetup: the host veth's sysctls, routes and neighbours.
	PhaseHostSetup = "host-setup"
	// PhaseHostSysctls: the sysctls part of PhaseHostSetup (read, and
	// written where they differ, in the host netns).
	PhaseHostSysctls = "host-sysctls"
	// PhaseBPFMaps: opening the endpoint's policy maps: a filled slot's,
	// pinned, or a previous agent's (zero when a Prepare did).
	PhaseBPFMaps = "bpf-maps"
	// PhaseBPFPolicy: writing the policy map difference.
	PhaseBPFPolicy = "bpf-policy"
	// PhaseBPFLoad: writing the endpoint's entry (ID, identity) for its
	// host veth's ifindex in the per-node endpoints map. Nothing is
	// loaded per endpoint: the programs are loaded once per node.
	PhaseBPFLoad = "bpf-load"
	// PhaseBPFPrepare: a Prepare taking a filled slot and pinning its maps,
	// while the state is written (Preparer).
	PhaseBPFPrepare = "bpf-prepare"
	// PhaseBPFAttach: attaching them (TCX links or cls_bpf filters).
	PhaseBPFAttach = "bpf-attach"
	// PhaseRemove: a whole Remove on the caller's path.
	PhaseRemove = "remove"
	// PhaseRemoveBPF: the BPF part of PhaseRemove (the endpoint's map
	// entries, pins and conntrack entries; the detach is deferred).
	PhaseRemoveBPF = "remove-bpf"
	// PhaseRemoveTombstone: the host part of PhaseRemove: the routes,
	// the host veth set down and renamed to its tombstone (or deleted,
	// when the deferred deletions are full or TeardownDelay < 0).
	PhaseRemoveTombstone = "remove-tombstone"
	// PhaseRealize: a whole Realize in the datapath (the L7 proxy's
	// configuration, the host setup, the BPF steps and the waits between
	// them), without the worker pool's queue and the actor hops.
	PhaseRealize = "realize"
	// PhaseBPFClaim: a Realize waiting for the endpoint's Prepare to end.
	PhaseBPFClaim = "bpf-claim"
)

// LinuxPhases lists the phases in the order they run.
var LinuxPhases = []string{PhaseBPFPrepare, PhaseRealize, PhaseHostSetup, PhaseHostSysctls, PhaseBPFClaim, PhaseBPFMaps, PhaseBPFPolicy, PhaseBPFLoad, PhaseBPFAttach, PhaseRemove, PhaseRemoveBPF, PhaseRemoveTombstone}

// HostAddrChange is an address of the host netns added or removed
// (Linux.WatchHostAddrs).
type HostAddrChange struct {
	Addr    netip.Addr
	Deleted bool
}
