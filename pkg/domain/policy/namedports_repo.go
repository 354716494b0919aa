package policy

import (
	"slices"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// The repository's named ports: egress rules on a named port allow (or,
// egressDeny, deny), per peer identity, the ports that the endpoints with
// that identity declare under the name (the union over those endpoints:
// the policy map is keyed by identity, so two endpoints of one identity
// that number the name differently are both reachable, or both denied, on
// both numbers). Ingress rules on a named port are resolved per endpoint
// (MapState.ForPorts), against the endpoint's own ports.
//
// An egress CIDR peer (toCIDR, toCIDRSet, ipBlock) on a named port is an
// address, which declares no ports: its name resolves, as in Cilium
// (GetNamedPort over the node's map of every endpoint's ports), to the
// numbers the cluster's endpoints give it: the union over every known
// endpoint, local and remote (clusterPorts), for the CIDR identities the
// peer selects and for its CIDR entries alike.

// maxResolvedPerIdentity bounds the resolved policies cached per
// identity (one per distinct set of ports among its endpoints).
const maxResolvedPerIdentity = 64

// portOwner is what one endpoint declared.
type portOwner struct {
	id    identity.NumericIdentity
	ports NamedPorts
}

// SetEndpointPorts records that the endpoint owner (a key unique among
// the callers, local and remote endpoints alike) has identity id and
// declares ports. The policies of the identities whose egress rules name
// one of id's ports (or did) are recomputed.
func (r *Repository) SetEndpointPorts(owner string, id identity.NumericIdentity, ports NamedPorts) Result {
	affected := idSet{}
	if !r.setPorts(owner, id, ports, affected) {
		return Result{Revision: r.revision}
	}
	return r.finish(affected)
}

// EndpointPortsChange is one owner's named ports for SetEndpointPortsBatch
// (no ports or IdentityUnknown: the owner's are forgotten).
type EndpointPortsChange struct {
	Owner    string
	Identity identity.NumericIdentity
	Ports    NamedPorts
}

// SetEndpointPortsBatch applies several SetEndpointPorts at once.
func (r *Repository) SetEndpointPortsBatch(changes []EndpointPortsChange) Result {
	affected := idSet{}
	changed := false
	for _, c := range changes {
		changed = r.setPorts(c.Owner, c.Identity, c.Ports, affected) || changed
	}
	if !changed {
		return Result{Revision: r.revision}
	}
	return r.finish(affected)
}

// setPorts records owner's ports; false when nothing changed.
func (r *Repository) setPorts(owner string, id identity.NumericIdentity, ports NamedPorts, affected idSet) bool {
	old, had := r.portOwners[owner]
	if len(ports) == 0 || id == identity.IdentityUnknown {
		if !had {
			return false
		}
		r.dropPorts(old, affected)
		delete(r.portOwners, owner)
		return true
	}
	if had && old.id == id && old.ports.Equal(ports) {
		return false
	}
	if had {
		r.dropPorts(old, affected)
	}
	r.portOwners[owner] = portOwner{id: id, ports: ports}
	r.addPorts(portOwner{id: id, ports: ports}, affected)
	return true
}

// EndpointPorts returns the ports owner declared (SetEndpointPorts).
func (r *Repository) EndpointPorts(owner string) NamedPorts { return r.portOwners[owner].ports }

// RemoveEndpointPorts forgets the ports of owner.
func (r *Repository) RemoveEndpointPorts(owner string) Result {
	return r.SetEndpointPorts(owner, identity.IdentityUnknown, nil)
}

func (r *Repository) addPorts(o portOwner, affected idSet) {
	m := r.idPorts[o.id]
	if m == nil {
		m = map[NamedPort]int{}
		r.idPorts[o.id] = m
	}
	changed := false
	for _, p := range o.ports {
		if m[p]++; m[p] == 1 {
			changed = true
			r.countClusterPort(p, 1, affected)
		}
	}
	if changed {
		r.namedEgressUsers(o.id, affected)
	}
}

func (r *Repository) dropPorts(o portOwner, affected idSet) {
	m := r.idPorts[o.id]
	changed := false
	for _, p := range o.ports {
		if m[p]--; m[p] <= 0 {
			delete(m, p)
			changed = true
			r.countClusterPort(p, -1, affected)
		}
	}
	if len(m) == 0 {
		delete(r.idPorts, o.id)
	}
	if changed {
		r.namedEgressUsers(o.id, affected)
	}
}

// portName is a port name over a protocol.
type portName struct {
	name  string
	proto uint8
}

// countClusterPort counts (delta) an identity gaining or losing port p;
// when p's number comes into the cluster's set for its name, or leaves
// it, the identities whose egress CIDR peers resolve the name are
// affected.
func (r *Repository) countClusterPort(p NamedPort, delta int, affected idSet) {
	k := portName{p.Name, p.Proto}
	nums := r.clusterNums[k]
	if nums == nil {
		nums = map[uint16]int{}
		r.clusterNums[k] = nums
	}
	nums[p.Port] += delta
	switch n := nums[p.Port]; {
	case n == 1 && delta > 0:
	case n <= 0:
		delete(nums, p.Port)
		if len(nums) == 0 {
			delete(r.clusterNums, k)
		}
	default:
		return
	}
	r.namedCIDRUsers(k, affected)
}

// clusterPorts returns the numbers the known endpoints give name over
// proto, sorted: what an egress CIDR peer's named port resolves to.
func (r *Repository) clusterPorts(name string, proto uint8) []uint16 {
	nums := r.clusterNums[portName{name, proto}]
	if len(nums) == 0 {
		return nil
	}
	out := make([]uint16, 0, len(nums))
	for n := range nums {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// namedCIDRUsers marks affected the identities selected by a rule with
// an egress entry (allow or deny) toward a CIDR peer on the named port k.
func (r *Repository) namedCIDRUsers(k portName, affected idSet) {
	for cs := range r.subjects {
		for _, ref := range cs.subjectOf {
			rule := &ref.policy.Rules[ref.rule]
			if (rule.EgressEnforced || rule.EgressOpen) && (cidrNamed(rule.Egress, k) || cidrNamed(rule.EgressDeny, k)) {
				for sid := range cs.ids {
					affected[sid] = struct{}{}
				}
				break
			}
		}
	}
}

// cidrNamed reports whether one of prs has a CIDR peer and the named
// port k.
func cidrNamed(prs []PeerRule, k portName) bool {
	for _, pr := range prs {
		if slices.ContainsFunc(pr.Ports, func(p PortProto) bool { return p.Name == k.name && p.Proto == k.proto }) &&
			slices.ContainsFunc(pr.Peers, isCIDRSelector) {
			return true
		}
	}
	return false
}

func isCIDRSelector(s Selector) bool { _, ok := s.(*CIDRSelector); return ok }

// peerPorts returns the ports the endpoints of identity id declare as
// name over proto, sorted.
func (r *Repository) peerPorts(id identity.NumericIdentity, name string, proto uint8) []uint16 {
	var out []uint16
	for p := range r.idPorts[id] {
		if p.Name == name && p.Proto == proto {
			out = append(out, p.Port)
		}
	}
	slices.Sort(out)
	return out
}

// namedEgressUsers marks affected the identities selected by a rule
// with an egress entry (allow or deny) on a named port that can reach
// identity id.
func (r *Repository) namedEgressUsers(id identity.NumericIdentity, affected idSet) {
	for cs := range r.subjects {
		for _, ref := range cs.subjectOf {
			if r.reachesNamed(&ref.policy.Rules[ref.rule], id) {
				for sid := range cs.ids {
					affected[sid] = struct{}{}
				}
				break
			}
		}
	}
}

func (r *Repository) reachesNamed(rule *Rule, id identity.NumericIdentity) bool {
	if !rule.EgressEnforced && !rule.EgressOpen { // compute resolves both (appendKeys)
		return false
	}
	return r.reachesNamedIn(rule.Egress, id) || r.reachesNamedIn(rule.EgressDeny, id)
}

func (r *Repository) reachesNamedIn(prs []PeerRule, id identity.NumericIdentity) bool {
	for _, pr := range prs {
		if !hasNamedPort(pr.Ports) {
			continue
		}
		if pr.Any {
			return true
		}
		for _, s := range pr.Peers {
			if _, ok := r.selectors[s.Key()].ids[id]; ok {
				return true
			}
		}
	}
	return false
}

func hasNamedPort(ports []PortProto) bool {
	return slices.ContainsFunc(ports, func(p PortProto) bool { return p.Name != "" })
}

// MapStateFor returns the policy of an endpoint with identity id that
// declares ports: MapState(id) with its ingress named ports resolved
// (ForPorts). Endpoints with the same identity and ports share the
// returned pointer until the identity's policy changes.
func (r *Repository) MapStateFor(id identity.NumericIdentity, ports NamedPorts) *MapState {
	m := r.MapState(id)
	if !m.hasNamed() || len(ports) == 0 {
		return m
	}
	key := ports.String()
	byPorts := r.resolved[id]
	if got, ok := byPorts[key]; ok {
		return got
	}
	if byPorts == nil || len(byPorts) >= maxResolvedPerIdentity {
		byPorts = map[string]*MapState{}
		r.resolved[id] = byPorts
	}
	got := m.ForPorts(ports)
	byPorts[key] = got
	return got
}
