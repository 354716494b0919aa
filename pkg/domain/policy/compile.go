package policy

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// Rule is one compiled rule: the endpoints Subject selects are
// default-deny in each enforced direction, and get the traffic of the
// peer rules of that direction.
type Rule struct {
	Subject *LabelSelector
	// Host: the rule is a host policy (nodeSelector): Subject selects
	// the host identity by the node's labels, and the rule applies to
	// the host endpoint only; the other rules never apply to it
	// (hostpolicy.go).
	Host                            bool
	IngressEnforced, EgressEnforced bool
	// IngressOpen and EgressOpen are set for a direction whose entries
	// apply without default deny (enableDefaultDeny false): the rule's
	// allows (L7 redirects) and denies hold, everything else the
	// direction allows unless another rule enforces it.
	IngressOpen, EgressOpen bool
	Ingress, Egress         []PeerRule
	// IngressDeny and EgressDeny deny what they match whatever any rule
	// allows (Cilium's precedence: a deny wins over every allow, of any
	// policy kind, however specific).
	IngressDeny, EgressDeny []PeerRule
}

// PeerRule allows (or, in a Rule's IngressDeny and EgressDeny, denies)
// traffic with Peers (or any peer when Any) on Ports (any port and
// protocol when empty).
type PeerRule struct {
	Any   bool
	Peers []Selector
	Ports []PortProto
	// HTTP, when not nil, redirects Ports to the L7 proxy, which allows
	// only requests matching one of the rules (toPorts[].rules.http[]).
	HTTP []HTTPRule
	// Kafka, when not nil, redirects Ports to the L7 proxy's Kafka
	// listener, which allows only requests matching the rules
	// (toPorts[].rules.kafka[], KafkaAllowed).
	Kafka []KafkaRule
	// DNS, when not nil, redirects Ports (egress) to the DNS proxy, which
	// lets the endpoint resolve only names matching one of the selectors
	// (toPorts[].rules.dns[]).
	DNS []fqdn.Selector
}

// PortProto is a destination port (0: any) and an IP protocol, or, when
// Name is set, a named port (Port 0): the port the destination pod
// declares under Name for Proto. An ingress named port resolves against
// the selected endpoint's own ports (MapState.ForPorts), an egress one
// against each peer identity's (Repository.SetEndpointPorts), and for a
// peer identity that is no endpoint's (world, reserved, CIDR) against
// every endpoint's (Repository.clusterPorts).
type PortProto struct {
	Port  uint16
	Proto uint8
	Name  string
}

// maxPortRange bounds the ports one port/endPort range expands to.
const maxPortRange = 1024

// compileCNP compiles the CNP-shaped kinds. A cluster-wide kind has no
// namespace and its selectors are not restricted to one. rf collects
// the entries refused in partial mode.
func compileCNP(d *cnpDoc, kind string, spec json.RawMessage, opts ParseOptions, rf *refusals) (*Policy, error) {
	clusterwide := Clusterwide(kind)
	if clusterwide && d.Metadata.Namespace != "" {
		return nil, fmt.Errorf("metadata.namespace: %q given, but %s is cluster-scoped", d.Metadata.Namespace, kind)
	}
	p, err := newPolicy(kind, d.Metadata, spec)
	if err != nil {
		return nil, err
	}
	if clusterwide {
		p.Namespace = ""
	}
	var rules []cnpRule
	base := "spec"
	switch {
	case d.Spec != nil && d.Specs != nil:
		return nil, fmt.Errorf("spec and specs: give one, not both")
	case d.Spec != nil:
		rules = []cnpRule{*d.Spec}
	case len(d.Specs) > 0:
		rules, base = d.Specs, "specs"
	default:
		return nil, fmt.Errorf("spec: missing")
	}
	for i, r := range rules {
		path := base
		if base == "specs" {
			path = fmt.Sprintf("specs[%d]", i)
		}
		c := cnpCompiler{ns: p.Namespace, nsFree: clusterwide, opts: opts, rf: rf}
		rule, err := c.rule(&r, path)
		if err != nil {
			return nil, err
		}
		p.Rules = append(p.Rules, rule)
	}
	return p, nil
}

