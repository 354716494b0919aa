package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// Label keys the agent knows about.
const (
	// NamespaceLabel is the label membrane-cni puts on every pod endpoint
	// (source k8s) with the pod's namespace.
	NamespaceLabel = "io.kubernetes.pod.namespace"
	// K8sNamespaceNameLabel is the namespace label Kubernetes sets on every
	// namespace; without ParseOptions.NamespaceLabels the only one a
	// namespaceSelector can match (endpoints carry their namespace's name,
	// not its labels).
	K8sNamespaceNameLabel = "kubernetes.io/metadata.name"
	// NamespaceLabelsPrefix prefixes the key of a namespace label copied
	// onto the namespace's endpoints (source k8s), as Cilium names them:
	// k8s:io.cilium.k8s.namespace.labels.team=a.
	NamespaceLabelsPrefix = "io.cilium.k8s.namespace.labels."
	// SourceCIDR is the label source of the local identities allocated
	// for the CIDR prefixes of policies ("cidr:10.0.0.0/8").
	SourceCIDR = "cidr"
)

// Selector selects identities by their labels. Key is canonical: two
// selectors with the same Key select the same identities (the selector
// cache keeps one entry per Key).
type Selector interface {
	Key() string
	Matches(ls labels.Labels) bool
}

// Operator is a label requirement's operator.
type Operator string

// The operators of Kubernetes label selectors.
const (
	OpIn           Operator = "In"
	OpNotIn        Operator = "NotIn"
	OpExists       Operator = "Exists"
	OpDoesNotExist Operator = "DoesNotExist"
)

// Requirement is one condition on a label: Source "any" matches a label
// of any source.
type Requirement struct {
	Source, Key string
	Op          Operator
	Values      []string // sorted
}

// LabelSelector matches identities whose labels meet every requirement
// (an empty selector matches everything).
type LabelSelector struct {
	Reqs []Requirement // sorted by String
	key  string
}

func (r Requirement) String() string {
	return fmt.Sprintf("%s:%s %s (%s)", r.Source, r.Key, r.Op, strings.Join(r.Values, ","))
}

// NewLabelSelector returns the canonical selector of reqs.
func NewLabelSelector(reqs []Requirement) *LabelSelector {
	reqs = slices.Clone(reqs)
	for i := range reqs {
		reqs[i].Values = slices.Compact(slices.Sorted(slices.Values(reqs[i].Values)))
	}
	slices.SortFunc(reqs, func(a, b Requirement) int { return strings.Compare(a.String(), b.String()) })
	reqs = slices.CompactFunc(reqs, func(a, b Requirement) bool { return a.String() == b.String() })
	parts := make([]string, len(reqs))
	for i, r := range reqs {
		parts[i] = r.String()
	}
	return &LabelSelector{Reqs: reqs, key: "labels{" + strings.Join(parts, "; ") + "}"}
}

// Key implements Selector.
func (s *LabelSelector) Key() string { return s.key }

// Matches implements Selector.
func (s *LabelSelector) Matches(ls labels.Labels) bool {
	for _, r := range s.Reqs {
		if !r.matches(ls) {
			return false
		}
	}
	return true
}

// HasKey reports whether a requirement names key (any source).
func (s *LabelSelector) HasKey(key string) bool {
	return slices.ContainsFunc(s.Reqs, func(r Requirement) bool { return r.Key == key })
}

func (r Requirement) matches(ls labels.Labels) bool {
	found, in := false, false
	for _, l := range ls {
		if l.Key != r.Key || (r.Source != labels.SourceAny && l.Source != r.Source) {
			continue
		}
		found = true
		if slices.Contains(r.Values, l.Value) {
			in = true
		}
	}
	switch r.Op {
	case OpIn:
		return in
	case OpNotIn:
		return !in
	case OpExists:
		return found
	default: // OpDoesNotExist
		return !found
	}
}

// CIDRSelector matches the CIDR identities of prefixes inside Prefix and
// outside every Except. It never matches the world identity, which holds
// addresses of both families: the CIDR entries (CIDREntry) decide on
// the address itself, pods' and the world's alike.
type CIDRSelector struct {
	Prefix netip.Prefix
	Except []netip.Prefix // sorted
	key    string         // Key, computed once by the parser (else per call)
}

