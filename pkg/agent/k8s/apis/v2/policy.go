package v2

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The policy kinds carry a CiliumNetworkPolicy's spec field for field
// (Cilium's pkg/policy/api.Rule), so a CNP converts by changing apiVersion
// and kind. The schema in deploy/crds/ is generated from these types
// (TestCRDSchemas, -update), so every field below reaches the agent: the
// API server prunes nothing a user wrote in a Cilium document. Fields the
// agent cannot enforce (fromNodes, l7proto rules, ...; nodeSelector in a
// namespaced kind) are declared so that the agent refuses them naming the field
// (status.nodes[node] and a Warning event) instead of the API server
// silently dropping them: a refused field inside an ingress or egress
// entry makes that entry allow nothing (inside a deny entry, and
// fromRequires/toRequires: the rule's whole direction) while the rest of
// the object is in force and its pods stay isolated; a refused field
// outside them (labels; nodeSelector in a namespaced kind) refuses the
// object. nodeSelector in a cluster-wide kind is a host policy.

// Policy kinds and their resources.
const (
	KindNetworkPolicy            = "MembraneNetworkPolicy"
	KindClusterwideNetworkPolicy = "MembraneClusterwideNetworkPolicy"
	// ResourceNetworkPolicies is KindNetworkPolicy's plural (namespaced).
	ResourceNetworkPolicies = "membranenetworkpolicies"
	// ResourceClusterwideNetworkPolicies is
	// KindClusterwideNetworkPolicy's plural (cluster-scoped).
	ResourceClusterwideNetworkPolicies = "membraneclusterwidenetworkpolicies"
)

// MembraneNetworkPolicy is a namespaced CiliumNetworkPolicy: its rules'
// endpointSelectors always select in its namespace only (whatever they
// say about the namespace label); its peer selectors are restricted to
// its namespace unless they name the namespace label themselves.
type MembraneNetworkPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// Spec is one rule; Specs a list. Give one of them.
	Spec  *Rule  `json:"spec,omitempty"`
	Specs []Rule `json:"specs,omitempty"`
	// Status is written by the agents, one entry per node.
	Status PolicyStatus `json:"status,omitempty"`
}

// MembraneClusterwideNetworkPolicy is a cluster-scoped
// CiliumClusterwideNetworkPolicy: its selectors span every namespace.
type MembraneClusterwideNetworkPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              *Rule        `json:"spec,omitempty"`
	Specs             []Rule       `json:"specs,omitempty"`
	Status            PolicyStatus `json:"status,omitempty"`
}

// Rule is one policy rule. An absent ingress (egress) section leaves that
// direction unenforced by this rule; an empty one enforces it and allows
// nothing (the unstructured object keeps the difference; these types'
// omitempty does not, so the agent reads the objects unstructured).
type Rule struct {
	EndpointSelector  *metav1.LabelSelector `json:"endpointSelector,omitempty"`
	NodeSelector      *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	Ingress           []IngressRule         `json:"ingress,omitempty"`
	IngressDeny       []IngressRule         `json:"ingressDeny,omitempty"`
	Egress            []EgressRule          `json:"egress,omitempty"`
	EgressDeny        []EgressRule          `json:"egressDeny,omitempty"`
	Labels            []RuleLabel           `json:"labels,omitempty"`
	EnableDefaultDeny *DefaultDeny          `json:"enableDefaultDeny,omitempty"`
	Description       string                `json:"description,omitempty"`
}

// IngressRule selects peers by label, CIDR or entity, and ports.
type IngressRule struct {
	FromEndpoints []metav1.LabelSelector `json:"fromEndpoints,omitempty"`
	FromRequires  []metav1.LabelSelector `json:"fromRequires,omitempty"`
	FromCIDR      []string               `json:"fromCIDR,omitempty"`
	FromCIDRSet   []CIDRRule             `json:"fromCIDRSet,omitempty"`
	FromEntities  []string               `json:"fromEntities,omitempty"`
	FromNodes     []metav1.LabelSelector `json:"fromNodes,omitempty"`
	ToPorts       []PortRule             `json:"toPorts,omitempty"`
	ICMPs         []ICMPRule             `json:"icmps,omitempty"`
}

// EgressRule selects peers by label, CIDR, entity or name, and ports.
type EgressRule struct {
	ToEndpoints []metav1.LabelSelector `json:"toEndpoints,omitempty"`
	ToRequires  []metav1.LabelSelector `json:"toRequires,omitempty"`
	ToCIDR      []string               `json:"toCIDR,omitempty"`
	ToCIDRSet   []CIDRRule             `json:"toCIDRSet,omitempty"`
	ToEntities  []string               `json:"toEntities,omitempty"`
	ToNodes     []metav1.LabelSelector `json:"toNodes,omitempty"`
	ToFQDNs     []FQDNSelector         `json:"toFQDNs,omitempty"`
	ToServices  []Service              `json:"toServices,omitempty"`
	ToPorts     []PortRule             `json:"toPorts,omitempty"`
	ICMPs       []ICMPRule             `json:"icmps,omitempty"`
}

