package policy

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
)

// The document types below are the accepted input formats. Only the
// fields declared here are accepted: any other field is refused with its
// path (see checkFields), so nothing is silently ignored.

// typeMeta and objectMeta are the Kubernetes object header.
type typeMeta struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
}

type objectMeta struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// cnpDoc is a CiliumNetworkPolicy (cilium.io/v2).
type cnpDoc struct {
	typeMeta
	Spec  *cnpRule  `json:"spec"`
	Specs []cnpRule `json:"specs"`
}

// cnpRule is one rule of a CiliumNetworkPolicy. Ingress and Egress are
// pointers so that an absent section (direction not enforced by this
// rule) differs from an empty one (enforced, nothing allowed).
type cnpRule struct {
	EndpointSelector *labelSelector `json:"endpointSelector"`
	// NodeSelector (cluster-wide kinds only, instead of EndpointSelector)
	// makes the rule a host policy: its subject is the host endpoint of
	// every node whose Node object's labels it matches (hostpolicy.go).
	NodeSelector *labelSelector    `json:"nodeSelector"`
	Ingress      *[]cnpIngress     `json:"ingress"`
	Egress       *[]cnpEgress      `json:"egress"`
	IngressDeny  *[]cnpIngressDeny `json:"ingressDeny"`
	EgressDeny   *[]cnpEgressDeny  `json:"egressDeny"`
	Description  string            `json:"description"`
	// EnableDefaultDeny says per direction whether the rule puts the
	// endpoints it selects in default deny (default: yes for a direction
	// the rule has a section of).
	EnableDefaultDeny *defaultDeny `json:"enableDefaultDeny"`
}

type defaultDeny struct {
	Ingress *bool `json:"ingress"`
	Egress  *bool `json:"egress"`
}

type cnpIngress struct {
	FromEndpoints []labelSelector `json:"fromEndpoints"`
	FromCIDR      []string        `json:"fromCIDR"`
	FromCIDRSet   []cidrRule      `json:"fromCIDRSet"`
	FromEntities  []string        `json:"fromEntities"`
	FromNodes     []labelSelector `json:"fromNodes"`
	ToPorts       []portRule      `json:"toPorts"`
	ICMPs         []icmpRule      `json:"icmps"`
}

type cnpEgress struct {
	ToEndpoints []labelSelector `json:"toEndpoints"`
	ToCIDR      []string        `json:"toCIDR"`
	ToCIDRSet   []cidrRule      `json:"toCIDRSet"`
	ToEntities  []string        `json:"toEntities"`
	ToNodes     []labelSelector `json:"toNodes"`
	ToFQDNs     []fqdn.Selector `json:"toFQDNs"`
	ToServices  []serviceRule   `json:"toServices"`
	ToPorts     []portRule      `json:"toPorts"`
	ICMPs       []icmpRule      `json:"icmps"`
}

// cnpIngressDeny and cnpEgressDeny are the deny entries: the peers and
// ports of an allow entry without L7 rules (Cilium's IngressDenyRule and
// EgressDenyRule).
type cnpIngressDeny struct {
	FromEndpoints []labelSelector `json:"fromEndpoints"`
	FromCIDR      []string        `json:"fromCIDR"`
	FromCIDRSet   []cidrRule      `json:"fromCIDRSet"`
	FromEntities  []string        `json:"fromEntities"`
	FromNodes     []labelSelector `json:"fromNodes"`
	ToPorts       []portDenyRule  `json:"toPorts"`
	ICMPs         []icmpRule      `json:"icmps"`
}

type cnpEgressDeny struct {
	ToEndpoints []labelSelector `json:"toEndpoints"`
	ToCIDR      []string        `json:"toCIDR"`
	ToCIDRSet   []cidrRule      `json:"toCIDRSet"`
	ToEntities  []string        `json:"toEntities"`
	ToNodes     []labelSelector `json:"toNodes"`
	ToServices  []serviceRule   `json:"toServices"`
	ToPorts     []portDenyRule  `json:"toPorts"`
	ICMPs       []icmpRule      `json:"icmps"`
}

// portDenyRule is a deny entry's port rule: ports only.
type portDenyRule struct {
	Ports []portProtocol `json:"ports"`
}

// icmpRule is an entry's ICMP rule (Cilium's ICMPRule): the ICMP types
// it selects, each of one family.
type icmpRule struct {
	Fields []icmpField `json:"fields"`
}

type icmpField struct {
	Family string    `json:"family"`
	Type   portValue `json:"type"`
}

type cidrRule struct {
	CIDR   string   `json:"cidr"`
	Except []string `json:"except"`
}

type portRule struct {
	Ports []portProtocol `json:"ports"`
	Rules *l7Rules       `json:"rules"`
}

// l7Rules are a port rule's L7 rules: http, kafka or dns (l7proto is
// refused by name).
type l7Rules struct {
	HTTP  []HTTPRule      `json:"http"`
	Kafka []KafkaRule     `json:"kafka"`
	DNS   []fqdn.Selector `json:"dns"`
}

type portProtocol struct {
	Port     portValue `json:"port"`
	EndPort  int       `json:"endPort"`
	Protocol string    `json:"protocol"`
}

// labelSelector is a Kubernetes label selector.
type labelSelector struct {
	MatchLabels      map[string]string `json:"matchLabels"`
	MatchExpressions []labelExpression `json:"matchExpressions"`
}

type labelExpression struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values"`
}

// knpDoc is a Kubernetes NetworkPolicy (networking.k8s.io/v1).
type knpDoc struct {
	typeMeta
	Spec *knpSpec `json:"spec"`
}

type knpSpec struct {
	PodSelector *labelSelector `json:"podSelector"`
	PolicyTypes []string       `json:"policyTypes"`
	Ingress     *[]knpIngress  `json:"ingress"`
	Egress      *[]knpEgress   `json:"egress"`
}

type knpIngress struct {
	From  []knpPeer `json:"from"`
	Ports []knpPort `json:"ports"`
}

type knpEgress struct {
	To    []knpPeer `json:"to"`
	Ports []knpPort `json:"ports"`
}

type knpPeer struct {
	PodSelector       *labelSelector `json:"podSelector"`
	NamespaceSelector *labelSelector `json:"namespaceSelector"`
	IPBlock           *cidrRule      `json:"ipBlock"`
}

type knpPort struct {
	Protocol string    `json:"protocol"`
	Port     portValue `json:"port"`
	EndPort  int       `json:"endPort"`
}

// portValue is a port given as a number or a string ("8080"); a name
// ("http") is kept so that it can be refused with a clear message.
type portValue struct {
	set  bool
	num  int
	name string
}

// UnmarshalJSON accepts a number or a string.
func (p *portValue) UnmarshalJSON(b []byte) error {
	s := strings.TrimSpace(string(b))
	if s == "null" {
		return nil
	}
	p.set = true
	if strings.HasPrefix(s, "\"") {
		var str string
		if err := json.Unmarshal(b, &str); err != nil {
			return err
		}
		if n, err := strconv.Atoi(str); err == nil {
			p.num = n
			return nil
		}
		p.name = str
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("port %s is not an integer", s)
	}
	p.num = n
	return nil
}

// MarshalJSON writes the port back as given.
func (p portValue) MarshalJSON() ([]byte, error) {
	if p.name != "" {
		return json.Marshal(p.name)
	}
	return json.Marshal(p.num)
}
