// Package service holds the service table's records: a frontend (virtual
// address, port, protocol) translated to one of its backends before
// policy. It validates them; it knows nothing of Kubernetes or BPF.
package service

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Protocols a frontend may have (IANA numbers, as the datapath uses them).
const (
	TCP  uint8 = 6
	UDP  uint8 = 17
	SCTP uint8 = 132
)

// Kinds of frontend.
const (
	// KindClusterIP is a service's cluster address.
	KindClusterIP = "ClusterIP"
	// KindNodePort is a node address with a service's node port.
	KindNodePort = "NodePort"
	// KindExternalIP is an external or load-balancer address.
	KindExternalIP = "ExternalIP"
	// KindHostPort is a node address (or the pod's hostIP) with a pod's
	// hostPort, translated to that pod's containerPort.
	KindHostPort = "HostPort"
)

// MaxBackends bounds a frontend's backends (the datapath's slot count).
const MaxBackends = 1024

// MaxAffinity bounds the ClientIP affinity timeout (Kubernetes' own
// maximum is 86400 s).
const MaxAffinity = 24 * time.Hour

var (
	// ErrInvalid is wrapped by Validate's errors.
	ErrInvalid = errors.New("invalid service")
	// ErrConflict is returned for a frontend another source owns.
	ErrConflict = errors.New("frontend owned by another source")
	// ErrNotFound is returned for a frontend the table does not hold.
	ErrNotFound = errors.New("service not found")
)

// Scopes of a frontend: which traffic its backends serve.
const (
	// ScopeInternal is every frontend's record: the backends of the
	// node's own sockets and its pods, and of traffic from outside the
	// node unless the frontend has an external scope too (TwoScopes).
	ScopeInternal uint8 = 0
	// ScopeExternal is the second record of a frontend with TwoScopes
	// (externalTrafficPolicy Local, as Cilium's two scopes): the backends
	// of traffic arriving from outside the node, only this node's.
	ScopeExternal uint8 = 1
)

// Frontend is what clients connect to: the service's address and port,
// and the scope the record serves.
type Frontend struct {
	Addr  netip.Addr
	Port  uint16
	Proto uint8
	Scope uint8
}

// String is "addr:port/proto" ("[v6]:port/proto"), with "/external" for
// the external scope.
func (f Frontend) String() string {
	s := netip.AddrPortFrom(f.Addr, f.Port).String() + "/" + ProtoName(f.Proto)
	if f.Scope == ScopeExternal {
		s += "/external"
	}
	return s
}

// Compare orders frontends by address, port, protocol, then scope.
func (f Frontend) Compare(o Frontend) int {
	if c := f.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	if f.Port != o.Port {
		return int(f.Port) - int(o.Port)
	}
	if f.Proto != o.Proto {
		return int(f.Proto) - int(o.Proto)
	}
	return int(f.Scope) - int(o.Scope)
}

// Backend is one address the frontend translates to.
type Backend struct {
	Addr netip.Addr
	Port uint16
	// Local: the backend runs on this node. NodePort traffic from
	// outside reaches a local backend by DNAT alone (the client's address
	// preserved), a remote one with SNAT to the node's address too.
	Local bool
}

// String is "addr:port".
func (b Backend) String() string { return netip.AddrPortFrom(b.Addr, b.Port).String() }

// Service is one frontend with its backends: a Kubernetes Service is one
// Service per cluster address, port and (in kube-proxy replacement mode)
// node address with its node port.
type Service struct {
	Frontend Frontend
	// Name is the owner's name for it ("namespace/name"), PortName the
	// service port's name; both are for display.
	Name     string
	PortName string
	Kind     string
	// Backends are the ready backends new connections pick from; empty
	// drops new connections (a service without endpoints).
	Backends []Backend
	// Affinity is the ClientIP session affinity timeout (0: none): a
	// client's new connections keep the backend it last used.
	Affinity time.Duration
	// TwoScopes (an internal-scope NodePort or ExternalIP frontend):
	// traffic from outside the node uses the frontend's ScopeExternal
	// record instead of this one, and none while that record is missing.
	TwoScopes bool
}

// ProtoName is "TCP", "UDP", "SCTP" or the number.
func ProtoName(p uint8) string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	case SCTP:
		return "SCTP"
	}
	return fmt.Sprint(p)
}