func newPolicy(kind string, md objectMeta, spec json.RawMessage) (*Policy, error) {
	switch {
	case md.Name == "":
		return nil, fmt.Errorf("metadata.name: missing")
	case strings.ContainsAny(md.Name, "/ \t\n"), strings.ContainsAny(md.Namespace, "/ \t\n"):
		return nil, fmt.Errorf("metadata: name %q or namespace %q contains '/' or whitespace", md.Name, md.Namespace)
	}
	ns := md.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	return &Policy{Kind: kind, Name: md.Name, Namespace: ns, Labels: maps.Clone(md.Labels), Spec: spec,
		FromAPIServer: md.Annotations[SourceAnnotation] == "kubernetes"}, nil
}

// cnpCompiler compiles the rules of one CNP-shaped document.
type cnpCompiler struct {
	// ns is the policy's namespace; nsFree (cluster-wide) leaves its
	// selectors unrestricted, else they are confined to ns.
	ns     string
	nsFree bool
	opts   ParseOptions
	rf     *refusals
	// host: the rule being compiled is a host policy (nodeSelector).
	host bool
}

// subjectScope and peerScope say how the rule's subject and peer
// selectors are confined to the namespace.
func (c *cnpCompiler) subjectScope() nsScope {
	if c.nsFree {
		return scopeFree
	}
	return scopeConfined
}

func (c *cnpCompiler) peerScope() nsScope {
	if c.nsFree {
		return scopeFree
	}
	return scopePeer
}

// rule compiles one rule. An error in its subject refuses the document;
// an error in one ingress or egress entry refuses only that entry in
// partial mode (refuse.go).
func (c *cnpCompiler) rule(r *cnpRule, path string) (Rule, error) {
	subject, err := c.subject(r, path)
	if err != nil {
		return Rule{}, err
	}
	c.host = r.NodeSelector != nil
	// A direction with allow or deny entries is default-deny unless
	// enableDefaultDeny says otherwise (Cilium's default).
	rule := Rule{Subject: subject, Host: c.host, IngressEnforced: r.Ingress != nil || r.IngressDeny != nil,
		EgressEnforced: r.Egress != nil || r.EgressDeny != nil}
	if dd := r.EnableDefaultDeny; dd != nil {
		if dd.Ingress != nil && !*dd.Ingress && rule.IngressEnforced {
			rule.IngressEnforced, rule.IngressOpen = false, true
		}
		if dd.Egress != nil && !*dd.Egress && rule.EgressEnforced {
			rule.EgressEnforced, rule.EgressOpen = false, true
		}
	}
	inDenyOK, egDenyOK := true, true
	if r.IngressDeny != nil {
		in := *r.IngressDeny
		rule.IngressDeny, inDenyOK, err = c.denyEntries(path, "ingress", len(in), func(p string, i int) ([]PeerRule, error) {
			return c.denyPeers(p, "from", peerFields{in[i].FromEndpoints, in[i].FromCIDR, in[i].FromCIDRSet, in[i].FromEntities, in[i].FromNodes}, in[i].ToPorts, in[i].ICMPs)
		})
		if err != nil {
			return Rule{}, err
		}
	}
	if r.EgressDeny != nil {
		eg := *r.EgressDeny
		rule.EgressDeny, egDenyOK, err = c.denyEntries(path, "egress", len(eg), func(p string, i int) ([]PeerRule, error) {
			prs, err := c.denyPeers(p, "to", peerFields{eg[i].ToEndpoints, eg[i].ToCIDR, eg[i].ToCIDRSet, eg[i].ToEntities, eg[i].ToNodes}, eg[i].ToPorts, eg[i].ICMPs)
			if err != nil {
				return nil, err
			}
			return withServices(prs, eg[i].ToServices, len(eg[i].ToEndpoints)+len(eg[i].ToCIDR)+len(eg[i].ToCIDRSet)+len(eg[i].ToEntities)+len(eg[i].ToNodes), p)
		})
		if err != nil {
			return Rule{}, err
		}
	}
	if c.rf.refused(path+".ingress") || !inDenyOK {
		rule.IngressEnforced, rule.IngressOpen = true, false
	} else if r.Ingress != nil {
		in := *r.Ingress
		rule.Ingress, err = c.entries(path+".ingress", len(in), func(p string, i int) ([]PeerRule, error) {
			return c.peers(p, "from", peerFields{in[i].FromEndpoints, in[i].FromCIDR, in[i].FromCIDRSet, in[i].FromEntities, in[i].FromNodes}, in[i].ToPorts, in[i].ICMPs)
		})
		if err != nil {
			return Rule{}, err
		}
	}
	if c.rf.refused(path+".egress") || !egDenyOK {
		rule.EgressEnforced, rule.EgressOpen = true, false
	} else if r.Egress != nil {
		eg := *r.Egress
		rule.Egress, err = c.entries(path+".egress", len(eg), func(p string, i int) ([]PeerRule, error) {
			prs, err := c.peers(p, "to", peerFields{eg[i].ToEndpoints, eg[i].ToCIDR, eg[i].ToCIDRSet, eg[i].ToEntities, eg[i].ToNodes}, eg[i].ToPorts, eg[i].ICMPs)
			if err != nil {
				return nil, err
			}
			if len(eg[i].ToServices) > 0 && len(eg[i].ToFQDNs) > 0 {
				return nil, fmt.Errorf("%s.toServices: cannot be combined with toFQDNs in one egress entry", p)
			}
			if prs, err = withServices(prs, eg[i].ToServices, len(eg[i].ToEndpoints)+len(eg[i].ToCIDR)+len(eg[i].ToCIDRSet)+len(eg[i].ToEntities)+len(eg[i].ToNodes), p); err != nil {
				return nil, err
			}
			return withFQDNs(prs, eg[i], p)
		})
		if err != nil {
			return Rule{}, err
		}
	}
	return rule, nil
}

