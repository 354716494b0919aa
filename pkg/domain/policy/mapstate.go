package policy

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"weak"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// Direction is the direction of traffic relative to the endpoint.
type Direction uint8

const (
	// Ingress is traffic into the endpoint (to-container).
	Ingress Direction = 0
	// Egress is traffic out of the endpoint (from-container).
	Egress Direction = 1
)

// String returns "ingress" or "egress".
func (d Direction) String() string {
	if d == Egress {
		return "egress"
	}
	return "ingress"
}

// IP protocol numbers used in keys.
const (
	ProtoAny    uint8 = 0
	ProtoICMP   uint8 = 1
	ProtoTCP    uint8 = 6
	ProtoUDP    uint8 = 17
	ProtoICMPv6 uint8 = 58
	ProtoSCTP   uint8 = 132
)

// Key is one entry of an endpoint's policy map: traffic with the peer
// Identity to or from destination Port over Proto in direction Dir is
// allowed. Zero fields are wildcards: Identity 0 is any peer, Port 0 any
// port, Proto 0 any protocol (then Port is 0 too).
type Key struct {
	Identity identity.NumericIdentity
	Port     uint16 // destination port, host byte order
	Proto    uint8
	Dir      Direction
}

// MapState is the computed policy of one identity: what the datapath of
// every endpoint with that identity enforces. It is immutable once
// computed and shared by those endpoints; a nil *MapState means no
// policy was computed (nothing enforced).
type MapState struct {
	// Revision is the policy repository revision it was computed from.
	Revision uint64
	// IngressEnforced and EgressEnforced are set when some rule selects
	// the endpoint for that direction: then only Allow entries pass
	// (default deny); otherwise that direction is allow-all.
	IngressEnforced, EgressEnforced bool
	// Allow are the entries of the policy map, sorted (Compare) and free
	// of duplicates. Those also in Deny drop what they match; the
	// others allow it.
	Allow []Key
	// Deny is the sorted subset of Allow that denies (ingressDeny,
	// egressDeny): the deny entries and, for every allow entry a deny
	// intersects, their intersection (applyDeny), so that the datapath's
	// longest-match lookup (Lookups) finds a deny for every connection a
	// deny matches, however specific an allow is.
	Deny []Key
	// CIDR are the CIDR rules' entries, decided on the peer's address
	// (see CIDREntry), sorted by CompareCIDR, one per prefix and group.
	CIDR []CIDREntry
	// L7 are the entries of Allow redirected to the L7 proxy with their
	// HTTP rules, sorted by Key (Compare).
	L7 []L7Entry
	// DNS are the egress entries of Allow redirected to the DNS proxy
	// with the names the endpoint may resolve, sorted by Key.
	DNS []DNSEntry
	// Named are the ingress entries on named ports, which each endpoint
	// resolves against its own ports (ForPorts); sorted, unique. Egress
	// named ports are resolved into Allow (and CIDR) already, against
	// each peer identity's ports, those of an identity that is no
	// endpoint's (world, CIDR) and a CIDR peer's against every endpoint's.
	Named []NamedKey
	// NamedDeny are the ingress deny entries (ingressDeny) on named
	// ports, resolved per endpoint as Named (ForPorts) and then applied
	// as denies (applyDeny); sorted, unique. Egress ones are resolved
	// into Allow and Deny already.
	NamedDeny []NamedKey
	// NamedL7 are the L7 rules of the ingress entries of Named (nil
	// HTTP and Kafka: an L4-only rule), kept when some rule of the
	// policy has L7 rules; ForPorts merges each resolved one into L7 as
	// compute merges the rules of numbered keys. Sorted, unique.
	NamedL7 []NamedL7Entry
	// l7 is the builder L7 was built from, set with NamedL7.
	l7 *l7Builder
	// cidrGroups and namedCIDR are set when an ingress CIDR rule (allow
	// or deny) has a named port: the numbered groups CIDR was built
	// from, and the named ones, which ForPorts adds once resolved.
	cidrGroups map[cidrGroup][]*CIDRSelector
	namedCIDR  map[namedGroup][]*CIDRSelector
	// steps are the policies m was patched from, oldest first, and self
	// is m itself (a copy of m is not patched): PatchedFrom.
	steps []patchStep
	self  weak.Pointer[MapState]
	// tailTaken: a patch of m appended past the length of m's arrays
	// (or may have); only the repository's owner sets it.
	tailTaken bool
}

