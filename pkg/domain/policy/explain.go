package policy

import (
	"slices"

	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// Explanation kinds (Explain's want).
const (
	// ExplainAllow: the policies with an allow rule for the traffic.
	ExplainAllow = iota
	// ExplainDeny: the policies with a deny rule (ingressDeny,
	// egressDeny) for it.
	ExplainDeny
	// ExplainDefaultDeny: the policies that make the direction
	// default-deny for the subject (no rule allows the traffic).
	ExplainDefaultDeny
)

// Explain names (Policy.Key, in pols' order, each once) the policies
// behind a verdict the datapath gave traffic of an endpoint with subject
// labels and a peer with peer labels on destination port and proto in
// dir: those whose rules allow it, deny it, or make the direction
// default-deny (want). peerNames are the DNS names the peer's address
// was learned for through the DNS proxy, for toFQDNs rules (nil: none).
// It re-evaluates the rules in user space, since the policy map keeps no
// reference to them: CIDR rules on addresses without a CIDR identity are
// not matched (the answer is then shorter, never wrong about what it
// names). Host rules are left out. named resolves a port name of a rule
// to the numbers it stands for in this traffic, as the rules were
// compiled: on ingress the subject's own ports, on egress the peer's (a
// pod's ports, or every number the cluster's pods give the name for a
// peer that is no pod); nil matches no named port.
func Explain(pols []*Policy, subject, peer labels.Labels, peerNames []string, named PortResolver, port uint16, proto uint8, dir Direction, want int) []string {
	var out []string
	for _, p := range pols {
		if p == nil || !explains(p, subject, peer, peerNames, named, port, proto, dir, want) {
			continue
		}
		out = append(out, p.Key())
	}
	return out
}

// PortResolver returns the numbers port name stands for with protocol
// proto (Explain's named).
type PortResolver func(name string, proto uint8) []uint16

func explains(p *Policy, subject, peer labels.Labels, peerNames []string, named PortResolver, port uint16, proto uint8, dir Direction, want int) bool {
	for i := range p.Rules {
		r := &p.Rules[i]
		if r.Host || r.Subject == nil || !r.Subject.Matches(subject) {
			continue
		}
		allow, deny, enforced := r.Ingress, r.IngressDeny, r.IngressEnforced
		if dir == Egress {
			allow, deny, enforced = r.Egress, r.EgressDeny, r.EgressEnforced
		}
		switch want {
		case ExplainAllow:
			if peerRulesMatch(allow, peer, peerNames, named, port, proto) {
				return true
			}
		case ExplainDeny:
			if peerRulesMatch(deny, peer, peerNames, named, port, proto) {
				return true
			}
		case ExplainDefaultDeny:
			if enforced {
				return true
			}
		}
	}
	return false
}

// peerRulesMatch reports whether one of prs matches the peer (by labels,
// or by a learned name for toFQDNs), port and protocol.
func peerRulesMatch(prs []PeerRule, peer labels.Labels, peerNames []string, named PortResolver, port uint16, proto uint8) bool {
	for _, pr := range prs {
		if !portsMatch(pr.Ports, named, port, proto) {
			continue
		}
		if pr.Any {
			return true
		}
		for _, s := range pr.Peers {
			if s != nil && s.Matches(peer) {
				return true
			}
			if fs, ok := s.(*FQDNSelector); ok && slices.ContainsFunc(peerNames, fs.MatchesName) {
				return true
			}
		}
	}
	return false
}

// portsMatch: no ports is any port and protocol; a port 0 any port of
// its protocol; protocol 0 any protocol; a name the numbers named gives
// it for the traffic's protocol.
func portsMatch(ports []PortProto, named PortResolver, port uint16, proto uint8) bool {
	if len(ports) == 0 {
		return true
	}
	for _, pp := range ports {
		if pp.Name != "" {
			if named != nil && (pp.Proto == ProtoAny || pp.Proto == proto) && slices.Contains(named(pp.Name, proto), port) {
				return true
			}
			continue
		}
		if (pp.Proto == ProtoAny || pp.Proto == proto) && (pp.Port == 0 || pp.Port == port) {
			return true
		}
	}
	return false
}