// denyEntries compiles the n deny entries of direction dir (ingress or
// egress) of the rule at path. A deny entry narrows the other entries,
// so one refused in partial mode refuses the rule's whole direction
// (ok false: it then allows nothing, see refuse.go); the deny entries
// that compiled stay in force.
func (c *cnpCompiler) denyEntries(path, dir string, n int, entry func(p string, i int) ([]PeerRule, error)) (_ []PeerRule, ok bool, _ error) {
	var out []PeerRule
	ok = true
	for i := range n {
		p := fmt.Sprintf("%s.%sDeny[%d]", path, dir, i)
		prs, err := entry(p, i)
		if err != nil {
			if !c.rf.refuse(path+"."+dir, err) {
				return nil, false, err
			}
			ok = false
			continue
		}
		out = append(out, prs...)
	}
	return out, ok, nil
}

// denyPeers compiles one deny entry: its peers on its ports (toPorts
// without L7 rules) or ICMP types.
func (c *cnpCompiler) denyPeers(path, dir string, f peerFields, ports []portDenyRule, icmps []icmpRule) ([]PeerRule, error) {
	pr, err := c.compilePeers(path, dir, f)
	if err != nil {
		return nil, err
	}
	if len(ports) > 0 && len(icmps) > 0 {
		return nil, fmt.Errorf("%s: icmps and toPorts in one entry (give each its own entry)", path)
	}
	for i, p := range ports {
		got, err := compilePortRule(portRule{Ports: p.Ports}, fmt.Sprintf("%s.toPorts[%d]", path, i))
		if err != nil {
			return nil, err
		}
		pr.Ports = append(pr.Ports, got...)
	}
	if err := c.checkNamedDeny(pr, path); err != nil {
		return nil, err
	}
	if pr.Ports, err = appendICMPs(pr.Ports, icmps, path); err != nil {
		return nil, err
	}
	if len(pr.Ports) == 0 && (len(ports) > 0 || len(icmps) > 0) {
		return nil, nil // toPorts: [{ports: []}]: denies nothing
	}
	return []PeerRule{pr}, nil
}

