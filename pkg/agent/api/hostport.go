package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/service"
)

// HostPortSource is the service table source of the pods' hostPorts:
// one HostPort service per mapping and node address (or the mapping's
// host address), whose one backend is the pod. The set is derived from
// the endpoints (Endpoint.HostPorts, restored with them) and replaced
// whole by SyncHostPorts.
const HostPortSource = "hostport"

// acceptHostPorts validates an attach's port mappings into spec.HostPorts
// and refuses a mapping another endpoint's overlaps (409). With
// mappings, it returns with the host port lock held until unlock, so
// that two attaches cannot take one port. Without kube-proxy replacement
// the agent does not translate hostPorts (the conflist chains portmap,
// which gets them instead): mappings are refused.
func (s *Server) acceptHostPorts(req *models.AttachRequest, spec *endpoint.Endpoint) (unlock func(), err error) {
	if len(req.PortMappings) == 0 {
		return func() {}, nil
	}
	if !s.cfg.HostPorts {
		return nil, badRequest("field \"port-mappings\": hostPorts are translated by the agent only with --kube-proxy-replacement; chain the portmap plugin instead")
	}
	for i, pm := range req.PortMappings {
		h, err := hostPortOf(pm)
		if err != nil {
			return nil, badRequest(fmt.Sprintf("field \"port-mappings\"[%d]: %v", i, err))
		}
		if h.HostIP.IsValid() && !h.HostIP.IsLoopback() && !s.hasNodeAddr(h.HostIP) {
			return nil, &apiError{http.StatusBadRequest, CodeInvalidAddress, fmt.Sprintf("field \"port-mappings\"[%d]: host-ip %s is not an address of this node", i, h.HostIP)}
		}
		for _, o := range spec.HostPorts {
			if o.Overlaps(h) {
				return nil, badRequest(fmt.Sprintf("field \"port-mappings\"[%d]: %s overlaps %s", i, h, o))
			}
		}
		spec.HostPorts = append(spec.HostPorts, h)
	}
	s.hostPortMu.Lock()
	for _, ep := range s.ix.Endpoints(index.EndpointFilter{}) {
		if ep.ContainerID == req.ContainerID && ep.ContainerInterfaceName == req.ContainerInterfaceName {
			continue // this attachment's earlier endpoint, which the attach replaces
		}
		for _, o := range ep.HostPorts {
			for _, h := range spec.HostPorts {
				if o.Overlaps(h) {
					s.hostPortMu.Unlock()
					return nil, &apiError{http.StatusConflict, CodeConflict, fmt.Sprintf("hostPort %s: taken by endpoint %d (pod %s/%s, %s)", h, ep.ID, ep.Namespace, ep.PodName, o)}
				}
			}
		}
	}
	return s.hostPortMu.Unlock, nil
}

// hostPortOf converts and validates one mapping.
func hostPortOf(pm models.PortMapping) (service.HostPort, error) {
	if pm.HostPort < 1 || pm.HostPort > 65535 || pm.ContainerPort < 1 || pm.ContainerPort > 65535 {
		return service.HostPort{}, fmt.Errorf("host-port %d, container-port %d: want 1..65535", pm.HostPort, pm.ContainerPort)
	}
	proto, err := service.ParseProto(pm.Protocol)
	if err != nil || pm.Protocol != strings.ToLower(pm.Protocol) {
		return service.HostPort{}, fmt.Errorf("protocol %q: want tcp or udp", pm.Protocol)
	}
	h := service.HostPort{Port: uint16(pm.HostPort), ContainerPort: uint16(pm.ContainerPort), Proto: proto}
	if pm.HostIP != "" {
		if h.HostIP, err = netip.ParseAddr(pm.HostIP); err != nil {
			return service.HostPort{}, fmt.Errorf("host-ip %q: %v", pm.HostIP, err)
		}
		if h.HostIP.IsUnspecified() {
			h.HostIP = netip.Addr{} // 0.0.0.0 or ::, as Kubernetes means it: every node address
		}
	}
	if err := h.Validate(); err != nil {
		return service.HostPort{}, err
	}
	return h, nil
}