// Key implements Selector.
func (s *CIDRSelector) Key() string {
	if s.key != "" {
		return s.key
	}
	return s.buildKey()
}

func (s *CIDRSelector) buildKey() string {
	var b strings.Builder
	b.WriteString("cidr{" + s.Prefix.String())
	for _, e := range s.Except {
		b.WriteString(" except " + e.String())
	}
	b.WriteString("}")
	return b.String()
}

// Matches implements Selector.
func (s *CIDRSelector) Matches(ls labels.Labels) bool {
	p, ok := cidrOf(ls)
	return ok && s.selects(p)
}

// selects reports whether s matches the CIDR identity of prefix p:
// inside Prefix and outside every Except.
func (s *CIDRSelector) selects(p netip.Prefix) bool {
	if !contains(s.Prefix, p) {
		return false
	}
	for _, e := range s.Except {
		if contains(e, p) {
			return false
		}
	}
	return true
}

// contains reports whether outer contains inner (same family).
func contains(outer, inner netip.Prefix) bool {
	return outer.Addr().Is4() == inner.Addr().Is4() && inner.Bits() >= outer.Bits() && outer.Contains(inner.Addr())
}

// CIDRLabels returns the label set of the local identity of prefix p.
func CIDRLabels(p netip.Prefix) labels.Labels {
	return labels.Labels{{Source: SourceCIDR, Key: p.String()}}
}

func cidrOf(ls labels.Labels) (netip.Prefix, bool) {
	if len(ls) != 1 || ls[0].Source != SourceCIDR {
		return netip.Prefix{}, false
	}
	p, err := netip.ParsePrefix(ls[0].Key)
	return p, err == nil
}

func isWorld(ls labels.Labels) bool {
	return ls.Has(labels.Label{Source: labels.SourceReserved, Key: "world"})
}

// cidrLike reports whether a CIDR selector may match ls: world or a
// label of source cidr.
func cidrLike(ls labels.Labels) bool {
	for _, l := range ls {
		if l.Source == SourceCIDR || (l.Source == labels.SourceReserved && l.Key == "world") {
			return true
		}
	}
	return false
}

// Entity names of fromEntities/toEntities.
const (
	EntityWorld     = "world"
	EntityHost      = "host"
	EntityAll       = "all"
	EntityCluster   = "cluster"
	EntityHealth    = "health"
	EntityInit      = "init"
	EntityUnmanaged = "unmanaged"
	// EntityRemoteNode is every other node (identity remote-node, and the
	// API server's kube-apiserver identity, which carries its label).
	EntityRemoteNode = "remote-node"
	// EntityKubeAPIServer is the API server's addresses (identity
	// kube-apiserver).
	EntityKubeAPIServer = "kube-apiserver"
	// EntityIngress is Cilium's ingress proxy (identity ingress), which
	// Membrane does not run: it selects nothing here.
	EntityIngress = "ingress"
)

// EntitySelector matches an entity: world (the world identity and every
// CIDR identity), host, health (the nodes' health endpoints), init
// (endpoints whose labels are not known yet), unmanaged (endpoints the
// agent does not manage), remote-node (other nodes: identities
// remote-node and kube-apiserver, whose labels hold reserved:remote-node),
// kube-apiserver (the API server's addresses), or cluster (everything but
// world and CIDR identities, all of those included). "all" is not a
// selector: it compiles to the any-peer key.
type EntitySelector struct{ Entity string }

// Key implements Selector.
func (s *EntitySelector) Key() string { return "entity{" + s.Entity + "}" }

// Matches implements Selector.
func (s *EntitySelector) Matches(ls labels.Labels) bool {
	_, isCIDR := cidrOf(ls)
	switch s.Entity {
	case EntityWorld:
		return isWorld(ls) || isCIDR
	case EntityHost, EntityHealth, EntityInit, EntityUnmanaged, EntityRemoteNode, EntityKubeAPIServer, EntityIngress:
		return ls.Has(labels.Label{Source: labels.SourceReserved, Key: s.Entity})
	default: // cluster
		return !isWorld(ls) && !isCIDR
	}
}
