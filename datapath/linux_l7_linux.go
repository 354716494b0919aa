package datapath

import (
	"errors"
	"os"
	"slices"
	"strconv"

	"context"
	"fmt"
	"maps"
	"net/netip"
	"os/exec"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/datapath/l7proxy"
	"github.com/membrane-cni/membrane/datapath/l7proxy/xdsapi"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// ProxyName is the name of the L7 proxy in Realized.ProxyWaits.
const ProxyName = "membrane-proxy"

// linuxL7 is the Linux datapath's L7 proxy state: the xDS server, the
// version tracker and the supervised proxy process (nil srv: L7 off).
type linuxL7 struct {
	mu      sync.Mutex
	ack     ProxyAckFunc
	nack    ProxyNackFunc
	srv     *l7proxy.Server
	access  *l7proxy.AccessServer
	tracker *l7proxy.Tracker
	sup     *l7proxy.Supervisor
	stop    context.CancelFunc
	done    chan struct{}
	ipcache l7IPCache
	// ipcachePublished counts the mirror's publications by ipcacheL7
	// (one per batch of changes; tests).
	ipcachePublished int
	// ipcacheShardsSent counts the shards those publications sent (tests).
	ipcacheShardsSent int
	withL7            map[endpoint.ID]bool // endpoints whose proxy configuration is published
	// secrets are the header secrets' values (SetPolicySecrets), kept
	// for a proxy configured later; never logged. The proxy gets only
	// those a published endpoint's rules name (secretRefs).
	secrets map[string]string
	// secretRefs are the secrets ("ns/name") each published endpoint's
	// L7 rules name; sentSecrets what the proxy was last sent.
	secretRefs  map[endpoint.ID][]string
	sentSecrets map[string]string
}

// l7SecretRefs returns the secrets ("ns/name") entries' header matches
// name, sorted, without repeats.
func l7SecretRefs(entries []policy.L7Entry) []string {
	var out []string
	for _, e := range entries {
		for _, h := range e.HTTP {
			for _, m := range h.HeaderMatches {
				if m.Secret != nil {
					out = append(out, m.Secret.Key())
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// publishSecretsLocked sends the proxy the values of the secrets the
// published endpoints name, when that set of values changed (l7.mu held).
// A Secret of the namespace no rule names never reaches the proxy.
func (l *Linux) publishSecretsLocked() error {
	if l.l7.srv == nil {
		return nil
	}
	want := map[string]string{}
	for _, refs := range l.l7.secretRefs {
		for _, k := range refs {
			if v, ok := l.l7.secrets[k]; ok {
				want[k] = v
			}
		}
	}
	if l.l7.sentSecrets != nil && maps.Equal(want, l.l7.sentSecrets) {
		return nil
	}
	if _, err := l.l7.srv.SetSecrets(l7proxy.Secrets{Values: want}); err != nil {
		return err
	}
	l.l7.sentSecrets = want
	return nil
}

// SetPolicySecrets publishes the values of the header secrets policies
// may name ("ns/name" to the value; the Kubernetes watcher's Secrets of
// --policy-secrets-namespace) to the L7 proxy, apart from the endpoints'
// rules: a change reaches the proxy without regenerating an endpoint.
func (l *Linux) SetPolicySecrets(values map[string]string) {
	l.l7.mu.Lock()
	defer l.l7.mu.Unlock()
	l.l7.secrets = maps.Clone(values)
	if err := l.publishSecretsLocked(); err != nil {
		l.log.Warn("publish the policy secrets to the L7 proxy", "secrets", len(values), "err", err)
	}
}

// SetProxyAck implements Datapath: the proxy's acknowledgements of the
// versions endpoints wait for are delivered through fn.
func (l *Linux) SetProxyAck(fn ProxyAckFunc) {
	l.l7.mu.Lock()
	l.l7.ack = fn
	l.l7.mu.Unlock()
}

// SetProxyNack implements ProxyNacker.
func (l *Linux) SetProxyNack(fn ProxyNackFunc) {
	l.l7.mu.Lock()
	l.l7.nack = fn
	l.l7.mu.Unlock()
}

// initL7 starts the xDS server and the proxy process (once) when
// LinuxConfig.L7 names a proxy executable.
func (l *Linux) initL7() error {
	c := l.cfg.L7
	if c.ProxyPath == "" {
		return nil
	}
	l.l7.mu.Lock()
	defer l.l7.mu.Unlock()
	if l.l7.srv != nil {
		return nil
	}
	l.l7.tracker = l7proxy.NewTracker(l.proxyAcked, l.proxyNacked)
	srv, err := l7proxy.NewServer(c.XDSSocket, l.l7.tracker, l.log.With("component", "xds"))
	if err != nil {
		return fmt.Errorf("l7 proxy: %w", err)
	}
	if err := l.proxyRoute(); err != nil {
		srv.Close()
		return fmt.Errorf("l7 proxy: %w", err)
	}
	access, err := l7proxy.NewAccessServer(c.AccessSocket, l.onL7Access, l.log.With("component", "l7-access"))
	if err != nil {
		srv.Close()
		return fmt.Errorf("l7 proxy: %w", err)
	}
	l.l7.srv, l.l7.access, l.l7.ipcache, l.l7.withL7 = srv, access, newL7IPCache(), map[endpoint.ID]bool{}
	// The gateways are the host (initBPF put them in the ipcache before
	// the proxy's mirror existed).
	for _, gw := range l.cfg.Gateways {
		l.l7.ipcache.set(netip.PrefixFrom(gw, gw.BitLen()), identity.ReservedHost)
	}
	_, err = srv.SetIPCacheShards(l.l7.ipcache.publish(true)...)
	if err == nil {
		l.l7.secretRefs, l.l7.sentSecrets = map[endpoint.ID][]string{}, nil
		err = l.publishSecretsLocked()
	}
	if err != nil {
		srv.Close()
		access.Close()
		l.l7.srv, l.l7.access = nil, nil
		return fmt.Errorf("l7 proxy: %w", err)
	}
	// nsenter (below) execs the proxy: the agent stays its parent.
	path, args := c.ProxyPath, append([]string{"--xds", c.XDSSocket, "--listen", c.Listen, "--kafka-listen", c.KafkaListen, "--access-log", c.AccessSocket,
		"--parent-pid", strconv.Itoa(os.Getpid())}, c.ProxyArgs...)
	if l.cfg.HostNetns != "" {
		// The proxy runs in the host netns the datapath manages.
		nsenter, err := exec.LookPath("nsenter")
		if err != nil {
			srv.Close()
			access.Close()
			l.l7.srv, l.l7.access = nil, nil
			return fmt.Errorf("l7 proxy in netns %s: %w", l.cfg.HostNetns, err)
		}
		path, args = nsenter, append([]string{"--net=" + l.cfg.HostNetns, "--", c.ProxyPath}, args...)
	}
	l.l7.sup = &l7proxy.Supervisor{Path: path, Args: args,
		MinBackoff: c.MinBackoff, MaxBackoff: c.MaxBackoff, StableAfter: c.StableAfter, Log: l.log.With("component", "proxy-supervisor")}
	// Only the process the supervisor runs may subscribe (nsenter execs
	// the proxy in its own PID): another process cannot take the
	// streams or acknowledge a version the proxy never applied.
	sup := l.l7.sup
	srv.SetPeerCheck(func(cred *unix.Ucred) bool {
		return l7proxy.SameUser(cred) && cred.Pid != 0 && int(cred.Pid) == sup.Status().PID
	})
	ctx, cancel := context.WithCancel(context.Background())
	l.l7.stop, l.l7.done = cancel, make(chan struct{})
	go func() {
		defer close(l.l7.done)
		_ = l.l7.sup.Run(ctx)
	}()
	return nil
}

func (l *Linux) closeL7() {
	l.l7.mu.Lock()
	stop, done, srv, access := l.l7.stop, l.l7.done, l.l7.srv, l.l7.access
	l.l7.stop, l.l7.srv, l.l7.access = nil, nil, nil
	l.l7.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
	if srv != nil {
		srv.Close()
	}
	if access != nil {
		access.Close()
	}
}

// onL7Access hands an access record to LinuxHooks.OnL7Access.
func (l *Linux) onL7Access(r l7proxy.AccessRecord) {
	l.mu.Lock()
	fn := l.hooks.OnL7Access
	l.mu.Unlock()
	if fn != nil {
		fn(r)
	}
}

func (l *Linux) proxyAcked(ep, rev uint64) {
	l.l7.mu.Lock()
	fn := l.l7.ack
	l.l7.mu.Unlock()
	if fn != nil {
		fn(endpoint.ID(ep), rev, ProxyName)
	}
}

func (l *Linux) proxyNacked(ep, rev uint64, reason string) {
	l.l7.mu.Lock()
	fn := l.l7.nack
	l.l7.mu.Unlock()
	if fn != nil {
		fn(endpoint.ID(ep), rev, ProxyName, reason)
	}
}

// realizeL7 publishes ep's L7 configuration when its policy has L7
// entries (or had: then it is withdrawn) and reports the wait for the
// proxy's acknowledgement of that version.
func (l *Linux) realizeL7(ep *endpoint.Endpoint, rev uint64) (Realized, error) {
	l.l7.mu.Lock()
	srv, tracker := l.l7.srv, l.l7.tracker
	had := l.l7.withL7[ep.ID]
	l.l7.mu.Unlock()
	has := ep.Policy.HasL7()
	if !has && !had {
		return Realized{}, nil
	}
	if srv == nil {
		return Realized{}, fmt.Errorf("endpoint %d: policy has L7 rules but no L7 proxy is configured (--l7-proxy): %w", ep.ID, ErrNotSupported)
	}
	var doc *l7proxy.EndpointPolicy
	var refs []string
	if has {
		doc = &l7proxy.EndpointPolicy{ID: uint64(ep.ID), IPs: endpointIPs(ep), L7: ep.Policy.L7}
		refs = l7SecretRefs(ep.Policy.L7)
	}
	if len(refs) > 0 {
		// The secrets the rules name first: the endpoint's version holds them.
		l.l7.mu.Lock()
		l.l7.secretRefs[ep.ID] = refs
		err := l.publishSecretsLocked()
		l.l7.mu.Unlock()
		if err != nil {
			return Realized{}, err
		}
	}
	v, err := srv.SetEndpoint(uint64(ep.ID), doc)
	if err != nil {
		return Realized{}, err
	}
	l.l7.mu.Lock()
	if has {
		l.l7.withL7[ep.ID] = true
	} else {
		delete(l.l7.withL7, ep.ID)
	}
	if len(refs) == 0 && l.l7.secretRefs[ep.ID] != nil {
		delete(l.l7.secretRefs, ep.ID)
		if err := l.publishSecretsLocked(); err != nil {
			l.log.Warn("publish the policy secrets to the L7 proxy", "err", err)
		}
	}
	l.l7.mu.Unlock()
	wait, err := tracker.Wait(uint64(ep.ID), rev, v)
	if err != nil || !wait {
		return Realized{}, err
	}
	return Realized{ProxyWaits: []string{ProxyName}}, nil
}

// removeL7 withdraws ep's configuration and drops its waits.
func (l *Linux) removeL7(id endpoint.ID) {
	l.l7.mu.Lock()
	srv, tracker, had := l.l7.srv, l.l7.tracker, l.l7.withL7[id]
	delete(l.l7.withL7, id)
	l.l7.mu.Unlock()
	if srv == nil {
		return
	}
	tracker.Forget(uint64(id))
	if had {
		if _, err := srv.SetEndpoint(uint64(id), nil); err != nil {
			l.log.Warn("withdraw endpoint from the L7 proxy", "endpoint", id, "err", err)
		}
	}
	l.l7.mu.Lock()
	defer l.l7.mu.Unlock()
	if l.l7.secretRefs[id] != nil {
		delete(l.l7.secretRefs, id)
		if err := l.publishSecretsLocked(); err != nil {
			l.log.Warn("publish the policy secrets to the L7 proxy", "err", err)
		}
	}
}

// ipcacheL7 mirrors a batch of ipcache changes to the proxy: one
// publication of the whole mirror per batch (each one encodes every
// entry), under the lock, so that versions follow the order of the
// batches.
func (l *Linux) ipcacheL7(changes []IPCacheChange) {
	if len(changes) == 0 {
		return
	}
	l.l7.mu.Lock()
	defer l.l7.mu.Unlock()
	if l.l7.srv == nil {
		return
	}
	for _, c := range changes {
		if c.Delete {
			l.l7.ipcache.delete(c.Prefix)
		} else {
			l.l7.ipcache.set(c.Prefix, c.Value.Identity)
		}
	}
	l.l7.ipcachePublished++
	shards := l.l7.ipcache.publish(false)
	l.l7.ipcacheShardsSent += len(shards)
	if _, err := l.l7.srv.SetIPCacheShards(shards...); err != nil {
		l.log.Warn("publish ipcache to the L7 proxy", "err", err)
	}
}

// replaceIPCacheL7 makes desired the proxy's whole ipcache mirror and
// publishes it once (SyncIPCache: the ipcache actor's full set).
func (l *Linux) replaceIPCacheL7(desired map[netip.Prefix]IPCacheValue) {
	l.l7.mu.Lock()
	defer l.l7.mu.Unlock()
	if l.l7.srv == nil {
		return
	}
	l.l7.ipcache = newL7IPCache()
	for _, gw := range l.cfg.Gateways { // as at start; desired holds them too when the actor knows them
		l.l7.ipcache.set(netip.PrefixFrom(gw, gw.BitLen()), identity.ReservedHost)
	}
	for p, v := range desired {
		l.l7.ipcache.set(p, v.Identity)
	}
	if _, err := l.l7.srv.SetIPCacheShards(l.l7.ipcache.publish(true)...); err != nil {
		l.log.Warn("publish ipcache to the L7 proxy", "err", err)
	}
}

// L7Status returns the L7 proxy's state, or nil when L7 is off.
func (l *Linux) L7Status() *L7Status {
	l.l7.mu.Lock()
	defer l.l7.mu.Unlock()
	if l.l7.srv == nil {
		return nil
	}
	return &L7Status{Process: l.l7.sup.Status(), Version: l.l7.srv.Version(), Acks: l.l7.tracker.Status(),
		Port: l.proxyPorts()[policy.ParserHTTP]}
}

// Proxy redirect routing: packets the endpoint programs hand to a
// proxy's socket (bpf_sk_assign) carry MARK_TO_PROXY_MAGIC in the low
// byte of their mark (bpf/endpoint.h); this rule sends them to a table
// whose default route is local, so the host delivers them to the
// assigned socket whatever their destination (as Cilium's table 2004).
const (
	markToProxy       = 0x4f
	markMagicMask     = 0xff
	proxyRouteTable   = 2040
	proxyRulePriority = 90
)

// proxyPorts is the listening port of each L7 proxy the datapath runs
// (policy.ProxyPorts): the BPF programs redirect an entry's traffic to
// the port of its parser. None when L7 is off.
func (l *Linux) proxyPorts() policy.ProxyPorts {
	ports := policy.ProxyPorts{}
	if l.cfg.L7.ProxyPath != "" {
		ports[policy.ParserHTTP] = netip.MustParseAddrPort(l.cfg.L7.Listen).Port()
		ports[policy.ParserKafka] = netip.MustParseAddrPort(l.cfg.L7.KafkaListen).Port()
	}
	if l.cfg.DNSProxyPort != 0 {
		ports[policy.ParserDNS] = l.cfg.DNSProxyPort
	}
	return ports
}

// proxyRoute installs (idempotently) the rule and local routes of the
// redirect in the host netns, brings lo up (the proxies listen on the
// loopback address) and turns early demultiplexing off there.
//
// Early demux would break ingress redirects: the proxy's socket of a
// redirected connection has the tuple of the client's packets, so the
// host's IP input would attach them to it (skb->sk) on the interface
// they arrive by, before any endpoint program ran, and then route them
// towards the endpoint, which drops a packet with a socket (ip_forward).
// Without it, every packet reaches the destination's to_container,
// whose verdict hairpins it to the proxy's socket.
func (l *Linux) proxyRoute() error {
	if err := l.inHost(func() error { return ensureSysctl("/proc/sys/net/ipv4/ip_early_demux", "0") }); err != nil {
		return fmt.Errorf("proxy route: %w", err)
	}
	lo, err := l.nl.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("proxy route: %w", err)
	}
	if err := l.nl.LinkSetUp(lo); err != nil {
		return fmt.Errorf("proxy route: set lo up: %w", err)
	}
	for _, dst := range []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")} {
		r := &netlink.Route{LinkIndex: lo.Attrs().Index, Dst: prefixNet(dst), Type: unix.RTN_LOCAL,
			Table: proxyRouteTable, Scope: netlink.SCOPE_HOST}
		if err := l.nl.RouteReplace(r); err != nil {
			return fmt.Errorf("proxy route: local %s table %d: %w", dst, proxyRouteTable, err)
		}
		rule := netlink.NewRule()
		rule.Family = unix.AF_INET
		if dst.Addr().Is6() {
			rule.Family = unix.AF_INET6
		}
		mask := uint32(markMagicMask)
		rule.Mark, rule.Mask, rule.Table, rule.Priority = markToProxy, &mask, proxyRouteTable, proxyRulePriority
		if err := l.nl.RuleAdd(rule); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("proxy route: rule fwmark %#x/%#x: %w", markToProxy, markMagicMask, err)
		}
	}
	return nil
}

// l7IPCache is the proxy's ipcache mirror by xDS shard
// (xdsapi.IPCacheShardOf), with the shards changed since the last
// publication.
type l7IPCache struct {
	shards [xdsapi.IPCacheShards]map[netip.Prefix]identity.NumericIdentity
	dirty  [xdsapi.IPCacheShards]bool
}

func newL7IPCache() l7IPCache {
	var c l7IPCache
	for k := range c.shards {
		c.shards[k] = map[netip.Prefix]identity.NumericIdentity{}
	}
	return c
}

func (c *l7IPCache) set(p netip.Prefix, id identity.NumericIdentity) {
	k := xdsapi.IPCacheShardOf(p)
	if old, ok := c.shards[k][p]; !ok || old != id {
		c.shards[k][p], c.dirty[k] = id, true
	}
}

func (c *l7IPCache) delete(p netip.Prefix) {
	k := xdsapi.IPCacheShardOf(p)
	if _, ok := c.shards[k][p]; ok {
		delete(c.shards[k], p)
		c.dirty[k] = true
	}
}

func (c *l7IPCache) get(p netip.Prefix) (identity.NumericIdentity, bool) {
	id, ok := c.shards[xdsapi.IPCacheShardOf(p)][p]
	return id, ok
}

// all returns a copy of the whole mirror.
func (c *l7IPCache) all() map[netip.Prefix]identity.NumericIdentity {
	out := map[netip.Prefix]identity.NumericIdentity{}
	for _, s := range c.shards {
		maps.Copy(out, s)
	}
	return out
}

// publish returns copies of the shards changed since the last call
// (every shard with all) and marks them published.
func (c *l7IPCache) publish(all bool) []l7proxy.IPCache {
	var out []l7proxy.IPCache
	for k := range c.shards {
		if all || c.dirty[k] {
			out = append(out, l7proxy.IPCache{Shard: k, Entries: maps.Clone(c.shards[k])})
			c.dirty[k] = false
		}
	}
	return out
}
