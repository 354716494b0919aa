package endpoint

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/membrane-cni/membrane/pkg/domain/ifname"
)

// RefKind says how a Ref names an endpoint.
type RefKind int

const (
	// RefID names an endpoint by its numeric ID ("42").
	RefID RefKind = iota
	// RefContainerID names it by container ID ("container-id:abc123").
	RefContainerID
	// RefPodName names it by pod ("pod-name:default/web-0").
	RefPodName
	// RefAttachment names it by CNI attachment, container ID and interface
	// in it ("cni-attachment-id:abc123:eth0", as Cilium spells it).
	RefAttachment
)

// Ref is a parsed {id} path element of the API.
type Ref struct {
	Kind        RefKind
	ID          ID
	ContainerID string
	IfName      string // RefAttachment's container interface
	Namespace   string
	PodName     string
}

// maxRefLen bounds a reference; container IDs are 64 hex characters and
// Kubernetes names at most 253 characters each.
const maxRefLen = 600

// ParseRef parses "<number>", "container-id:<id>",
// "cni-attachment-id:<id>:<ifname>" or "pod-name:<ns>/<pod>". A container
// ID with several attachments: container-id names the one with the lowest
// endpoint ID.
// A bare "0" is accepted (PUT uses it for "agent picks the ID").
// Returns ErrInvalidID for anything else, saying what is wrong.
func ParseRef(s string) (Ref, error) {
	if s == "" || len(s) > maxRefLen {
		return Ref{}, fmt.Errorf("parse endpoint id %q: empty or longer than %d bytes: %w", s, maxRefLen, ErrInvalidID)
	}
	prefix, rest, found := strings.Cut(s, ":")
	if !found {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil || n > MaxID || s[0] == '+' {
			return Ref{}, fmt.Errorf("parse endpoint id %q: want a number 0..%d, container-id:<id> or pod-name:<namespace>/<pod>: %w", s, MaxID, ErrInvalidID)
		}
		return Ref{Kind: RefID, ID: ID(n)}, nil
	}
	switch prefix {
	case "container-id":
		if !validName(rest, false) {
			return Ref{}, fmt.Errorf("parse endpoint id %q: bad container id: %w", s, ErrInvalidID)
		}
		return Ref{Kind: RefContainerID, ContainerID: rest}, nil
	case "cni-attachment-id":
		i := strings.LastIndexByte(rest, ':')
		if i < 0 || !validName(rest[:i], false) || !ifname.Valid(rest[i+1:]) {
			return Ref{}, fmt.Errorf("parse endpoint id %q: want cni-attachment-id:<container id>:<interface>: %w", s, ErrInvalidID)
		}
		return Ref{Kind: RefAttachment, ContainerID: rest[:i], IfName: rest[i+1:]}, nil
	case "pod-name":
		ns, pod, ok := strings.Cut(rest, "/")
		if !ok || !validName(ns, false) || !validName(pod, false) {
			return Ref{}, fmt.Errorf("parse endpoint id %q: want pod-name:<namespace>/<pod>: %w", s, ErrInvalidID)
		}
		return Ref{Kind: RefPodName, Namespace: ns, PodName: pod}, nil
	default:
		return Ref{}, fmt.Errorf("parse endpoint id %q: unknown prefix %q (want container-id, cni-attachment-id or pod-name): %w", s, prefix, ErrInvalidID)
	}
}

// String formats the reference in the form ParseRef accepts.
func (r Ref) String() string {
	switch r.Kind {
	case RefContainerID:
		return "container-id:" + r.ContainerID
	case RefAttachment:
		return "cni-attachment-id:" + r.ContainerID + ":" + r.IfName
	case RefPodName:
		return "pod-name:" + r.Namespace + "/" + r.PodName
	default:
		return strconv.FormatUint(uint64(r.ID), 10)
	}
}

// validName accepts non-empty printable names without '/', spaces or
// control characters (container IDs, namespaces, pod names).
func validName(s string, allowSlash bool) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f || (r == '/' && !allowSlash) || r == '%' || r == '?' || r == '#' {
			return false
		}
	}
	return true
}