func (s *Server) hasNodeAddr(ip netip.Addr) bool {
	return slices.Contains(s.nodeAddrList(), ip)
}

// nodeAddrList returns the node's current addresses.
func (s *Server) nodeAddrList() []netip.Addr {
	s.nodeAddrMu.Lock()
	defer s.nodeAddrMu.Unlock()
	return slices.Clone(s.nodeAddrs)
}

// NodeAddrChanged follows the node's addresses (the agent's host
// address watcher calls it): a global unicast address added or removed
// changes the addresses hostPorts without a host-ip are on, and asks
// for a resync of the hostPort services (HostPortKick). Other addresses
// are ignored.
func (s *Server) NodeAddrChanged(ip netip.Addr, deleted bool) {
	if !s.cfg.HostPorts || !ip.IsGlobalUnicast() {
		return
	}
	s.nodeAddrMu.Lock()
	i := slices.Index(s.nodeAddrs, ip)
	changed := (i < 0) != deleted
	switch {
	case !changed:
	case deleted:
		s.nodeAddrs = slices.Delete(s.nodeAddrs, i, i+1)
	default:
		s.nodeAddrs = append(s.nodeAddrs, ip)
	}
	s.nodeAddrMu.Unlock()
	if changed {
		select {
		case s.hostPortKick <- struct{}{}:
		default: // a resync is already asked for
		}
	}
}

// HostPortKick is signalled when the hostPort services need a resync
// before the next periodic one.
func (s *Server) HostPortKick() <-chan struct{} { return s.hostPortKick }

// HostPorts reports whether the server translates pods' hostPorts
// (Config.HostPorts).
func (s *Server) HostPorts() bool { return s.cfg.HostPorts }

// SyncHostPorts makes the hostport source's services those of the
// endpoints' hostPorts (the agent calls it once restore is done; attach
// and delete call it for their endpoint). Returns an error wrapping
// service.ErrConflict for a frontend another source owns.
func (s *Server) SyncHostPorts(ctx context.Context) error {
	if !s.cfg.HostPorts {
		return nil
	}
	_, err := s.sys.ReplaceServices(ctx, HostPortSource, s.hostPortServices())
	if err != nil {
		return fmt.Errorf("hostPort services: %w", err)
	}
	return nil
}

// hostPortServices are the HostPort services of every endpoint not being
// deleted: per mapping, its host address or each node address of a
// family the pod has.
func (s *Server) hostPortServices() []service.Service {
	var out []service.Service
	seen := map[service.Frontend]bool{}
	nodeAddrs := s.nodeAddrList()
	for _, ep := range s.ix.Endpoints(index.EndpointFilter{}) {
		if len(ep.HostPorts) == 0 || ep.State == endpoint.StateDisconnecting || ep.State == endpoint.StateDisconnected {
			continue
		}
		for _, h := range ep.HostPorts {
			addrs := nodeAddrs
			if h.HostIP.IsValid() {
				addrs = []netip.Addr{h.HostIP}
			}
			for _, a := range addrs {
				backend := ep.IPv4
				if a.Is6() {
					backend = ep.IPv6
				}
				f := service.Frontend{Addr: a, Port: h.Port, Proto: h.Proto}
				if !backend.IsValid() || seen[f] {
					continue
				}
				seen[f] = true
				out = append(out, service.Service{Frontend: f, Name: ep.Namespace + "/" + ep.PodName, Kind: service.KindHostPort,
					Backends: []service.Backend{{Addr: backend, Port: h.ContainerPort, Local: true}}})
			}
		}
	}
	return out
}

// syncHostPortsAfter resyncs the hostPort services after a deletion of
// eps that had some; a failure is logged (the next sync retries).
func (s *Server) syncHostPortsAfter(ctx context.Context, eps ...*endpoint.Endpoint) {
	for _, ep := range eps {
		if ep != nil && len(ep.HostPorts) > 0 {
			if err := s.SyncHostPorts(ctx); err != nil && !errors.Is(err, context.Canceled) {
				s.log.Warn("hostPort services after a delete", "err", err)
			}
			return
		}
	}
}