// NamedKey is an ingress entry on a named port: traffic from Identity
// (0: any) to the port the endpoint itself declares as Name over Proto.
type NamedKey struct {
	Identity identity.NumericIdentity
	Name     string
	Proto    uint8
}

// namedGroup is a CIDR group on a named port (deny: of deny entries).
type namedGroup struct {
	name  string
	proto uint8
	deny  bool
}

func compareNamedKey(a, b NamedKey) int {
	return cmp.Or(cmp.Compare(a.Identity, b.Identity), strings.Compare(a.Name, b.Name), cmp.Compare(a.Proto, b.Proto))
}

// hasNamed reports whether m has ingress entries on named ports, which
// each endpoint resolves (ForPorts).
func (m *MapState) hasNamed() bool {
	return m != nil && (len(m.Named) > 0 || len(m.NamedDeny) > 0 || len(m.namedCIDR) > 0)
}

// resolveNamed returns the keys of named that ports declare.
func resolveNamed(named []NamedKey, ports NamedPorts) []Key {
	var out []Key
	for _, nk := range named {
		if p, ok := ports.Lookup(nk.Name, nk.Proto); ok {
			out = append(out, Key{Identity: nk.Identity, Port: p, Proto: nk.Proto, Dir: Ingress})
		}
	}
	return out
}

// ForPorts returns the policy of an endpoint declaring ports: m with its
// ingress named entries resolved to those ports' numbers. A named entry
// whose name (and protocol) the endpoint does not declare allows (or
// denies) nothing. A named deny then wins over every allow it
// intersects, numbered or named, as a numbered deny does (applyDeny).
// Returns m itself when nothing resolves.
func (m *MapState) ForPorts(ports NamedPorts) *MapState {
	if !m.hasNamed() || len(ports) == 0 {
		return m
	}
	add := resolveNamed(m.Named, ports)
	addDeny := resolveNamed(m.NamedDeny, ports)
	var l7 *l7Builder
	for _, e := range m.NamedL7 {
		p, ok := ports.Lookup(e.Key.Name, e.Key.Proto)
		if !ok {
			continue
		}
		if l7 == nil {
			l7 = m.l7.clone()
		}
		l7.add(Key{Identity: e.Key.Identity, Port: p, Proto: e.Key.Proto, Dir: Ingress}, e.HTTP, e.Kafka)
	}
	var groups map[cidrGroup][]*CIDRSelector
	for g, sels := range m.namedCIDR {
		p, ok := ports.Lookup(g.name, g.proto)
		if !ok {
			continue
		}
		if groups == nil {
			groups = maps.Clone(m.cidrGroups)
			if groups == nil {
				groups = map[cidrGroup][]*CIDRSelector{}
			}
		}
		cg := cidrGroup{dir: Ingress, proto: g.proto, port: p, deny: g.deny}
		groups[cg] = append(slices.Clip(groups[cg]), sels...)
	}
	if len(add) == 0 && len(addDeny) == 0 && groups == nil {
		return m
	}
	c := *m
	c.steps, c.self = nil, weak.Pointer[MapState]{}
	if len(add) > 0 || len(addDeny) > 0 {
		n := NewMapState(0, false, false, append(slices.Clone(m.Allow), add...))
		n.L7, n.DNS = m.L7, m.DNS
		if l7 != nil {
			n.L7 = l7.entries()
		}
		n.applyDeny(append(slices.Clone(m.Deny), addDeny...))
		c.Allow, c.Deny, c.L7, c.DNS = n.Allow, n.Deny, n.L7, n.DNS
	}
	if groups != nil {
		c.CIDR = cidrEntries(groups)
	}
	return &c
}

// namedCIDREqual compares the named CIDR groups of two policies.
func namedCIDREqual(a, b map[namedGroup][]*CIDRSelector) bool {
	if len(a) != len(b) {
		return false
	}
	for g, sa := range a {
		sb, ok := b[g]
		if !ok || len(sa) != len(sb) {
			return false
		}
		for i := range sa {
			if sa[i].Key() != sb[i].Key() {
				return false
			}
		}
	}
	return true
}

