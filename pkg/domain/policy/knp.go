package policy

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// compileKNP compiles a Kubernetes NetworkPolicy. policyTypes defaults
// as in Kubernetes: Ingress always, Egress when the egress list has an
// entry (an absent or empty egress leaves egress open). The podSelector
// is always confined to the policy's namespace. An error in the
// podSelector or policyTypes refuses the document; one in an ingress or
// egress entry refuses only that entry in partial mode (refuse.go).
func compileKNP(d *knpDoc, spec json.RawMessage, opts ParseOptions, rf *refusals) (*Policy, error) {
	p, err := newPolicy(KindKNP, d.Metadata, spec)
	if err != nil {
		return nil, err
	}
	if d.Spec == nil {
		return nil, fmt.Errorf("spec: missing")
	}
	s := d.Spec
	podSel := s.PodSelector
	if podSel == nil {
		podSel = &labelSelector{}
	}
	subject, err := compileSelector(podSel, "spec.podSelector", p.Namespace, scopeConfined)
	if err != nil {
		return nil, err
	}
	rule := Rule{Subject: subject}
	if len(s.PolicyTypes) == 0 {
		rule.IngressEnforced, rule.EgressEnforced = true, s.Egress != nil && len(*s.Egress) > 0
	}
	for i, t := range s.PolicyTypes {
		switch t {
		case "Ingress":
			rule.IngressEnforced = true
		case "Egress":
			rule.EgressEnforced = true
		default:
			return nil, fmt.Errorf("spec.policyTypes[%d]: unsupported policy type %q (want Ingress or Egress)", i, t)
		}
	}
	if s.Ingress != nil && len(*s.Ingress) > 0 && !rule.IngressEnforced {
		return nil, fmt.Errorf("spec.ingress: present but spec.policyTypes does not list Ingress")
	}
	if s.Egress != nil && len(*s.Egress) > 0 && !rule.EgressEnforced {
		return nil, fmt.Errorf("spec.egress: present but spec.policyTypes does not list Egress")
	}
	if rf.refused("spec.ingress") {
		rule.IngressEnforced = true
	} else if s.Ingress != nil {
		for i, in := range *s.Ingress {
			path := fmt.Sprintf("spec.ingress[%d]", i)
			if rf.refused(path) {
				continue
			}
			pr, err := compileKNPPeers(path, "from", p.Namespace, in.From, in.Ports, opts.NamespaceLabels)
			if err != nil {
				if rf.refuse(path, err) {
					continue
				}
				return nil, err
			}
			rule.Ingress = append(rule.Ingress, pr)
		}
	}
	if rf.refused("spec.egress") {
		rule.EgressEnforced = true
	} else if s.Egress != nil {
		for i, eg := range *s.Egress {
			path := fmt.Sprintf("spec.egress[%d]", i)
			if rf.refused(path) {
				continue
			}
			pr, err := compileKNPPeers(path, "to", p.Namespace, eg.To, eg.Ports, opts.NamespaceLabels)
			if err != nil {
				if rf.refuse(path, err) {
					continue
				}
				return nil, err
			}
			rule.Egress = append(rule.Egress, pr)
		}
	}
	p.Rules = []Rule{rule}
	return p, nil
}

func compileKNPPeers(path, dir, ns string, peers []knpPeer, ports []knpPort, nsLabels bool) (PeerRule, error) {
	pr := PeerRule{Any: len(peers) == 0}
	for i, peer := range peers {
		pp := fmt.Sprintf("%s.%s[%d]", path, dir, i)
		s, err := compileKNPPeer(&peer, pp, ns, nsLabels)
		if err != nil {
			return pr, err
		}
		pr.Peers = append(pr.Peers, s)
	}
	for i, port := range ports {
		got, err := compilePort(port.Port, port.EndPort, port.Protocol, "TCP", fmt.Sprintf("%s.ports[%d]", path, i))
		if err != nil {
			return pr, err
		}
		pr.Ports = append(pr.Ports, got...)
	}
	return pr, nil
}

func compileKNPPeer(peer *knpPeer, path, ns string, nsLabels bool) (Selector, error) {
	switch {
	case peer.IPBlock != nil && (peer.PodSelector != nil || peer.NamespaceSelector != nil):
		return nil, fmt.Errorf("%s: ipBlock cannot be combined with podSelector or namespaceSelector", path)
	case peer.IPBlock != nil:
		s, err := compileCIDR(*peer.IPBlock)
		if err != nil {
			return nil, fmt.Errorf("%s.ipBlock%w", path, err)
		}
		return s, nil
	case peer.PodSelector == nil && peer.NamespaceSelector == nil:
		return nil, fmt.Errorf("%s: needs podSelector, namespaceSelector or ipBlock", path)
	case peer.NamespaceSelector == nil:
		return compileSelector(peer.PodSelector, path+".podSelector", ns, scopeConfined)
	}
	nsReqs, err := namespaceRequirements(peer.NamespaceSelector, path+".namespaceSelector", nsLabels)
	if err != nil {
		return nil, err
	}
	if peer.PodSelector == nil {
		return NewLabelSelector(nsReqs), nil
	}
	pod, err := compileSelector(peer.PodSelector, path+".podSelector", ns, scopeFree)
	if err != nil {
		return nil, err
	}
	if pod.HasKey(NamespaceLabel) {
		return nil, fmt.Errorf("%s.podSelector: names %s; use namespaceSelector", path, NamespaceLabel)
	}
	return NewLabelSelector(append(slices.Clone(pod.Reqs), nsReqs...)), nil
}

// namespaceRequirements translates a namespaceSelector. kubernetes.io/
// metadata.name matches the namespace name every pod endpoint carries;
// with nsLabels any other key matches the namespace label copied onto the
// endpoint (NamespaceLabelsPrefix + key), without it such a key is
// refused (endpoints carry only their namespace name). The result always
// requires a namespace (so it never selects the host or world).
func namespaceRequirements(ls *labelSelector, path string, nsLabels bool) ([]Requirement, error) {
	reqs := []Requirement{{Source: labels.SourceK8s, Key: NamespaceLabel, Op: OpExists}}
	keyOf := func(p, key string) (string, error) {
		switch {
		case key == K8sNamespaceNameLabel:
			return NamespaceLabel, nil
		case !nsLabels:
			return "", fmt.Errorf("%s: namespace label %q cannot be matched: endpoints carry only their namespace name (use %s)", p, key, K8sNamespaceNameLabel)
		}
		if err := (labels.Label{Source: labels.SourceK8s, Key: NamespaceLabelsPrefix + key}).Validate(); err != nil {
			return "", fmt.Errorf("%s: namespace label %q: %w", p, key, err)
		}
		return NamespaceLabelsPrefix + key, nil
	}
	for _, k := range slices.Sorted(maps.Keys(ls.MatchLabels)) {
		key, err := keyOf(path+".matchLabels", k)
		if err != nil {
			return nil, err
		}
		reqs = append(reqs, Requirement{Source: labels.SourceK8s, Key: key, Op: OpIn, Values: []string{ls.MatchLabels[k]}})
	}
	for i, e := range ls.MatchExpressions {
		p := fmt.Sprintf("%s.matchExpressions[%d]", path, i)
		key, err := keyOf(p+".key", e.Key)
		if err != nil {
			return nil, err
		}
		op := Operator(e.Operator)
		if err := checkOperator(op, e.Values, p); err != nil {
			return nil, err
		}
		reqs = append(reqs, Requirement{Source: labels.SourceK8s, Key: key, Op: op, Values: e.Values})
	}
	return reqs, nil
}
