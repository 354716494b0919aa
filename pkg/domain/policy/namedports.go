package policy

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// maxNamedPorts bounds the named ports one endpoint may carry (a pod's
// containers rarely declare more than a few).
const maxNamedPorts = 256

// NamedPort is a port a pod's container declares under a name
// (containers[].ports[] with name, protocol and containerPort).
type NamedPort struct {
	Name  string
	Proto uint8 // ProtoTCP, ProtoUDP or ProtoSCTP
	Port  uint16
}

// NamedPorts are an endpoint's named ports, sorted by name then protocol,
// one port per (name, protocol). Built by NewNamedPorts; immutable.
type NamedPorts []NamedPort

// ValidatePortName checks name against IANA_SVC_NAME (RFC 6335), the
// rule Kubernetes applies to container port names and NetworkPolicy
// named ports: at most 15 characters of lowercase letters, digits and
// '-', at least one letter, no '-' at either end and no "--".
func ValidatePortName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("port name is empty")
	case len(name) > 15:
		return fmt.Errorf("port name %q is longer than 15 characters", clip(name))
	case strings.HasPrefix(name, "-") || strings.HasSuffix(name, "-"):
		return fmt.Errorf("port name %q begins or ends with '-'", name)
	case strings.Contains(name, "--"):
		return fmt.Errorf("port name %q contains \"--\"", name)
	}
	letter := false
	for _, c := range []byte(name) {
		switch {
		case c >= 'a' && c <= 'z':
			letter = true
		case c >= '0' && c <= '9', c == '-':
		default:
			return fmt.Errorf("port name %q: %s is not a lowercase letter, digit or '-'", name, strconv.QuoteRune(rune(c)))
		}
	}
	if !letter {
		return fmt.Errorf("port name %q has no letter", name)
	}
	return nil
}

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// ParsePortProtocol maps a container port's protocol ("" is TCP, as in
// Kubernetes) to its number.
func ParsePortProtocol(s string) (uint8, error) {
	switch strings.ToUpper(s) {
	case "", "TCP":
		return ProtoTCP, nil
	case "UDP":
		return ProtoUDP, nil
	case "SCTP":
		return ProtoSCTP, nil
	}
	return 0, fmt.Errorf("protocol %q: want TCP, UDP or SCTP", clip(s))
}

// ProtoName returns "ANY" (0), "TCP", "UDP", "SCTP", "ICMP" or "ICMPv6"
// (the number otherwise).
func ProtoName(p uint8) string {
	switch p {
	case ProtoAny:
		return "ANY"
	case ProtoICMP:
		return "ICMP"
	case ProtoICMPv6:
		return "ICMPv6"
	case ProtoTCP:
		return "TCP"
	case ProtoUDP:
		return "UDP"
	case ProtoSCTP:
		return "SCTP"
	}
	return strconv.Itoa(int(p))
}

// NewNamedPorts validates ports and returns them sorted. Every name must
// pass ValidatePortName, every protocol be TCP, UDP or SCTP, every port
// be 1..65535; one (name, protocol) may appear twice only with the same
// port. Returns nil for no ports.
func NewNamedPorts(ports []NamedPort) (NamedPorts, error) {
	if len(ports) == 0 {
		return nil, nil
	}
	if len(ports) > maxNamedPorts {
		return nil, fmt.Errorf("named ports: %d given, more than %d", len(ports), maxNamedPorts)
	}
	out := slices.Clone(ports)
	for _, p := range out {
		if err := ValidatePortName(p.Name); err != nil {
			return nil, err
		}
		switch {
		case p.Proto != ProtoTCP && p.Proto != ProtoUDP && p.Proto != ProtoSCTP:
			return nil, fmt.Errorf("named port %q: protocol %d is not TCP, UDP or SCTP", p.Name, p.Proto)
		case p.Port == 0:
			return nil, fmt.Errorf("named port %q: port 0", p.Name)
		}
	}
	slices.SortFunc(out, compareNamedPort)
	for i := 1; i < len(out); i++ {
		a, b := out[i-1], out[i]
		if a.Name == b.Name && a.Proto == b.Proto && a.Port != b.Port {
			return nil, fmt.Errorf("named port %q/%s: given as both %d and %d", a.Name, ProtoName(a.Proto), a.Port, b.Port)
		}
	}
	return slices.Compact(out), nil
}

func compareNamedPort(a, b NamedPort) int {
	return cmp.Or(strings.Compare(a.Name, b.Name), cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Port, b.Port))
}

// Lookup returns the port named name over proto.
func (n NamedPorts) Lookup(name string, proto uint8) (uint16, bool) {
	i, ok := slices.BinarySearchFunc(n, NamedPort{Name: name, Proto: proto}, func(p, t NamedPort) int {
		return cmp.Or(strings.Compare(p.Name, t.Name), cmp.Compare(p.Proto, t.Proto))
	})
	if !ok {
		return 0, false
	}
	return n[i].Port, true
}

// Equal reports whether n and o hold the same ports.
func (n NamedPorts) Equal(o NamedPorts) bool { return slices.Equal(n, o) }

// String returns "name/PROTO=port,..." (the form of the cache key and of
// logs).
func (n NamedPorts) String() string {
	var b strings.Builder
	for i, p := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s/%s=%d", p.Name, ProtoName(p.Proto), p.Port)
	}
	return b.String()
}

// ParseNamedPort parses "name/PROTO=port" or "name=port" (TCP), the form
// String writes and the API accepts in lists.
func ParseNamedPort(s string) (NamedPort, error) {
	nameProto, num, ok := strings.Cut(s, "=")
	if !ok {
		return NamedPort{}, fmt.Errorf("named port %q: want name[/protocol]=port", clip(s))
	}
	name, protoS, _ := strings.Cut(nameProto, "/")
	if err := ValidatePortName(name); err != nil {
		return NamedPort{}, err
	}
	proto, err := ParsePortProtocol(protoS)
	if err != nil {
		return NamedPort{}, fmt.Errorf("named port %q: %w", name, err)
	}
	port, err := strconv.ParseUint(num, 10, 16)
	if err != nil || port == 0 || num[0] == '+' || (len(num) > 1 && num[0] == '0') {
		return NamedPort{}, fmt.Errorf("named port %q: port %q is not a number in 1..65535", name, clip(num))
	}
	return NamedPort{Name: name, Proto: proto, Port: uint16(port)}, nil
}