// Compare orders keys by direction, identity, protocol, then port.
func Compare(a, b Key) int {
	return cmp.Or(cmp.Compare(a.Dir, b.Dir), cmp.Compare(a.Identity, b.Identity),
		cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Port, b.Port))
}

// NewMapState returns a MapState with allow sorted and de-duplicated
// (allow is reused).
func NewMapState(rev uint64, ingress, egress bool, allow []Key) *MapState {
	// Sorted as packed integers, ordered as Compare orders keys: a
	// policy with many CIDR peers has hundreds of thousands of keys.
	packed := make([]uint64, len(allow))
	for i, k := range allow {
		packed[i] = k.pack()
	}
	slices.Sort(packed)
	packed = slices.Compact(packed)
	allow = allow[:len(packed)]
	for i, v := range packed {
		allow[i] = unpack(v)
	}
	return &MapState{Revision: rev, IngressEnforced: ingress, EgressEnforced: egress, Allow: allow}
}

// pack returns k as an integer ordered as Compare orders keys: Dir,
// Identity, Proto, Port from the most significant bits down.
func (k Key) pack() uint64 {
	return uint64(k.Dir)<<56 | uint64(k.Identity)<<24 | uint64(k.Proto)<<16 | uint64(k.Port)
}

func unpack(v uint64) Key {
	return Key{Dir: Direction(v >> 56), Identity: identity.NumericIdentity(v >> 24), Proto: uint8(v >> 16), Port: uint16(v)}
}

// Enforced reports whether dir is default-deny.
func (m *MapState) Enforced(dir Direction) bool {
	if m == nil {
		return false
	}
	if dir == Egress {
		return m.EgressEnforced
	}
	return m.IngressEnforced
}

// Has reports whether k is an entry (exactly, no wildcard matching).
func (m *MapState) Has(k Key) bool {
	if m == nil {
		return false
	}
	_, ok := slices.BinarySearchFunc(m.Allow, k, Compare)
	return ok
}

// Lookups returns the keys the datapath tries, in order, for a packet
// of a new connection: exact, port wildcard, L3-only, then the same with
// any peer. The BPF programs (bpf/) use the same order.
func Lookups(peer identity.NumericIdentity, port uint16, proto uint8, dir Direction) [6]Key {
	return [6]Key{
		{peer, port, proto, dir}, {peer, 0, proto, dir}, {peer, 0, 0, dir},
		{0, port, proto, dir}, {0, 0, proto, dir}, {0, 0, 0, dir},
	}
}

// Allows reports whether a new connection with peer on port/proto in
// dir passes on identity entries alone: always when dir is not enforced,
// else when the first of Lookups that is an entry allows. CIDR entries
// need the peer's address: AllowsAddr is the datapath's verdict.
func (m *MapState) Allows(peer identity.NumericIdentity, port uint16, proto uint8, dir Direction) bool {
	if !m.Enforced(dir) {
		return true
	}
	found, denied := m.lookup(peer, port, proto, dir)
	return found && !denied
}

// lookup returns whether one of Lookups is an entry, and whether the
// first such entry denies: the datapath's policy_lookup.
func (m *MapState) lookup(peer identity.NumericIdentity, port uint16, proto uint8, dir Direction) (found, denied bool) {
	for _, k := range Lookups(peer, port, proto, dir) {
		if m.Has(k) {
			return true, m.Denies(k)
		}
	}
	return false, false
}

// Denies reports whether entry k denies (exactly, no wildcard matching).
func (m *MapState) Denies(k Key) bool {
	if m == nil {
		return false
	}
	_, ok := slices.BinarySearchFunc(m.Deny, k, Compare)
	return ok
}

