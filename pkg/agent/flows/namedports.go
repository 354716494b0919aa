package flows

import (
	"net/netip"
	"slices"
	"sync"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// portResolver resolves the port names of rules for explain as the
// policy actor compiled them: on ingress the local endpoint's own named
// ports; on egress the numbers the peer's identity gives the name (every
// pod with it, on this node or another), or, for a peer that is no pod
// (an address without an endpoint), every number any pod of the cluster
// gives it. It reads the index only when a rule with a named port is
// matched against the traffic, once per call of explain.
func (s *Store) portResolver(localIP, peerIP string, peerID uint32, dir policy.Direction) policy.PortResolver {
	ix := s.cfg.Index
	if dir == policy.Ingress {
		addr, err := netip.ParseAddr(localIP)
		if err != nil {
			return nil
		}
		ep, ok := ix.EndpointByIP(addr)
		if !ok {
			return nil
		}
		return func(name string, proto uint8) []uint16 {
			if n, ok := ep.NamedPorts.Lookup(name, proto); ok {
				return []uint16{n}
			}
			return nil
		}
	}
	pod := false
	if addr, err := netip.ParseAddr(peerIP); err == nil {
		addr = addr.Unmap()
		if _, ok := ix.EndpointByIP(addr); ok {
			pod = true
		} else if e, ok := ix.IPCacheEntryOf(netip.PrefixFrom(addr, addr.BitLen())); ok {
			pod = slices.ContainsFunc(e.Claims, func(c index.IPCacheClaim) bool { return c.Source == index.SourceRemote })
		}
	}
	var (
		once  sync.Once
		ports []policy.NamedPorts
	)
	return func(name string, proto uint8) []uint16 {
		once.Do(func() { ports = clusterPorts(ix, identity.NumericIdentity(peerID), pod) })
		var out []uint16
		for _, np := range ports {
			if n, ok := np.Lookup(name, proto); ok && !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
		return out
	}
}

// clusterPorts returns the named ports of every endpoint known here,
// this node's and the other nodes', of identity id (only when byID).
func clusterPorts(ix *index.Index, id identity.NumericIdentity, byID bool) []policy.NamedPorts {
	var out []policy.NamedPorts
	for _, ep := range ix.Endpoints(index.EndpointFilter{}) {
		if len(ep.NamedPorts) > 0 && (!byID || ep.Identity == id) {
			out = append(out, ep.NamedPorts)
		}
	}
	for _, e := range ix.IPCache() {
		for _, c := range e.Claims {
			if c.Source == index.SourceRemote && len(c.NamedPorts) > 0 && (!byID || c.Identity == id) {
				out = append(out, c.NamedPorts)
			}
		}
	}
	return out
}