// checkNamedDeny refuses what a deny entry at path on a named port
// cannot resolve. Cilium resolves a deny's named port as an allow's (the
// same L4Filter, toMapState's GetNamedPort): on ingress the endpoint's own
// port, on egress the destination's, which Membrane resolves per
// destination identity, and for an identity that is no endpoint's
// (world, CIDR identities: an address declares no ports) and a CIDR
// peer's entries to the numbers the cluster's endpoints give the name
// (appendKeys, addCIDRGroups). A host rule's named ports are
// refused as in allow entries (the node declares none).
func (c *cnpCompiler) checkNamedDeny(pr PeerRule, path string) error {
	if !hasNamedPort(pr.Ports) || !c.host {
		return nil
	}
	return checkHostEntry([]PeerRule{pr}, path)
}

func appendICMPs(ports []PortProto, icmps []icmpRule, path string) ([]PortProto, error) {
	if len(icmps) == 0 {
		return ports, nil
	}
	got, err := compileICMPs(icmps, path)
	if err != nil {
		return nil, err
	}
	return append(ports, got...), nil
}

// entries compiles the n entries of one direction at path with entry
// (given each entry's path and index): an entry refused by the refusal
// policy (or whose L7 and DNS rules no proxy can enforce) is left out,
// any other error fails the rule.
func (c *cnpCompiler) entries(path string, n int, entry func(p string, i int) ([]PeerRule, error)) ([]PeerRule, error) {
	var out []PeerRule
	for i := range n {
		p := fmt.Sprintf("%s[%d]", path, i)
		if c.rf.refused(p) {
			continue
		}
		prs, err := entry(p, i)
		if err == nil {
			err = c.checkProxies(prs, p)
		}
		if err == nil && c.host {
			err = checkHostEntry(prs, p)
		}
		if err != nil {
			if c.rf.refuse(p, err) {
				continue
			}
			return nil, err
		}
		out = append(out, prs...)
	}
	return out, nil
}

// checkProxies refuses the L7 and DNS rules of an entry at path that no
// proxy of this agent can enforce (ParseOptions.NoL7, NoDNSProxy).
func (c *cnpCompiler) checkProxies(prs []PeerRule, path string) error {
	for _, pr := range prs {
		switch {
		case c.opts.NoL7 && pr.HTTP != nil:
			return fmt.Errorf("%s.toPorts: rules.http needs the L7 proxy (start the agent with --l7-proxy)", path)
		case c.opts.NoL7 && pr.Kafka != nil:
			return fmt.Errorf("%s.toPorts: rules.kafka needs the L7 proxy (start the agent with --l7-proxy)", path)
		case c.opts.NoDNSProxy && (pr.DNS != nil || slices.ContainsFunc(pr.Peers, func(s Selector) bool { _, ok := s.(*FQDNSelector); return ok })):
			return fmt.Errorf("%s: toFQDNs and toPorts[].rules.dns need the DNS proxy (start the agent with --dns-proxy)", path)
		}
	}
	return nil
}

// peers compiles one ingress or egress entry: one peer rule
// for its L4 ports, and one per toPorts entry with L7 rules.
func (c *cnpCompiler) peers(path, dir string, f peerFields, ports []portRule, icmps []icmpRule) ([]PeerRule, error) {
	pr, err := c.compilePeers(path, dir, f)
	if err != nil {
		return nil, err
	}
	if len(icmps) > 0 {
		if len(ports) > 0 {
			return nil, fmt.Errorf("%s: icmps and toPorts in one entry (give each its own entry)", path)
		}
		pr.Ports, err = appendICMPs(nil, icmps, path)
		return []PeerRule{pr}, err
	}
	var out []PeerRule
	l4 := pr
	for i, p := range ports {
		pp := fmt.Sprintf("%s.toPorts[%d]", path, i)
		got, err := compilePortRule(p, pp)
		if err != nil {
			return nil, err
		}
		if p.Rules == nil {
			l4.Ports = append(l4.Ports, got...)
			continue
		}
		l7 := pr
		l7.Ports = got
		if p.Rules.DNS != nil {
			if dir != "to" {
				return nil, fmt.Errorf("%s.rules.dns: DNS rules are egress rules", pp)
			}
			if l7.DNS, err = compileDNSRules(p.Rules, pp+".rules"); err != nil {
				return nil, err
			}
		} else if p.Rules.Kafka != nil {
			if l7.Kafka, err = compileKafkaRules(p.Rules, pp+".rules"); err != nil {
				return nil, err
			}
		} else if l7.HTTP, err = c.compileHTTPRules(p.Rules, pp+".rules"); err != nil {
			return nil, err
		}
		out = append(out, l7)
	}
	if len(ports) == 0 || len(l4.Ports) > 0 {
		out = append([]PeerRule{l4}, out...)
	}
	return out, nil
}

