package policy

import (
	"slices"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// The repository's named ports: egress rules on a named port allow (or,
// egressDeny, deny), per peer identity that is an endpoint's, the ports
// that the endpoints with that identity declare under the name (the
// union over those endpoints: the policy map is keyed by identity, so
// two endpoints of one identity that number the name differently are
// both reachable, or both denied, on both numbers). Ingress rules on a
// named port are resolved per endpoint (MapState.ForPorts), against the
// endpoint's own ports.
//
// An egress peer identity that is no endpoint's (endpointIdentity: the
// reserved identities, world among them, the CIDR identities of toCIDR,
// toCIDRSet, ipBlock, toFQDNs and Services without a selector, and the
// per-node identities) declares no ports: a named port toward it
// resolves, as in Cilium (GetNamedPort over the node's map of every
// endpoint's ports), to the numbers the cluster's endpoints give the
// name: the union over every known endpoint, local and remote
// (clusterPorts). So does a CIDR peer's CIDR entry. An entry toward any
// peer (`toEntities: [all]`, ports only) resolves so for every such
// identity the repository knows, and per identity for the endpoints'.

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
// it, the identities whose egress entries resolve the name for a peer
// that is no endpoint's identity are affected.
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
	r.namedOutsideUsers(k, affected)
}

// clusterPorts returns the numbers the known endpoints give name over
// proto, sorted: what an egress named port resolves to toward an
// identity that is no endpoint's (endpointIdentity).
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

// endpointIdentity reports whether id is in the range identities are
// handed out in for endpoints' label sets (MinLocalIdentity up to the
// CIDR identities): an egress named port toward it resolves against the
// ports of its endpoints (peerPorts), toward any other (reserved, CIDR,
// per-node) against the cluster's (clusterPorts).
func endpointIdentity(id identity.NumericIdentity) bool {
	return id >= identity.MinLocalIdentity && id < MinCIDRIdentity
}

// peerNums returns what an egress named port resolves to toward peer.
func (r *Repository) peerNums(peer identity.NumericIdentity, name string, proto uint8) []uint16 {
	if endpointIdentity(peer) {
		return r.peerPorts(peer, name, proto)
	}
	return r.clusterPorts(name, proto)
}

// namedOutsideUsers marks affected the identities selected by a rule
// with an egress entry (allow or deny) on the named port k: those whose
// peers include an identity that is no endpoint's resolve it to
// clusterPorts. Every such entry counts, whatever its peers select now
// (recomputing the others changes nothing).
func (r *Repository) namedOutsideUsers(k portName, affected idSet) {
	r.markUsers(affected, func(rule *Rule) bool {
		return namedIn(rule.Egress, k) || namedIn(rule.EgressDeny, k)
	})
}

// anyNamedUsers marks affected the identities selected by a rule with
// an egress entry toward any peer on a named port, which resolves it for
// every identity that is no endpoint's: called when one comes or goes.
func (r *Repository) anyNamedUsers(affected idSet) {
	if r.anyNamed == 0 {
		return
	}
	r.markUsers(affected, anyNamedEgress)
}

// markUsers marks affected the identities selected by an egress rule
// (allow or deny) for which match holds.
func (r *Repository) markUsers(affected idSet, match func(*Rule) bool) {
	for cs := range r.subjects {
		for _, ref := range cs.subjectOf {
			rule := &ref.policy.Rules[ref.rule]
			if (rule.EgressEnforced || rule.EgressOpen) && match(rule) {
				for sid := range cs.ids {
					affected[sid] = struct{}{}
				}
				break
			}
		}
	}
}

// namedIn reports whether one of prs is on the named port k.
func namedIn(prs []PeerRule, k portName) bool {
	for _, pr := range prs {
		if slices.ContainsFunc(pr.Ports, func(p PortProto) bool { return p.Name == k.name && p.Proto == k.proto }) {
			return true
		}
	}
	return false
}

// anyNamedEgress reports whether rule has an egress entry (allow or
// deny) toward any peer on a named port.
func anyNamedEgress(rule *Rule) bool {
	for _, prs := range [][]PeerRule{rule.Egress, rule.EgressDeny} {
		for _, pr := range prs {
			if pr.Any && hasNamedPort(pr.Ports) {
				return true
			}
		}
	}
	return false
}

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
