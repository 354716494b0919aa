package agent

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// hostFirewallPeers are the host firewall's safety-net peers
// (datapath.HostFirewallConfig.SafePeers): the API server URL the agent
// dials in Kubernetes mode (443 without a port) and the etcd endpoints
// in kvstore mode (2379 without a port), names resolved now.
func hostFirewallPeers(cfg *Config) ([]netip.AddrPort, error) {
	type peer struct {
		url string
		def uint16
	}
	var peers []peer
	if cfg.K8s != nil {
		u, err := cfg.K8s.APIServerURL()
		if err != nil {
			return nil, fmt.Errorf("host firewall: %w", err)
		}
		peers = append(peers, peer{u, 443})
	}
	if cfg.Kvstore != nil {
		for _, e := range cfg.Kvstore.Endpoints {
			peers = append(peers, peer{e, 2379})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []netip.AddrPort
	for _, p := range peers {
		s := p.url
		if !strings.Contains(s, "://") {
			s = "https://" + s
		}
		u, err := url.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("host firewall: peer %q: %w", p.url, err)
		}
		ps, err := resolvePeers(ctx, u.Hostname(), u.Port(), p.def)
		if err != nil {
			return nil, fmt.Errorf("host firewall: peer %q: %w", p.url, err)
		}
		out = append(out, ps...)
	}
	return out, nil
}

// resolvePeers resolves host (an address or a name) and port ("": def).
func resolvePeers(ctx context.Context, host, port string, def uint16) ([]netip.AddrPort, error) {
	p := def
	if port != "" {
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("port %q: %w", port, err)
		}
		p = uint16(n)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.AddrPort{netip.AddrPortFrom(a.Unmap(), p)}, nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", host, err)
	}
	out := make([]netip.AddrPort, len(addrs))
	for i, a := range addrs {
		out[i] = netip.AddrPortFrom(a.Unmap(), p)
	}
	return out, nil
}
