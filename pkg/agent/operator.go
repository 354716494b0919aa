package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"unicode/utf8"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/agent/metrics"
	"github.com/membrane-cni/membrane/pkg/clients/cni/delqueue"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
)

// validateListeners checks the listeners' caps and the HTTP listener's
// allowed hosts.
func (c *Config) validateListeners() error {
	switch {
	case c.API.MaxConns < 0:
		return fmt.Errorf("--max-connections: %d: must not be negative: %w", c.API.MaxConns, ErrInvalidConfig)
	case c.API.MaxHTTPConns < 0:
		return fmt.Errorf("--http-max-connections: %d: must not be negative: %w", c.API.MaxHTTPConns, ErrInvalidConfig)
	}
	for _, h := range c.API.AllowedHosts {
		if _, err := netip.ParseAddr(h); err == nil {
			continue
		}
		if h == "" || strings.ContainsAny(h, " \t/:@[]") || !utf8.ValidString(h) {
			return fmt.Errorf("--http-allowed-hosts: %q: want host names or addresses without port, or \"*\": %w", h, ErrInvalidConfig)
		}
	}
	return nil
}

// startHTTP opens the read-only TCP listener (Config.HTTPAddr): reads,
// /metrics and, with API.Pprof, /debug/pprof; mutating requests are
// refused there (403). Returns nil when HTTPAddr is empty.
func (a *Agent) startHTTP() error {
	if a.cfg.HTTPAddr == "" {
		return nil
	}
	l, err := net.Listen("tcp", a.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("--http-addr: listen %s: %w", a.cfg.HTTPAddr, err)
	}
	a.httpLis = l
	srv, limited := a.Server.ReadOnlyServer(l)
	a.httpSrv = srv
	a.httpServed = make(chan error, 1)
	go func() {
		err := a.httpSrv.Serve(limited)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		a.httpServed <- err
	}()
	a.log.Info("read-only HTTP listener", "addr", l.Addr().String(), "pprof", a.cfg.API.Pprof)
	return nil
}

// stopHTTP shuts the TCP listener down (after the API server, which ends
// the event streams).
func (a *Agent) stopHTTP(ctx context.Context) error {
	if a.httpSrv == nil {
		return nil
	}
	err := a.httpSrv.Shutdown(ctx)
	if serr := <-a.httpServed; serr != nil && err == nil {
		err = serr
	}
	return err
}

// HTTPAddr returns the address the read-only TCP listener is bound to
// ("" when disabled); useful with Config.HTTPAddr "127.0.0.1:0".
func (a *Agent) HTTPAddr() string {
	if a.httpLis == nil {
		return ""
	}
	return a.httpLis.Addr().String()
}

// Metrics returns the agent's metrics.
func (a *Agent) Metrics() *metrics.Metrics { return a.Server.Metrics() }

// sample reads what the scrape-time gauges show, from the index and the
// actor registry (no mailbox is asked).
func (a *Agent) sample() metrics.Sample {
	_, byState := a.Index.CountEndpoints()
	smp := metrics.Sample{EndpointsByState: make(map[string]int, len(byState)), IPAM: map[string]metrics.IPAMSample{},
		Identities: len(a.Index.Identities()), DeleteQueue: -1}
	c := a.System.Counters()
	smp.ProxyWaitTimeouts, smp.ProxyRejects = c.ProxyTimeouts, c.ProxyRejects
	smp.RemoteClaimsRefused = map[string]map[string]uint64{}
	if a.k8s != nil {
		smp.RemoteClaimsRefused[k8s.RemoteSource] = a.k8s.RefusedRemoteClaims()
	}
	if a.kvstore != nil && a.kvstore.mirror != nil {
		st := a.kvstore.mirror.Stats()
		smp.RemoteClaimsRefused[kvstore.Source] = st.Refused
		smp.RemoteBacklog = map[string]metrics.RemoteBacklogSample{kvstore.Source: {Pending: st.Backlog.Pending,
			BehindSeconds: st.Backlog.Behind.Seconds(), Coalesced: st.Backlog.Coalesced}}
	}
	// The other nodes' health endpoint addresses refused by the nodes
	// actor, under the node source's name.
	for src, n := range c.NodeHealthRefused {
		if smp.RemoteClaimsRefused[src] == nil {
			smp.RemoteClaimsRefused[src] = map[string]uint64{}
		}
		smp.RemoteClaimsRefused[src][endpoint.RefusedHealthOutsideNode] += n
	}
	for st, n := range byState {
		smp.EndpointsByState[string(st)] = n
	}
	if dp, ok := a.System.Datapath.(*datapath.Linux); ok {
		smp.MapFull = dp.MapFull()
		td := dp.Teardowns()
		smp.Teardowns = metrics.TeardownSample{Pending: td.Pending, Max: td.Max, Sync: td.Sync}
		if use, err := dp.MapUsage(); err == nil {
			smp.MapEntries, smp.MapMaxEntries = map[string]int{}, map[string]int{}
			for name, u := range use {
				smp.MapEntries[name], smp.MapMaxEntries[name] = u.Entries, u.MaxEntries
			}
		}
	}
	smp.MailboxDepth, smp.MailboxDepthMax = a.System.Registry().MailboxByKind()
	for fam, size := range a.poolSizes {
		used := len(a.Index.IPs(string(fam)))
		smp.IPAM[string(fam)] = metrics.IPAMSample{Used: used, Free: size - used}
	}
	if dir := a.cfg.DeleteQueueDir; dir != "" {
		if files, err := delqueue.List(dir); err == nil {
			smp.DeleteQueue = len(files)
		}
	}
	return smp
}

// poolSizesOf returns the number of allocatable addresses per family.
func poolSizesOf(cfg *Config) map[ipam.Family]int {
	out := map[ipam.Family]int{}
	for fam, p := range map[ipam.Family]netip.Prefix{ipam.IPv4: cfg.IPv4Range, ipam.IPv6: cfg.IPv6Range} {
		if !p.IsValid() {
			continue
		}
		if r, err := ipam.NewRange(p, ipam.Sequential, nil); err == nil {
			out[fam] = r.Size()
		}
	}
	return out
}

// Socket returns the API's unix socket path.
func (a *Agent) Socket() string { return a.cfg.Socket }
