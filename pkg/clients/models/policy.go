package models

import "encoding/json"

// PolicyImportResponse answers PUT /v1/policy.
type PolicyImportResponse struct {
	// Revision is the policy repository revision after the import.
	Revision uint64 `json:"revision"`
	// Policies names the imported policies, "namespace/name".
	Policies []string `json:"policies"`
}

// Policy is one imported policy in GET /v1/policy.
type Policy struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Kind      string            `json:"kind"`
	Labels    map[string]string `json:"labels"`
	// Spec is the document's spec as imported ("specs" for a
	// CiliumNetworkPolicy with a list of rules).
	Spec json.RawMessage `json:"spec"`
	// Selected says what the policy's toServices and entity peers select
	// now (absent when it has none).
	Selected []PolicySelection `json:"selected,omitempty"`
}

// PolicySelection is what one peer selector selects now: selector is
// "service{namespace/name}", "service{namespace labels{...}}" or
// "entity{name}"; identities are the peer identities; services (service
// selectors) the Services named, each with its pod selector or, without
// one, its EndpointSlices' addresses.
type PolicySelection struct {
	Selector   string                  `json:"selector"`
	Identities []uint32                `json:"identities"`
	Services   []PolicySelectedService `json:"services,omitempty"`
}

// PolicySelectedService is a Service a toServices peer names.
type PolicySelectedService struct {
	Namespace string            `json:"namespace"`
	Name      string            `json:"name"`
	Selector  map[string]string `json:"selector,omitempty"`
	Addresses []string          `json:"addresses,omitempty"`
}

// PolicyList answers GET /v1/policy.
type PolicyList struct {
	Revision uint64    `json:"revision"`
	Policies []*Policy `json:"policies"`
}

// PolicyDeleteResponse answers DELETE /v1/policy.
type PolicyDeleteResponse struct {
	Revision uint64 `json:"revision"`
	Deleted  int    `json:"deleted"`
}

// PolicyEntry is one policy map entry: traffic with the peer identity
// (0: any) to destination port (0: any) over protocol ("TCP", "UDP",
// "SCTP", "ICMP", "ICMPv6", "ANY" or a number) in direction ("ingress"
// or "egress") is allowed, or dropped when deny is set (ingressDeny,
// egressDeny: a deny wins over any allow). An ICMP entry matches the
// ICMP type icmp-type (decimal; port is 0), or every type when
// icmp-type is empty.
type PolicyEntry struct {
	Identity  uint32 `json:"identity"`
	Port      uint16 `json:"port"`
	ICMPType  string `json:"icmp-type,omitempty"`
	Protocol  string `json:"protocol"`
	Direction string `json:"direction"`
	Deny      bool   `json:"deny,omitempty"`
}

// RealizedPolicyEntry is a policy map entry read back from the datapath
// with its counters.
type RealizedPolicyEntry struct {
	PolicyEntry
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
	// ProxyPort is the L7 proxy port the entry redirects to (0: none).
	ProxyPort uint16 `json:"proxy-port,omitempty"`
}

// L7PolicyEntry is a computed policy entry redirected to the L7 proxy
// with the HTTP rules the proxy enforces on it (an empty rule allows
// every request).
type L7PolicyEntry struct {
	PolicyEntry
	HTTP []HTTPRule `json:"http"`
	// Kafka are the entry's rules.kafka[] when it is redirected to the
	// Kafka proxy (HTTP is then empty).
	Kafka []KafkaRule `json:"kafka,omitempty"`
}

// KafkaRule is one rules.kafka[] entry, as written.
type KafkaRule struct {
	Role       string `json:"role,omitempty"`
	APIKey     string `json:"apiKey,omitempty"`
	APIVersion string `json:"apiVersion,omitempty"`
	ClientID   string `json:"clientID,omitempty"`
	Topic      string `json:"topic,omitempty"`
}

// HTTPRule is one rules.http[] entry (regular expressions).
type HTTPRule struct {
	Method  string   `json:"method,omitempty"`
	Path    string   `json:"path,omitempty"`
	Host    string   `json:"host,omitempty"`
	Headers []string `json:"headers,omitempty"`
	// HeaderMatches are the rule's headerMatches (a value, or presence,
	// and the mismatch action: "" fails the rule, LOG, ADD, DELETE,
	// REPLACE).
	HeaderMatches []HeaderMatch `json:"headerMatches,omitempty"`
}

