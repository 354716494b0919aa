package k8s

import (
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/membrane-cni/membrane/pkg/domain/service"
)

// defaultAffinity is Kubernetes' ClientIP timeout when none is given.
const defaultAffinity = 10800 * time.Second

// serviceView is what the translation needs besides the Service.
type serviceView struct {
	// node is this node's name: internalTrafficPolicy and
	// externalTrafficPolicy Local keep only its endpoints.
	node string
	// nodeAddrs are this node's addresses (NodePort frontends).
	nodeAddrs []netip.Addr
	// replacement: kube-proxy replacement mode, where NodePort and
	// external addresses are translated too (else kube-proxy does).
	replacement bool
}

// translate turns a Service and its EndpointSlices into the service
// table's frontends: one per cluster address and port, and in
// replacement mode per node address and node port and per external
// address and port. Backends are the ready endpoints (else the serving
// terminating ones) whose slice port has the service port's name and
// protocol. internalTrafficPolicy Local keeps a cluster address's to
// this node's. externalTrafficPolicy Local gives a node port or external
// address two scopes, as Cilium does: the internal record (every
// endpoint: the node's own sockets and its pods, kube-proxy's
// short-circuit) and the external one (this node's endpoints: traffic
// from outside, which keeps its source address). ExternalName and
// headless services have none; SCTP ports are skipped (not translated).
func (v *serviceView) translate(svc *corev1.Service, slices []*discoveryv1.EndpointSlice) []service.Service {
	if svc.Spec.Type == corev1.ServiceTypeExternalName || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return nil
	}
	var affinity time.Duration
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		affinity = defaultAffinity
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			affinity = time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
		}
	}
	intLocal := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	extLocal := svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	name := svc.Namespace + "/" + svc.Name
	var out []service.Service
	add := func(addr netip.Addr, port uint16, p corev1.ServicePort, kind string, local bool) {
		proto, ok := protoOf(p.Protocol)
		if !addr.IsValid() || port == 0 || !ok {
			return
		}
		twoScopes := local && kind != service.KindClusterIP
		out = append(out, service.Service{
			Frontend: service.Frontend{Addr: addr, Port: port, Proto: proto},
			Name:     name, PortName: p.Name, Kind: kind, Affinity: affinity, TwoScopes: twoScopes,
			Backends: v.backends(slices, p, addr.Is4(), local && !twoScopes),
		})
		if twoScopes {
			out = append(out, service.Service{
				Frontend: service.Frontend{Addr: addr, Port: port, Proto: proto, Scope: service.ScopeExternal},
				Name:     name, PortName: p.Name, Kind: kind, Affinity: affinity,
				Backends: v.backends(slices, p, addr.Is4(), true),
			})
		}
	}
	for _, p := range svc.Spec.Ports {
		for _, ip := range clusterIPs(svc) {
			add(ip, uint16(p.Port), p, service.KindClusterIP, intLocal)
		}
		if !v.replacement {
			continue
		}
		if p.NodePort != 0 && (svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer) {
			for _, ip := range v.nodeAddrs {
				add(ip, uint16(p.NodePort), p, service.KindNodePort, extLocal)
			}
		}
		for _, ip := range externalIPs(svc) {
			add(ip, uint16(p.Port), p, service.KindExternalIP, extLocal)
		}
	}
	return dedupe(out)
}

// dedupe keeps the first of services sharing a frontend (a node address
// also listed as an external address).
func dedupe(svcs []service.Service) []service.Service {
	seen := make(map[service.Frontend]bool, len(svcs))
	return slices.DeleteFunc(svcs, func(s service.Service) bool {
		if seen[s.Frontend] {
			return true
		}
		seen[s.Frontend] = true
		return false
	})
}

func protoOf(p corev1.Protocol) (uint8, bool) {
	switch p {
	case corev1.ProtocolTCP, "":
		return service.TCP, true
	case corev1.ProtocolUDP:
		return service.UDP, true
	}
	return 0, false
}

func parseAddrs(ss []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" && !a.IsUnspecified() {
			out = append(out, a.Unmap())
		}
	}
	return out
}

func clusterIPs(svc *corev1.Service) []netip.Addr {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	return parseAddrs(ips)
}

func externalIPs(svc *corev1.Service) []netip.Addr {
	ips := slices.Clone(svc.Spec.ExternalIPs)
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if in.IP != "" {
			ips = append(ips, in.IP)
		}
	}
	return parseAddrs(ips)
}

// backends are the ready endpoints of family v4 (local: on this node
// only) on the slice port matching p by name and protocol, deduplicated;
// when none is ready, the serving terminating ones, as kube-proxy falls
// back (a rolling update whose old pods still serve while draining, an
// externalTrafficPolicy Local node whose only pod is shutting down).
func (v *serviceView) backends(eps []*discoveryv1.EndpointSlice, p corev1.ServicePort, v4, local bool) []service.Backend {
	if out := v.backendsIf(eps, p, v4, local, isReady); len(out) > 0 {
		return out
	}
	return v.backendsIf(eps, p, v4, local, isServingTerminating)
}

// isReady: Ready unset counts as ready (the EndpointSlice API's rule).
func isReady(c discoveryv1.EndpointConditions) bool { return c.Ready == nil || *c.Ready }

// isServingTerminating: terminating and still serving (Serving unset
// means as ready).
func isServingTerminating(c discoveryv1.EndpointConditions) bool {
	serving := isReady(c)
	if c.Serving != nil {
		serving = *c.Serving
	}
	return serving && c.Terminating != nil && *c.Terminating
}

// backendsIf is backends over the endpoints whose conditions pass keep.
func (v *serviceView) backendsIf(eps []*discoveryv1.EndpointSlice, p corev1.ServicePort, v4, local bool, keep func(discoveryv1.EndpointConditions) bool) []service.Backend {
	var out []service.Backend
	want := discoveryv1.AddressTypeIPv6
	if v4 {
		want = discoveryv1.AddressTypeIPv4
	}
	for _, s := range eps {
		if s.AddressType != want {
			continue
		}
		port, ok := slicePort(s, p)
		if !ok {
			continue
		}
		for _, ep := range s.Endpoints {
			if !keep(ep.Conditions) {
				continue
			}
			if local && (ep.NodeName == nil || *ep.NodeName != v.node) {
				continue
			}
			for _, a := range parseAddrs(ep.Addresses) {
				b := service.Backend{Addr: a, Port: port, Local: ep.NodeName != nil && *ep.NodeName == v.node}
				if a.Is4() == v4 && !slices.Contains(out, b) && len(out) < service.MaxBackends {
					out = append(out, b)
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b service.Backend) int {
		if c := a.Addr.Compare(b.Addr); c != 0 {
			return c
		}
		return int(a.Port) - int(b.Port)
	})
	return out
}

// slicePort is the port of s named like p with p's protocol.
func slicePort(s *discoveryv1.EndpointSlice, p corev1.ServicePort) (uint16, bool) {
	for _, sp := range s.Ports {
		name, proto := "", corev1.ProtocolTCP
		if sp.Name != nil {
			name = *sp.Name
		}
		if sp.Protocol != nil {
			proto = *sp.Protocol
		}
		pp := p.Protocol
		if pp == "" {
			pp = corev1.ProtocolTCP
		}
		if name == p.Name && proto == pp && sp.Port != nil && *sp.Port > 0 && *sp.Port < 65536 {
			return uint16(*sp.Port), true
		}
	}
	return 0, false
}
