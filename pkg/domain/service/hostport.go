package service

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// HostPort is one of a pod's port mappings (a container's ports[].hostPort,
// the CNI runtime config's portMappings): connections to HostIP (any of
// the node's addresses when invalid) on Port with Proto reach the pod's
// ContainerPort.
type HostPort struct {
	HostIP        netip.Addr
	Port          uint16
	ContainerPort uint16
	Proto         uint8
}

// String is "[hostIP:]port/proto=containerPort", the form ParseHostPort reads.
func (h HostPort) String() string {
	var b strings.Builder
	if h.HostIP.IsValid() {
		b.WriteString(netip.AddrPortFrom(h.HostIP, h.Port).String())
	} else {
		b.WriteString(strconv.Itoa(int(h.Port)))
	}
	b.WriteString("/" + ProtoName(h.Proto) + "=" + strconv.Itoa(int(h.ContainerPort)))
	return b.String()
}

// Validate checks the ports, the protocol (TCP or UDP: SCTP is not
// translated) and the host address (unicast or loopback, of one family,
// no zone). A loopback host address is the node's localhost: only the
// node's own sockets reach the pod through it.
// Returns an error wrapping ErrInvalid.
func (h HostPort) Validate() error {
	if h.Port == 0 || h.ContainerPort == 0 {
		return fmt.Errorf("host port %s: port 0: %w", h, ErrInvalid)
	}
	switch h.Proto {
	case TCP, UDP:
	case SCTP:
		return fmt.Errorf("host port %s: SCTP is not translated (chain portmap for it): %w", h, ErrInvalid)
	default:
		return fmt.Errorf("host port %s: protocol %d: %w", h, h.Proto, ErrInvalid)
	}
	if a := h.HostIP; a.IsValid() && (a.Is4In6() || a.Zone() != "" || !(a.IsGlobalUnicast() || a.IsLoopback())) {
		return fmt.Errorf("host port %s: host address %s: %w", h, a, ErrInvalid)
	}
	return nil
}

// Overlaps reports whether h and o claim a common frontend: the same
// port and protocol on the same address, or either on every address (of
// any family: an address-less mapping claims both).
func (h HostPort) Overlaps(o HostPort) bool {
	if h.Port != o.Port || h.Proto != o.Proto {
		return false
	}
	return !h.HostIP.IsValid() || !o.HostIP.IsValid() || h.HostIP == o.HostIP
}

// ParseHostPort parses String's form and validates the result.
func ParseHostPort(s string) (HostPort, error) {
	front, cport, ok := strings.Cut(s, "=")
	if !ok {
		return HostPort{}, fmt.Errorf("host port %q: want [addr:]port/proto=port: %w", s, ErrInvalid)
	}
	front, proto, ok := strings.Cut(front, "/")
	if !ok {
		return HostPort{}, fmt.Errorf("host port %q: want [addr:]port/proto=port: %w", s, ErrInvalid)
	}
	var h HostPort
	var err error
	if h.Proto, err = ParseProto(proto); err != nil {
		return HostPort{}, err
	}
	if strings.ContainsAny(front, ":") {
		ap, err := netip.ParseAddrPort(front)
		if err != nil {
			return HostPort{}, fmt.Errorf("host port %q: %v: %w", s, err, ErrInvalid)
		}
		h.HostIP, h.Port = ap.Addr(), ap.Port()
	} else if h.Port, err = parsePort(front); err != nil {
		return HostPort{}, fmt.Errorf("host port %q: %w", s, err)
	}
	if h.ContainerPort, err = parsePort(cport); err != nil {
		return HostPort{}, fmt.Errorf("host port %q: %w", s, err)
	}
	return h, h.Validate()
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 || strconv.FormatUint(n, 10) != s {
		return 0, fmt.Errorf("port %q: want 1..65535: %w", s, ErrInvalid)
	}
	return uint16(n), nil
}
