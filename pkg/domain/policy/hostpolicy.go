package policy

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// Host policies (Cilium's host firewall). A rule of a cluster-wide kind
// with nodeSelector instead of endpointSelector applies to the host
// endpoint: the node itself, identity host, whose labels are reserved:host
// plus its Node object's labels (source k8s, HostLabels). Its subject
// selector is the nodeSelector with reserved:host required, and a host
// rule applies to the host identity only, an endpoint rule never to it
// (Repository.compute), so endpointSelector: {} does not select the node
// and nodeSelector: {} selects every node. The host endpoint's MapState
// is computed like a pod's; its entries are L3/L4 only: L7 rules,
// toFQDNs and named ports are refused in host rules, as Cilium refuses
// L7 host policies (the proxies serve pods).

// hostRequirement is the requirement every host rule's subject has: it
// selects the host identity only.
var hostRequirement = Requirement{Source: labels.SourceReserved, Key: "host", Op: OpExists}

// subject compiles a rule's subject: its endpointSelector, or its
// nodeSelector (a host rule) in a cluster-wide document.
func (c *cnpCompiler) subject(r *cnpRule, path string) (*LabelSelector, error) {
	switch {
	case r.NodeSelector != nil && r.EndpointSelector != nil:
		return nil, fmt.Errorf("%s: endpointSelector and nodeSelector: give one, not both", path)
	case r.NodeSelector != nil && !c.nsFree:
		return nil, fmt.Errorf("%s.nodeSelector: only cluster-wide policies (%s, %s) select nodes", path, KindCCNP, KindMCNP)
	case r.NodeSelector != nil:
		sel, err := compileSelector(r.NodeSelector, path+".nodeSelector", "", scopeFree)
		if err != nil {
			return nil, err
		}
		return NewLabelSelector(append(slices.Clone(sel.Reqs), hostRequirement)), nil
	case r.EndpointSelector == nil:
		return nil, fmt.Errorf("%s.endpointSelector: missing", path)
	}
	return compileSelector(r.EndpointSelector, path+".endpointSelector", c.ns, c.subjectScope())
}

// checkHostEntry refuses what a host rule's entry at path cannot
// enforce: L7 (http, kafka, dns) rules, toFQDNs and named ports.
func checkHostEntry(prs []PeerRule, path string) error {
	for _, pr := range prs {
		switch {
		case pr.HTTP != nil || pr.Kafka != nil || pr.DNS != nil:
			return fmt.Errorf("%s.toPorts: L7 rules are not supported in host policies (nodeSelector), as in Cilium", path)
		case slices.ContainsFunc(pr.Peers, func(s Selector) bool { _, ok := s.(*FQDNSelector); return ok }):
			return fmt.Errorf("%s.toFQDNs: not supported in host policies (nodeSelector): the DNS proxy serves pods", path)
		case slices.ContainsFunc(pr.Ports, func(p PortProto) bool { return p.Name != "" }):
			return fmt.Errorf("%s.toPorts: named ports are not supported in host policies (nodeSelector); use a number", path)
		}
	}
	return nil
}

// HostLabels are the host identity's labels on a node whose Node object
// carries nodeLabels: reserved:host and each node label with source k8s.
// A label the agent cannot hold (labels.Label.Validate) is left out and
// named in the error; the others are returned.
func HostLabels(nodeLabels map[string]string) (labels.Labels, error) {
	ls := []labels.Label{{Source: labels.SourceReserved, Key: "host"}}
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(nodeLabels)) {
		l := labels.Label{Source: labels.SourceK8s, Key: k, Value: nodeLabels[k]}
		if err := l.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("node label %q: %w", k, err))
			continue
		}
		ls = append(ls, l)
	}
	out, err := labels.New(ls...)
	if err != nil {
		return labels.Labels{ls[0]}, err
	}
	return out, errors.Join(errs...)
}

// appliesTo reports whether rule applies to identity id: host rules to
// the host identity only, the others to every identity but it.
func appliesTo(rule *Rule, id identity.NumericIdentity) bool {
	return rule.Host == (id == identity.ReservedHost)
}

// SourceNode is the label source of a node's labels on its per-node
// identity (--enable-node-selector-labels), as in Cilium: fromNodes and
// toNodes select "node:<key>=<value>".
const SourceNode = "node"

// NodeIdentityLabels is the label set of another node's identity with
// --enable-node-selector-labels: reserved:remote-node (the remote-node
// entity keeps selecting it) and each of its Node labels with source
// node. Labels that are not valid label keys or values are left out
// (the error names them).
func NodeIdentityLabels(nodeLabels map[string]string) (labels.Labels, error) {
	ls := []labels.Label{{Source: labels.SourceReserved, Key: EntityRemoteNode}}
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(nodeLabels)) {
		l := labels.Label{Source: SourceNode, Key: k, Value: nodeLabels[k]}
		if err := l.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("node label %q: %w", k, err))
			continue
		}
		ls = append(ls, l)
	}
	out, err := labels.New(ls...)
	if err != nil {
		return labels.Labels{ls[0]}, err
	}
	return out, errors.Join(errs...)
}