func compilePortRule(p portRule, path string) ([]PortProto, error) {
	var out []PortProto
	for j, pp := range p.Ports {
		got, err := compilePort(pp.Port, pp.EndPort, pp.Protocol, "ANY", fmt.Sprintf("%s.ports[%d]", path, j))
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
	}
	if p.Rules == nil {
		return out, nil
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s.rules: L7 rules need at least one port", path)
	}
	// A named port takes its L7 rules along: egress resolves it per peer
	// identity (appendKeys), ingress per endpoint (MapState.ForPorts).
	if p.Rules.DNS != nil {
		return dnsPorts(out, path)
	}
	for _, pp := range out {
		if (pp.Port == 0 && pp.Name == "") || pp.Proto != ProtoTCP {
			return nil, fmt.Errorf("%s.ports: L7 rules need TCP ports (give protocol: TCP and a port)", path)
		}
	}
	return out, nil
}

func (c *cnpCompiler) compileHTTPRules(r *l7Rules, path string) ([]HTTPRule, error) {
	if r.HTTP == nil {
		return nil, fmt.Errorf("%s.http: missing (http, kafka or dns are the supported L7 protocols)", path)
	}
	if len(r.HTTP) > maxHTTPRules {
		return nil, fmt.Errorf("%s.http: %d rules, more than %d", path, len(r.HTTP), maxHTTPRules)
	}
	out := make([]HTTPRule, 0, max(len(r.HTTP), 1))
	for i, h := range r.HTTP {
		hp := fmt.Sprintf("%s.http[%d]", path, i)
		if _, err := CompileHTTPRule(h, hp); err != nil {
			return nil, err
		}
		var err error
		if h.HeaderMatches, err = c.secretRefs(h.HeaderMatches, hp); err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	if len(out) == 0 {
		out = append(out, HTTPRule{}) // http: [] allows every request, through the proxy
	}
	return out, nil
}

// secretRefs gives every headerMatches secret of hms its namespace (the
// policy's when none is named, as in Cilium) and refuses a secret outside
// ParseOptions.SecretsNamespace: the agent reads that namespace only, so
// that a policy cannot make it read another namespace's Secrets. Returns
// a copy; hms is not changed.
func (c *cnpCompiler) secretRefs(hms []HeaderMatch, path string) ([]HeaderMatch, error) {
	if !slices.ContainsFunc(hms, func(h HeaderMatch) bool { return h.Secret != nil }) {
		return hms, nil
	}
	out := slices.Clone(hms)
	for i, h := range out {
		if h.Secret == nil {
			continue
		}
		sp := fmt.Sprintf("%s.headerMatches[%d].secret", path, i)
		ref := *h.Secret
		if ref.Namespace == "" {
			ref.Namespace = c.ns
		}
		switch {
		case c.opts.SecretsNamespace == "":
			return nil, fmt.Errorf("%s: header secrets are read in Kubernetes mode only, from the namespace --policy-secrets-namespace names (give the value instead)", sp)
		case ref.Namespace == "":
			return nil, fmt.Errorf("%s: namespace missing (a cluster-wide policy names the secret's namespace, %q)", sp, c.opts.SecretsNamespace)
		case ref.Namespace != c.opts.SecretsNamespace:
			return nil, fmt.Errorf("%s: %s is outside the policy secrets namespace %q (--policy-secrets-namespace): the agent reads Secrets from that namespace only", sp, ref, c.opts.SecretsNamespace)
		}
		out[i].Secret = &ref
	}
	return out, nil
}

// peerFields are an entry's peers: fromEndpoints, fromCIDR,
// fromCIDRSet, fromEntities and fromNodes (or the to* ones).
type peerFields struct {
	eps      []labelSelector
	cidrs    []string
	sets     []cidrRule
	entities []string
	nodes    []labelSelector
}

// compilePeers compiles an entry's peers; fromNodes/toNodes need
// ParseOptions.NodeSelectorLabels.
func (c *cnpCompiler) compilePeers(path, dir string, f peerFields) (PeerRule, error) {
	pr, err := compilePeers(path, c.ns, c.peerScope(), dir, f.eps, f.cidrs, f.sets, f.entities)
	if err != nil || len(f.nodes) == 0 {
		return pr, err
	}
	if !c.opts.NodeSelectorLabels {
		return pr, fmt.Errorf("%s.%sNodes: needs --enable-node-selector-labels (as in Cilium: without it nodes have no identities of their own to select)", path, dir)
	}
	for i := range f.nodes {
		s, err := compileNodeSelector(&f.nodes[i], fmt.Sprintf("%s.%sNodes[%d]", path, dir, i))
		if err != nil {
			return pr, err
		}
		pr.Peers = append(pr.Peers, s)
	}
	if len(f.eps)+len(f.cidrs)+len(f.sets)+len(f.entities) == 0 {
		pr.Any = false // the nodes are the peers
	}
	if pr.Any {
		pr.Peers = nil
	}
	return pr, nil
}

// compileNodeSelector compiles a fromNodes/toNodes selector as Cilium
// does: its keys name Node labels (source node: a bare key or
// "node:key"), and it selects only other nodes' identities
// (reserved:remote-node).
func compileNodeSelector(ls *labelSelector, path string) (*LabelSelector, error) {
	sel, err := compileSelector(ls, path, "", scopeFree)
	if err != nil {
		return nil, err
	}
	reqs := make([]Requirement, 0, len(sel.Reqs)+1)
	for _, r := range sel.Reqs {
		if r.Source != labels.SourceAny && r.Source != SourceNode {
			return nil, fmt.Errorf("%s: label key %s:%s: node selectors match Node labels (source %s)", path, r.Source, r.Key, SourceNode)
		}
		r.Source = SourceNode
		reqs = append(reqs, r)
	}
	reqs = append(reqs, Requirement{Source: labels.SourceReserved, Key: EntityRemoteNode, Op: OpExists})
	return NewLabelSelector(reqs), nil
}

func compilePeers(path, ns string, scope nsScope, dir string, eps []labelSelector, cidrs []string, sets []cidrRule, entities []string) (PeerRule, error) {
	var pr PeerRule
	for i := range eps {
		s, err := compileSelector(&eps[i], fmt.Sprintf("%s.%sEndpoints[%d]", path, dir, i), ns, scope)
		if err != nil {
			return pr, err
		}
		pr.Peers = append(pr.Peers, s)
	}
	for i, c := range cidrs {
		s, err := compileCIDR(cidrRule{CIDR: c})
		if err != nil {
			return pr, fmt.Errorf("%s.%sCIDR[%d]%w", path, dir, i, err)
		}
		pr.Peers = append(pr.Peers, s)
	}
	for i, c := range sets {
		s, err := compileCIDR(c)
		if err != nil {
			return pr, fmt.Errorf("%s.%sCIDRSet[%d]%w", path, dir, i, err)
		}
		pr.Peers = append(pr.Peers, s)
	}
	for i, e := range entities {
		switch e {
		case EntityAll:
			pr.Any = true
		case EntityWorld, EntityHost, EntityCluster, EntityHealth, EntityInit, EntityUnmanaged, EntityRemoteNode, EntityKubeAPIServer, EntityIngress:
			pr.Peers = append(pr.Peers, &EntitySelector{Entity: e})
		default:
			return pr, fmt.Errorf("%s.%sEntities[%d]: unsupported entity %q (want world, host, cluster, remote-node, kube-apiserver, health, init, unmanaged, ingress or all)", path, dir, i, e)
		}
	}
	if len(eps)+len(cidrs)+len(sets)+len(entities) == 0 {
		pr.Any = true // only ports (or nothing): any peer
	}
	if pr.Any {
		pr.Peers = nil
	}
	return pr, nil
}

// compilePort expands a port, an optional endPort and a protocol into
// keys. ANY means TCP, UDP and SCTP (any protocol when the port is 0).
func compilePort(port portValue, end int, proto, defProto, path string) ([]PortProto, error) {
	if port.name != "" {
		return compileNamedPort(port.name, end, proto, defProto, path)
	}
	if port.num < 0 || port.num > 65535 {
		return nil, fmt.Errorf("%s.port: %d outside 0..65535", path, port.num)
	}
	if proto == "" {
		proto = defProto
	}
	var protos []uint8
	switch strings.ToUpper(proto) {
	case "TCP":
		protos = []uint8{ProtoTCP}
	case "UDP":
		protos = []uint8{ProtoUDP}
	case "SCTP":
		protos = []uint8{ProtoSCTP}
	case "ANY":
		if port.num == 0 {
			return []PortProto{{Port: 0, Proto: ProtoAny}}, nil
		}
		protos = []uint8{ProtoTCP, ProtoUDP, ProtoSCTP}
	default:
		return nil, fmt.Errorf("%s.protocol: unsupported protocol %q (want TCP, UDP, SCTP or ANY)", path, proto)
	}
	last := port.num
	if end != 0 {
		switch {
		case port.num == 0:
			return nil, fmt.Errorf("%s.endPort: needs a port", path)
		case end < port.num || end > 65535:
			return nil, fmt.Errorf("%s.endPort: %d not within %d..65535", path, end, port.num)
		case end-port.num+1 > maxPortRange:
			return nil, fmt.Errorf("%s.endPort: range %d-%d has more than %d ports", path, port.num, end, maxPortRange)
		}
		last = end
	}
	var out []PortProto
	for _, pr := range protos {
		for n := port.num; n <= last; n++ {
			out = append(out, PortProto{Port: uint16(n), Proto: pr})
		}
	}
	return out, nil
}

// compileNamedPort compiles a named port: one key per protocol (ANY is
// TCP, UDP and SCTP), the name checked as Kubernetes checks it. endPort
// needs a numeric port, as in Kubernetes.
func compileNamedPort(name string, end int, proto, defProto, path string) ([]PortProto, error) {
	if err := ValidatePortName(name); err != nil {
		return nil, fmt.Errorf("%s.port: %w", path, err)
	}
	if end != 0 {
		return nil, fmt.Errorf("%s.endPort: needs a numeric port, not the named port %q", path, name)
	}
	if proto == "" {
		proto = defProto
	}
	var protos []uint8
	switch strings.ToUpper(proto) {
	case "ANY":
		protos = []uint8{ProtoTCP, ProtoUDP, ProtoSCTP}
	default:
		p, err := ParsePortProtocol(proto)
		if err != nil {
			return nil, fmt.Errorf("%s.protocol: unsupported protocol %q (want TCP, UDP, SCTP or ANY)", path, proto)
		}
		protos = []uint8{p}
	}
	out := make([]PortProto, len(protos))
	for i, p := range protos {
		out[i] = PortProto{Proto: p, Name: name}
	}
	return out, nil
}

// compileCIDR compiles a cidr and its excepts; an error starts with the
// field's path below the rule (".cidr: ...", ".except[1]: ...").
func compileCIDR(c cidrRule) (*CIDRSelector, error) {
	p, err := parseCIDR(c.CIDR)
	if err != nil {
		return nil, fmt.Errorf(".cidr: %w", err)
	}
	s := &CIDRSelector{Prefix: p}
	for i, e := range c.Except {
		ep, err := parseCIDR(e)
		if err != nil {
			return nil, fmt.Errorf(".except[%d]: %w", i, err)
		}
		if !contains(p, ep) {
			return nil, fmt.Errorf(".except[%d]: %s is not inside %s", i, ep, p)
		}
		s.Except = append(s.Except, ep)
	}
	slices.SortFunc(s.Except, func(a, b netip.Prefix) int { return strings.Compare(a.String(), b.String()) })
	s.Except = slices.Compact(s.Except)
	s.key = s.buildKey()
	return s, nil
}

// parseCIDR parses a prefix (masked) or a bare address (a host prefix).
func parseCIDR(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR or an address", s)
		}
		return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR", s)
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("%q: IPv4-mapped IPv6 prefixes are not supported", s)
	}
	return p.Masked(), nil
}