// Service selects a Kubernetes Service by name or by its labels
// (Cilium's api.Service); its backends are the peers.
type Service struct {
	K8sService         *K8sServiceNamespace         `json:"k8sService,omitempty"`
	K8sServiceSelector *K8sServiceSelectorNamespace `json:"k8sServiceSelector,omitempty"`
}

// K8sServiceNamespace names a Service ("" namespace: any).
type K8sServiceNamespace struct {
	ServiceName string `json:"serviceName,omitempty"`
	Namespace   string `json:"namespace,omitempty"`
}

// K8sServiceSelectorNamespace selects Services by label ("" namespace:
// any).
type K8sServiceSelectorNamespace struct {
	Selector  metav1.LabelSelector `json:"selector"`
	Namespace string               `json:"namespace,omitempty"`
}

// CIDRRule is a prefix with exceptions inside it.
type CIDRRule struct {
	CIDR   string   `json:"cidr,omitempty"`
	Except []string `json:"except,omitempty"`
}

// PortRule lists destination ports; Rules (L7) is kept verbatim so that
// the agent can refuse it by name.
type PortRule struct {
	Ports       []PortProtocol `json:"ports,omitempty"`
	Rules       map[string]any `json:"rules,omitempty"`
	ServerNames []string       `json:"serverNames,omitempty"`
}

// PortProtocol is a port (a number as a string, "0" any; names are
// refused by the agent), an optional range end and a protocol (TCP, UDP,
// SCTP or ANY).
type PortProtocol struct {
	Port     string `json:"port,omitempty"`
	EndPort  int32  `json:"endPort,omitempty"`
	Protocol string `json:"protocol,omitempty"`
}

// ICMPRule lists ICMP types per family.
type ICMPRule struct {
	Fields []ICMPField `json:"fields,omitempty"`
}

// ICMPField is one ICMP type (number or name) of a family (IPv4, IPv6).
type ICMPField struct {
	Family string             `json:"family,omitempty"`
	Type   intstr.IntOrString `json:"type"`
}

// FQDNSelector selects peers by DNS name.
type FQDNSelector struct {
	MatchName    string `json:"matchName,omitempty"`
	MatchPattern string `json:"matchPattern,omitempty"`
}

// RuleLabel is a label of a rule (Cilium's labels.Label).
type RuleLabel struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Source string `json:"source,omitempty"`
}

// DefaultDeny says per direction whether a rule selecting an endpoint
// puts it in default deny.
type DefaultDeny struct {
	Ingress *bool `json:"ingress,omitempty"`
	Egress  *bool `json:"egress,omitempty"`
}

// PolicyStatus is what each node's agent made of the policy, keyed by node
// name (each agent writes only its own entry, with a merge patch).
type PolicyStatus struct {
	Nodes map[string]PolicyNodeStatus `json:"nodes,omitempty"`
}

// PolicyNodeStatus is one node's verdict on the policy.
type PolicyNodeStatus struct {
	// OK is true when the agent imported the policy's current generation
	// whole.
	OK bool `json:"ok"`
	// Error says why it did not, naming the refused fields.
	Error string `json:"error,omitempty"`
	// Enforcing is true when the policy's rules are in force on the node:
	// also when parts of it are refused (Refused), and false while it is
	// refused whole (an earlier accepted generation stays in force, see
	// Generation).
	Enforcing bool `json:"enforcing"`
	// Refused lists the parts of the current generation the agent
	// refused while enforcing the rest: each allows nothing, and the
	// pods the policy selects stay isolated in its directions.
	Refused []string `json:"refused,omitempty"`
	// Conditions are this node's conditions on the policy: ConditionAccepted.
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Generation is the object generation this entry is about.
	Generation int64 `json:"generation,omitempty"`
	// LocalPolicyRevision is the agent's policy revision that includes it.
	LocalPolicyRevision uint64 `json:"localPolicyRevision,omitempty"`
	// LastUpdated is when the agent wrote this entry.
	LastUpdated metav1.Time `json:"lastUpdated,omitempty"`
}

// ConditionAccepted is True when the node's agent enforces the current
// generation whole; False with reason PolicyPartiallyRefused (parts
// refused, the rest in force, the selected pods isolated) or
// PolicyRefused (refused whole: its subject or directions cannot be
// understood), the message naming the refused fields.
const ConditionAccepted = "Accepted"