// intersect returns the entry matching what both d and a match, if they
// overlap: the more specific of each field (a zero field is a wildcard;
// Port is only set with Proto).
func intersect(d, a Key) (Key, bool) {
	if d.Dir != a.Dir {
		return Key{}, false
	}
	out := Key{Dir: d.Dir}
	switch {
	case d.Identity == 0:
		out.Identity = a.Identity
	case a.Identity == 0 || a.Identity == d.Identity:
		out.Identity = d.Identity
	default:
		return Key{}, false
	}
	switch {
	case d.Proto == 0:
		out.Proto, out.Port = a.Proto, a.Port
		return out, true
	case a.Proto == 0:
		out.Proto, out.Port = d.Proto, d.Port
		return out, true
	case a.Proto != d.Proto:
		return Key{}, false
	}
	out.Proto = d.Proto
	switch {
	case d.Port == 0:
		out.Port = a.Port
	case a.Port == 0 || a.Port == d.Port:
		out.Port = d.Port
	default:
		return Key{}, false
	}
	return out, true
}

// WithDeny returns a copy of m with the deny entries deny added
// (applyDeny), as compute adds those of ingressDeny and egressDeny.
func (m *MapState) WithDeny(deny []Key) *MapState {
	c := *m
	c.steps, c.self = nil, weak.Pointer[MapState]{}
	c.applyDeny(deny)
	return &c
}

// applyDeny adds the deny entries deny to m (whose Allow holds only
// allows, or allows and the Deny of an earlier applyDeny): every allow
// entry a deny covers becomes a deny, and the intersection of a deny
// with every broader allow it overlaps is added as a deny. Then the
// first of Lookups present in the map denies whenever some deny matches
// the connection: if the longest entry of the peer (or, with none, of
// any peer) that matches were an allow A, a deny D matching too would
// intersect A in an entry as long as A, which is A itself only when D
// covers A (then A was turned into a deny), and is longer otherwise
// (then it, a deny, is the longest match). L7 and DNS redirects of
// entries that deny are dropped.
func (m *MapState) applyDeny(deny []Key) {
	if len(deny) == 0 {
		return
	}
	deny = NewMapState(0, false, false, slices.Clone(deny)).Allow
	denied := slices.Clone(deny)
	keys := slices.Clone(m.Allow)
	for _, a := range m.Allow {
		for _, d := range deny {
			i, ok := intersect(d, a)
			if !ok {
				continue
			}
			denied = append(denied, i)
			if i != a {
				keys = append(keys, i)
			}
		}
	}
	keys = append(keys, deny...)
	m.Allow = NewMapState(0, false, false, keys).Allow
	m.Deny = NewMapState(0, false, false, denied).Allow
	m.L7 = slices.DeleteFunc(slices.Clone(m.L7), func(e L7Entry) bool { return m.Denies(e.Key) })
	m.DNS = slices.DeleteFunc(slices.Clone(m.DNS), func(e DNSEntry) bool { return m.Denies(e.Key) })
	if len(m.L7) == 0 {
		m.L7 = nil
	}
	if len(m.DNS) == 0 {
		m.DNS = nil
	}
}

// Equal reports whether m and o enforce the same thing (revisions aside).
func (m *MapState) Equal(o *MapState) bool {
	if m == nil || o == nil {
		return m == o
	}
	return m.IngressEnforced == o.IngressEnforced && m.EgressEnforced == o.EgressEnforced &&
		slices.Equal(m.Allow, o.Allow) && slices.Equal(m.Deny, o.Deny) && slices.Equal(m.CIDR, o.CIDR) && l7Equal(m.L7, o.L7) &&
		dnsEqual(m.DNS, o.DNS) && slices.Equal(m.Named, o.Named) && slices.Equal(m.NamedDeny, o.NamedDeny) && namedL7Equal(m.NamedL7, o.NamedL7) &&
		namedCIDREqual(m.namedCIDR, o.namedCIDR)
}

// Diff returns the entries of to missing from from (add) and those of
// from missing from to (remove); either may be nil (no entries). A
// policy-only regeneration applies exactly these to the policy map.
func Diff(from, to *MapState) (add, remove []Key) {
	var a, b []Key
	if from != nil {
		a = from.Allow
	}
	if to != nil {
		b = to.Allow
	}
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && Compare(a[i], b[j]) < 0):
			remove = append(remove, a[i])
			i++
		case i == len(a) || Compare(a[i], b[j]) > 0:
			add = append(add, b[j])
			j++
		default:
			i++
			j++
		}
	}
	return add, remove
}