// HeaderMatch is one rules.http[].headerMatches[] entry. Secret names
// the Kubernetes Secret holding the value ("secret ns/name"); the
// secret's value is never shown.
type HeaderMatch struct {
	Name     string `json:"name"`
	Value    string `json:"value,omitempty"`
	Secret   string `json:"secret,omitempty"`
	Mismatch string `json:"mismatch,omitempty"`
}

// CIDRPolicyEntry is one CIDR policy entry, decided on the peer's
// address whatever its identity: a connection in direction to port
// (0: any) over protocol whose peer address's longest match among the
// entries of the same direction, port and protocol is cidr is allowed
// when allow is set (false: an except carved out of a broader entry).
// Deny entries (deny set) form groups of their own, in which allow set
// means the connection is dropped, whatever else allows it.
type CIDRPolicyEntry struct {
	CIDR      string `json:"cidr"`
	Port      uint16 `json:"port"`
	ICMPType  string `json:"icmp-type,omitempty"`
	Protocol  string `json:"protocol"`
	Direction string `json:"direction"`
	Deny      bool   `json:"deny,omitempty"`
	Allow     bool   `json:"allow"`
}

// RealizedCIDRPolicyEntry is a CIDR policy entry read back from the
// datapath with its counters (what an allow entry allowed).
type RealizedCIDRPolicyEntry struct {
	CIDRPolicyEntry
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// EndpointPolicy answers GET /v1/endpoint/{id}/policy.
type EndpointPolicy struct {
	ID       int64  `json:"id"`
	Identity uint32 `json:"identity"`
	// PolicyRevision is the repository revision the computed policy
	// comes from (0: no rule selects the endpoint).
	PolicyRevision  uint64        `json:"policy-revision"`
	IngressEnforced bool          `json:"ingress-enforced"`
	EgressEnforced  bool          `json:"egress-enforced"`
	Computed        []PolicyEntry `json:"computed"`
	// ComputedL7 are the computed entries redirected to the L7 proxy.
	ComputedL7 []L7PolicyEntry `json:"computed-l7,omitempty"`
	// ComputedDNS are the computed egress entries redirected to the DNS
	// proxy, with the names the endpoint may resolve there.
	ComputedDNS []DNSPolicyEntry `json:"computed-dns,omitempty"`
	// L7Proxy is the endpoint's L7 configuration version and whether
	// the proxy acknowledged it (absent: no L7 configuration).
	L7Proxy *L7EndpointVersion `json:"l7-proxy,omitempty"`
	// ComputedCIDR are the computed CIDR entries (CIDR rules and
	// ipBlocks, decided on the peer's address).
	ComputedCIDR []CIDRPolicyEntry `json:"computed-cidr"`
	// Realized is the datapath's policy map (null when it cannot be
	// read: RealizedError says why).
	Realized                []RealizedPolicyEntry `json:"realized"`
	RealizedIngressEnforced bool                  `json:"realized-ingress-enforced"`
	RealizedEgressEnforced  bool                  `json:"realized-egress-enforced"`
	RealizedError           string                `json:"realized-error,omitempty"`
	// RealizedCIDR is the datapath's CIDR policy map (null when it
	// cannot be read: RealizedError says why).
	RealizedCIDR []RealizedCIDRPolicyEntry `json:"realized-cidr"`
	// Drops are the datapath's drop counters of this endpoint (null
	// when they cannot be read: DropsError says why).
	Drops      []DropCounter `json:"drops"`
	DropsError string        `json:"drops-error,omitempty"`
}

// DropCounter counts the packets an endpoint's programs dropped for one
// reason ("policy-denied", "fragment", "malformed", "unknown-l3",
// "invalid-source", ...: datapath/drops.go) in one
// direction ("ingress" or "egress"). Endpoint is set in GET /v1/drops.
type DropCounter struct {
	Endpoint  int64  `json:"endpoint,omitempty"`
	Reason    string `json:"reason"`
	Direction string `json:"direction"`
	Packets   uint64 `json:"packets"`
	Bytes     uint64 `json:"bytes"`
}

// IPCacheEntry is one row of GET /v1/ipcache.
type IPCacheEntry struct {
	CIDR     string `json:"cidr"`
	Identity uint32 `json:"identity"`
	// Source is "endpoint", "cidr-policy" or "reserved".
	Source string `json:"source"`
}