// nsScope says how compileSelector confines a selector to the policy's
// namespace.
type nsScope int

const (
	// scopeConfined always adds namespace == ns (ANDed with whatever the
	// selector says, its own namespace terms included): the subject of
	// a namespaced policy, and a NetworkPolicy peer's podSelector
	// without namespaceSelector. A namespaced policy never selects, or
	// through a bare podSelector admits, pods of another namespace (the
	// Kubernetes spec; Cilium forces the policy's namespace into a CNP's
	// endpointSelector).
	scopeConfined nsScope = iota
	// scopePeer confines a namespaced CNP's peer selector unless it
	// names the namespace label itself or only reserved labels, as
	// Cilium does for fromEndpoints/toEndpoints: such a peer may select
	// other namespaces (allowing traffic, never selecting subjects).
	scopePeer
	// scopeFree adds nothing: cluster-wide policies, and the pod part of
	// a NetworkPolicy peer whose namespaceSelector gives the namespaces.
	scopeFree
)

// compileSelector turns a label selector into requirements, confined to
// namespace ns as scope says.
func compileSelector(ls *labelSelector, path, ns string, scope nsScope) (*LabelSelector, error) {
	var reqs []Requirement
	for _, k := range slices.Sorted(maps.Keys(ls.MatchLabels)) {
		src, key, err := selectorKey(k, path+".matchLabels")
		if err != nil {
			return nil, err
		}
		v := ls.MatchLabels[k]
		if err := (labels.Label{Source: "x", Key: "x", Value: v}).Validate(); err != nil {
			return nil, fmt.Errorf("%s.matchLabels[%q]: %w", path, k, err)
		}
		reqs = append(reqs, Requirement{Source: src, Key: key, Op: OpIn, Values: []string{v}})
	}
	for i, e := range ls.MatchExpressions {
		p := fmt.Sprintf("%s.matchExpressions[%d]", path, i)
		src, key, err := selectorKey(e.Key, p+".key")
		if err != nil {
			return nil, err
		}
		op := Operator(e.Operator)
		if err := checkOperator(op, e.Values, p); err != nil {
			return nil, err
		}
		reqs = append(reqs, Requirement{Source: src, Key: key, Op: op, Values: e.Values})
	}
	sel := NewLabelSelector(reqs)
	confine := false
	switch scope {
	case scopeConfined:
		confine = true
	case scopePeer:
		reserved := len(reqs) > 0 && !slices.ContainsFunc(reqs, func(r Requirement) bool { return r.Source != labels.SourceReserved })
		confine = !reserved && !sel.HasKey(NamespaceLabel)
	}
	if confine {
		reqs = append(reqs, nsRequirement(ns))
		sel = NewLabelSelector(reqs)
	}
	return sel, nil
}

