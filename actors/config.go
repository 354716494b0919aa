package actors

import (
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// EndpointConfig tunes the endpoint actors.
type EndpointConfig struct {
	// ProxyWaitTimeout bounds the wait for proxy acknowledgements of a
	// revision; the endpoint becomes ready without them after it.
	ProxyWaitTimeout time.Duration
	// DatapathTimeout bounds one datapath operation.
	DatapathTimeout time.Duration
	// RequestTimeout bounds an actor-to-actor request (IPAM, identity).
	RequestTimeout time.Duration
	// RetryMin and RetryMax bound the backoff between failed regenerations.
	RetryMin, RetryMax time.Duration
	// RestartBudget is how many panics within 10 s an endpoint actor
	// survives (restart, state rebuilt from the index) before it is stopped.
	RestartBudget int
}

// StateStore persists endpoint state (restore.Store). Both calls must not
// block: done is called once the change is durable.
type StateStore interface {
	Write(ep *endpoint.Endpoint, done func(error))
	Remove(id endpoint.ID, done func(error))
}

// Config configures the actor system.
type Config struct {
	// State persists endpoints; nil keeps them in memory only.
	State    StateStore
	IPAM     IPAMConfig
	Identity identity.LocalConfig
	// IdentityBackend, when set, makes identities cluster-wide: the
	// identity actor acquires and releases label sets through it (from
	// worker goroutines, never inside Receive) and binds the identities
	// its Watch reports. nil keeps the node-local allocator (standalone
	// mode, the simulator). The caller owns the backend: it closes it
	// after System.Stop.
	IdentityBackend identity.ClusterBackend
	// NoL7 refuses policies with L7 (toPorts[].rules.http) rules at
	// import: set when no proxy can enforce them (the Linux datapath
	// without --l7-proxy), so such a policy is a 400 at PUT instead of
	// endpoints failing to regenerate.
	NoL7 bool
	// NoDNSProxy refuses policies with toFQDNs or rules.dns at import:
	// set when no DNS proxy runs (--dns-proxy off).
	NoDNSProxy bool
	// NodeSelectorLabels gives every other node an identity of its own,
	// labelled reserved:remote-node and node:<key>=<value> for each of
	// its Node labels (--enable-node-selector-labels, Cilium's flag, off
	// by default): its addresses get that identity in the ipcache instead
	// of remote-node, and policies accept fromNodes/toNodes.
	NodeSelectorLabels bool
	// PolicySecretsNamespace is the one namespace whose Secrets a
	// headerMatches[].secret may name (--policy-secrets-namespace,
	// Kubernetes mode): a policy naming a Secret elsewhere is refused
	// (that part allows nothing) and the Secret is never read. "" (every
	// other mode) refuses every secret.
	PolicySecretsNamespace string
	// NodeLabels (--node-labels, Cilium's flag; the --labels syntax,
	// "[source:][!]regexp" matched at the start of the key, without
	// --labels' defaults) chooses the Node labels that make a node's
	// identity; nil keeps them all.
	NodeLabels *labels.Filter
	// ClusterIdentity tunes the calls to IdentityBackend.
	ClusterIdentity ClusterIdentityConfig
	Pool            PoolConfig
	Endpoint        EndpointConfig
	Policy          PolicyConfig
	// Events receives endpoint and identity events (nil: none).
	Events *events.Hub
	// Observer receives regeneration phase durations (nil: none).
	Observer Observer
	GC       GCConfig
	// NodesResync is how often the nodes actor syncs the remote nodes'
	// routes in full even when no source changed them (default 10 s): the
	// kernel deletes the routes through a link that goes down, and a node
	// whose underlay link comes back must route again without waiting for
	// a change.
	NodesResync time.Duration
	// HostAddrs are the host's own addresses besides the gateways (the
	// Linux datapath's host netns at start): the host identity in the
	// ipcache, so traffic the host sends from them is not world.
	HostAddrs []netip.Addr
}

// withDefaults fills zero fields.
func (c Config) withDefaults() Config {
	if c.IPAM.Expiry == 0 {
		c.IPAM.Expiry = 10 * time.Minute
	}
	e := &c.Endpoint
	e.ProxyWaitTimeout = orDefault(e.ProxyWaitTimeout, 5*time.Second)
	e.DatapathTimeout = orDefault(e.DatapathTimeout, 30*time.Second)
	e.RequestTimeout = orDefault(e.RequestTimeout, 10*time.Second)
	e.RetryMin = orDefault(e.RetryMin, 100*time.Millisecond)
	e.RetryMax = orDefault(e.RetryMax, 30*time.Second)
	if e.RestartBudget == 0 {
		e.RestartBudget = 5
	}
	if c.Pool.Workers == 0 {
		c.Pool.Workers = max(DefaultPoolWorkers, 2*runtime.GOMAXPROCS(0))
	}
	c.Pool.DefaultTimeout = orDefault(c.Pool.DefaultTimeout, 30*time.Second)
	c.GC.Interval = orDefault(c.GC.Interval, time.Minute)
	c.NodesResync = orDefault(c.NodesResync, 10*time.Second)
	ci := &c.ClusterIdentity
	ci.CallTimeout = orDefault(ci.CallTimeout, 10*time.Second)
	ci.RetryMin = orDefault(ci.RetryMin, 200*time.Millisecond)
	ci.RetryMax = orDefault(ci.RetryMax, 10*time.Second)
	ci.ReleaseDelay = orDefault(ci.ReleaseDelay, time.Second)
	ci.WaitMax = orDefault(ci.WaitMax, e.RequestTimeout/2)
	if ci.Attempts == 0 {
		ci.Attempts = 20
	}
	if ci.Workers == 0 {
		ci.Workers = 4
	}
	if ci.Queue == 0 {
		ci.Queue = 4096
	}
	if c.Policy.ImportStep == 0 {
		c.Policy.ImportStep = 1000
	}
	return c
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// gateways returns the gateway of each configured range and the host's
// addresses: the host in the ipcache.
func (c Config) gateways() []netip.Addr {
	out, _ := ipam.Gateways(c.IPAM.IPv4, c.IPAM.IPv6) // Validate checked the ranges
	for _, a := range c.HostAddrs {
		a = a.Unmap()
		// An address inside a pod range is an endpoint's to claim.
		if a.IsValid() && !slices.Contains(out, a) && !c.IPAM.IPv4.Contains(a) && !c.IPAM.IPv6.Contains(a) {
			out = append(out, a)
		}
	}
	return out
}

// podRanges returns the configured pod ranges.
func (c Config) podRanges() []netip.Prefix {
	var out []netip.Prefix
	for _, p := range []netip.Prefix{c.IPAM.IPv4, c.IPAM.IPv6} {
		if p.IsValid() {
			out = append(out, p)
		}
	}
	return out
}

// Validate names the bad field.
func (c Config) Validate() error {
	if err := c.IPAM.Validate(); err != nil {
		return err
	}
	if err := c.Identity.Validate(); err != nil {
		return fmt.Errorf("identity config: %w", err)
	}
	e := c.Endpoint
	for name, d := range map[string]time.Duration{"ProxyWaitTimeout": e.ProxyWaitTimeout, "DatapathTimeout": e.DatapathTimeout,
		"RequestTimeout": e.RequestTimeout, "RetryMin": e.RetryMin, "RetryMax": e.RetryMax} {
		if d < 0 {
			return fmt.Errorf("endpoint config: %s is negative: %w", name, ErrInvalidConfig)
		}
	}
	if err := c.ClusterIdentity.validate(); err != nil {
		return err
	}
	if c.Policy.ImportStep < 0 {
		return fmt.Errorf("policy config: ImportStep %d is negative: %w", c.Policy.ImportStep, ErrInvalidConfig)
	}
	if c.Pool.Workers < 0 || c.Pool.Workers > 1024 {
		return fmt.Errorf("pool config: Workers %d outside 1..1024: %w", c.Pool.Workers, ErrInvalidConfig)
	}
	return nil
}

// ClusterIdentityConfig tunes the identity actor's calls to a cluster
// identity backend (Config.IdentityBackend).
type ClusterIdentityConfig struct {
	// CallTimeout bounds one backend call (default 10 s).
	CallTimeout time.Duration
	// RetryMin and RetryMax bound the backoff between failed attempts to
	// acquire a label set (defaults 200 ms, 10 s).
	RetryMin, RetryMax time.Duration
	// Attempts bounds the identity actor's own retries of a label set
	// (default 20); the endpoints that want it retry on their own after.
	Attempts int
	// Workers is the number of goroutines calling the backend (default
	// 4); calls for one label set always run on the same one, in order.
	Workers int
	// Queue bounds the calls waiting per worker (default 4096); a full
	// queue fails the request, which is retried.
	Queue int
	// ReleaseDelay is how long the node keeps marking a label set used
	// in the store after its last local reference went (default 1 s;
	// negative: released at once). A burst of relabels then spends the
	// store's writes on the new label sets' Acquires first, and a label
	// set acquired again within the delay costs no Release at all. It
	// only delays the store's garbage collection of the identity.
	ReleaseDelay time.Duration
	// WaitMax bounds how long an Acquire waits for the store before it
	// is answered ErrIdentityStoreUnavailable (the attempt goes on; the
	// endpoint retries): default half the endpoints' RequestTimeout, so
	// that the caller hears why rather than a timeout.
	WaitMax time.Duration
}

func (c ClusterIdentityConfig) validate() error {
	for name, d := range map[string]time.Duration{"CallTimeout": c.CallTimeout, "RetryMin": c.RetryMin, "RetryMax": c.RetryMax} {
		if d < 0 {
			return fmt.Errorf("cluster identity config: %s is negative: %w", name, ErrInvalidConfig)
		}
	}
	switch {
	case c.Attempts < 0 || c.Attempts > 1000:
		return fmt.Errorf("cluster identity config: Attempts %d outside 1..1000: %w", c.Attempts, ErrInvalidConfig)
	case c.Workers < 0 || c.Workers > 64:
		return fmt.Errorf("cluster identity config: Workers %d outside 1..64: %w", c.Workers, ErrInvalidConfig)
	case c.Queue < 0 || c.Queue > 1<<20:
		return fmt.Errorf("cluster identity config: Queue %d outside 1..1048576: %w", c.Queue, ErrInvalidConfig)
	}
	return nil
}
