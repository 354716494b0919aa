package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// kvstoreMode is the agent's kvstore side (Config.Kvstore non-nil): the
// connection, this node's endpoints published, other nodes' mirrored.
type kvstoreMode struct {
	client *kvstore.Client
	// identities is the etcd identity backend the actor system uses (nil
	// when the caller passed its own in Actors.IdentityBackend).
	identities *kvstore.IdentityBackend
	pub        *kvstore.Publisher // nil until startKvstore
	mirror     *kvstore.Mirror    // nil until startKvstore
}

// connectKvstore connects to etcd (without waiting for it: the agent
// serves its existing endpoints while etcd is away); nil when cfg is nil.
// It runs before the actor system starts, which takes its identity
// backend.
func connectKvstore(cfg *kvstore.Config, log *slog.Logger) (*kvstoreMode, error) {
	if cfg == nil {
		return nil, nil
	}
	c, err := kvstore.Connect(*cfg, log)
	if err != nil {
		return nil, fmt.Errorf("kvstore: %w", err)
	}
	return &kvstoreMode{client: c}, nil
}

// startKvstore publishes this node and its endpoints from the index, and
// feeds the other nodes' endpoints into the ipcache and the other nodes
// to the datapath's routes, through the front door (source "kvstore").
func (a *Agent) startKvstore() error {
	k := a.kvstore
	var err error
	k.pub, err = kvstore.StartPublisher(k.client, kvstore.PublisherConfig{Addrs: a.cfg.NodeAddrs, PodCIDRs: a.podCIDRs(),
		Source: a.Index, Hub: a.events})
	if err != nil {
		return fmt.Errorf("kvstore: %w", err)
	}
	var sink kvstore.RemoteSink = a.System
	if a.cfg.KvstoreObserver != nil {
		sink = observedSink{RemoteSink: a.System, observe: a.cfg.KvstoreObserver}
	}
	k.mirror = kvstore.StartMirror(k.client, sink, a.System)
	a.Server.SetKvstore(k.status)
	return nil
}

// stop stops publishing and mirroring and closes the connection; the
// node's keys stay until its lease expires, so a restarting agent's pods
// do not flap on other nodes. Idempotent.
func (k *kvstoreMode) stop() {
	k.stopPublishing()
	k.close()
}

// stopPublishing stops the mirror and the publisher, if started.
func (k *kvstoreMode) stopPublishing() {
	if k.mirror != nil {
		k.mirror.Stop()
	}
	if k.pub != nil {
		k.pub.Stop()
	}
}

// close closes the identity backend on etcd, if any, and the connection.
func (k *kvstoreMode) close() {
	if k.identities != nil {
		_ = k.identities.Close()
	}
	_ = k.client.Close()
}

func (k *kvstoreMode) status() *models.KvstoreStatus {
	h, p, m := k.client.Health(), k.pub.Stats(), k.mirror.Stats()
	st := &models.KvstoreStatus{Backend: "etcd", Endpoints: k.client.Endpoints(), Node: k.client.NodeName(),
		Healthy: h.Healthy, Since: h.Since, LastError: h.LastError, Lease: h.Lease, LeaseRegrants: h.Regrants, LeaseKept: h.Kept,
		Synced: m.Synced, Published: p.Published, RemoteEndpoints: m.RemoteEndpoints, RemoteNodes: m.RemoteNodes,
		Behind: m.Backlog.Behind >= kvstore.BehindThreshold, RemotePending: m.Backlog.Pending,
		RemoteBehindSeconds: m.Backlog.Behind.Seconds(), RemoteMaxBehindSeconds: m.Backlog.MaxBehind.Seconds()}
	for _, e := range []string{p.LastError, m.LastError} {
		if st.LastError == "" {
			st.LastError = e
		}
	}
	return st
}

var (
	_ kvstore.RemoteSink = (*actors.System)(nil)
	_ kvstore.NodeSink   = (*actors.System)(nil)
)

// podCIDRs are this node's pod ranges (the IPAM ranges).
func (a *Agent) podCIDRs() []netip.Prefix {
	var out []netip.Prefix
	for _, p := range []netip.Prefix{a.cfg.IPv4Range, a.cfg.IPv6Range} {
		if p.IsValid() {
			out = append(out, p)
		}
	}
	return out
}

// observedSink tells Config.KvstoreObserver of what the ipcache took.
type observedSink struct {
	kvstore.RemoteSink
	observe func(eps []endpoint.Remote)
}

func (o observedSink) ReplaceRemoteEndpoints(ctx context.Context, source string, eps []endpoint.Remote) error {
	err := o.RemoteSink.ReplaceRemoteEndpoints(ctx, source, eps)
	if err == nil {
		o.observe(eps)
	}
	return err
}

func (o observedSink) ChangeRemoteEndpoints(ctx context.Context, source string, ups []endpoint.Remote, dels []netip.Addr) error {
	err := o.RemoteSink.ChangeRemoteEndpoints(ctx, source, ups, dels)
	if err == nil && len(ups) > 0 {
		o.observe(ups)
	}
	return err
}

// deriveNodeAddrs finds the addresses this node publishes in kvstore mode
// when --kvstore-node-addrs gives none, as Cilium does: the Node object's
// InternalIPs in Kubernetes mode, else the node's addresses by its default
// routes or, for a family without one, the source the kernel picks toward
// the kvstore's endpoints. Without any it fails: other nodes could not
// route to this one's pods.
func (a *Agent) deriveNodeAddrs(linux *datapath.Linux) error {
	cfg := &a.cfg
	if cfg.Kvstore == nil || len(cfg.NodeAddrs) > 0 {
		return nil
	}
	if cfg.K8s != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		addrs, err := k8s.NodeInternalIPs(ctx, *cfg.K8s)
		cancel()
		if err == nil && len(addrs) > 0 {
			cfg.NodeAddrs = addrs
			a.log.Info("node addresses from the Node object", "addrs", addrs)
			return nil
		}
		a.log.Warn("no node address from the Node object; using the default routes'", "err", err)
	}
	var toward []netip.Addr
	for _, e := range cfg.Kvstore.Endpoints {
		if u, err := url.Parse(e); err == nil {
			if ip, err := netip.ParseAddr(u.Hostname()); err == nil {
				toward = append(toward, ip.Unmap())
			}
		}
	}
	addrs, err := linux.NodeAddrs(toward)
	if err != nil {
		return fmt.Errorf("kvstore: %w", err)
	}
	if len(addrs) == 0 {
		return fmt.Errorf("kvstore: no node address: no default route and no route toward the kvstore endpoints; set --kvstore-node-addrs: %w", ErrInvalidConfig)
	}
	cfg.NodeAddrs = addrs
	a.log.Info("node addresses from the default routes", "addrs", addrs)
	return nil
}

// KvstoreBacklog is the kvstore mirror's backlog: the other nodes'
// endpoint changes received and not yet in the ipcache (false: not in
// kvstore mode, or not started).
func (a *Agent) KvstoreBacklog() (kvstore.Backlog, bool) {
	if a.kvstore == nil || a.kvstore.mirror == nil {
		return kvstore.Backlog{}, false
	}
	return a.kvstore.mirror.Stats().Backlog, true
}