// ParseProto parses "TCP", "UDP" or "SCTP" (any case).
func ParseProto(s string) (uint8, error) {
	switch strings.ToUpper(s) {
	case "TCP":
		return TCP, nil
	case "UDP":
		return UDP, nil
	case "SCTP":
		return SCTP, nil
	}
	return 0, fmt.Errorf("protocol %q: %w", s, ErrInvalid)
}

// Validate checks every field; it returns an error wrapping ErrInvalid
// that names the bad one.
func (s *Service) Validate() error {
	if err := s.Frontend.Validate(); err != nil {
		return err
	}
	switch s.Kind {
	case KindClusterIP, KindNodePort, KindExternalIP, KindHostPort:
	default:
		return fmt.Errorf("service %s: kind %q: %w", s.Frontend, s.Kind, ErrInvalid)
	}
	if (s.TwoScopes || s.Frontend.Scope == ScopeExternal) && s.Kind != KindNodePort && s.Kind != KindExternalIP {
		return fmt.Errorf("service %s: kind %s has one scope: %w", s.Frontend, s.Kind, ErrInvalid)
	}
	if s.TwoScopes && s.Frontend.Scope != ScopeInternal {
		return fmt.Errorf("service %s: two scopes on the external record: %w", s.Frontend, ErrInvalid)
	}
	if len(s.Name) > 253 || len(s.PortName) > 63 {
		return fmt.Errorf("service %s: name too long: %w", s.Frontend, ErrInvalid)
	}
	if s.Affinity < 0 || s.Affinity > MaxAffinity {
		return fmt.Errorf("service %s: affinity %s out of [0, %s]: %w", s.Frontend, s.Affinity, MaxAffinity, ErrInvalid)
	}
	if len(s.Backends) > MaxBackends {
		return fmt.Errorf("service %s: %d backends, at most %d: %w", s.Frontend, len(s.Backends), MaxBackends, ErrInvalid)
	}
	for i, b := range s.Backends {
		if !b.Addr.IsValid() || b.Addr.Is4In6() || b.Addr.Zone() != "" || b.Addr.IsUnspecified() || b.Addr.IsMulticast() {
			return fmt.Errorf("service %s: backend %d: address %q: %w", s.Frontend, i, b.Addr, ErrInvalid)
		}
		if b.Addr.Is4() != s.Frontend.Addr.Is4() {
			return fmt.Errorf("service %s: backend %s: family differs from the frontend's: %w", s.Frontend, b, ErrInvalid)
		}
		if b.Port == 0 {
			return fmt.Errorf("service %s: backend %s: port 0: %w", s.Frontend, b, ErrInvalid)
		}
		if slices.Contains(s.Backends[:i], b) {
			return fmt.Errorf("service %s: backend %s twice: %w", s.Frontend, b, ErrInvalid)
		}
	}
	return nil
}

// Validate checks the frontend's address, port and protocol.
func (f Frontend) Validate() error {
	if !f.Addr.IsValid() || f.Addr.Is4In6() || f.Addr.Zone() != "" || f.Addr.IsUnspecified() || f.Addr.IsMulticast() {
		return fmt.Errorf("frontend address %q: %w", f.Addr, ErrInvalid)
	}
	if f.Port == 0 {
		return fmt.Errorf("frontend %s: port 0: %w", f, ErrInvalid)
	}
	if f.Scope != ScopeInternal && f.Scope != ScopeExternal {
		return fmt.Errorf("frontend %s: scope %d: %w", f, f.Scope, ErrInvalid)
	}
	switch f.Proto {
	case TCP, UDP:
	case SCTP:
		// Its CRC32c covers the ports: not rewritten by the datapath.
		return fmt.Errorf("frontend %s: SCTP is not translated: %w", f, ErrInvalid)
	default:
		return fmt.Errorf("frontend %s: protocol %d: %w", f, f.Proto, ErrInvalid)
	}
	return nil
}

// Equal reports whether s and o are the same record.
func (s *Service) Equal(o *Service) bool {
	return s.Frontend == o.Frontend && s.Name == o.Name && s.PortName == o.PortName && s.Kind == o.Kind &&
		s.Affinity == o.Affinity && s.TwoScopes == o.TwoScopes && slices.Equal(s.Backends, o.Backends)
}