func nsRequirement(ns string) Requirement {
	return Requirement{Source: labels.SourceK8s, Key: NamespaceLabel, Op: OpIn, Values: []string{ns}}
}

// selectorKey splits "source:key" (a source matching [a-z0-9-]+) or a
// bare "key" (any source).
func selectorKey(k, path string) (source, key string, err error) {
	source, key = labels.SourceAny, k
	if i := strings.IndexByte(k, ':'); i > 0 {
		if l := (labels.Label{Source: k[:i], Key: "x"}); l.Validate() == nil {
			source, key = k[:i], k[i+1:]
		}
	}
	if err := (labels.Label{Source: source, Key: key}).Validate(); err != nil {
		return "", "", fmt.Errorf("%s: label key %q: %w", path, k, err)
	}
	return source, key, nil
}

// checkOperator validates a matchExpressions entry at path p: In and
// NotIn need values, Exists and DoesNotExist take none.
func checkOperator(op Operator, values []string, p string) error {
	switch op {
	case OpIn, OpNotIn:
		if len(values) == 0 {
			return fmt.Errorf("%s.values: %s needs at least one value", p, op)
		}
	case OpExists, OpDoesNotExist:
		if len(values) > 0 {
			return fmt.Errorf("%s.values: %s takes no values", p, op)
		}
	default:
		return fmt.Errorf("%s.operator: unsupported operator %q (want In, NotIn, Exists or DoesNotExist)", p, string(op))
	}
	return nil
}
