package policy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// maxDNSRules bounds the rules.dns[] of one port rule and the toFQDNs of
// one egress entry.
const maxDNSRules = 256

// FQDNSelector selects the CIDR identities of the addresses learned from
// DNS answers for the names it matches (toFQDNs). The repository knows
// which names an address was learned for (SetFQDN); Matches, which sees
// only labels, matches nothing.
type FQDNSelector struct {
	fqdn.Selector
	c *fqdn.Compiled
}

// NewFQDNSelector compiles s; errors name the field below path.
func NewFQDNSelector(s fqdn.Selector, path string) (*FQDNSelector, error) {
	c, err := fqdn.Compile(s, path)
	if err != nil {
		return nil, err
	}
	return &FQDNSelector{Selector: s, c: c}, nil
}

// Key implements Selector.
func (s *FQDNSelector) Key() string { return "fqdn{" + s.String() + "}" }

// Matches implements Selector: labels alone never identify a name.
func (s *FQDNSelector) Matches(labels.Labels) bool { return false }

// MatchesName reports whether the (normalized) name is selected.
func (s *FQDNSelector) MatchesName(name string) bool { return s.c.Matches(name) }

// withFQDNs adds eg's toFQDNs as peers of its peer rules. Like Cilium,
// toFQDNs takes no other L3 selector in the same entry.
func withFQDNs(prs []PeerRule, eg cnpEgress, path string) ([]PeerRule, error) {
	if len(eg.ToFQDNs) == 0 {
		return prs, nil
	}
	switch {
	case len(eg.ToFQDNs) > maxDNSRules:
		return nil, fmt.Errorf("%s.toFQDNs: %d selectors, more than %d", path, len(eg.ToFQDNs), maxDNSRules)
	case len(eg.ToEndpoints)+len(eg.ToCIDR)+len(eg.ToCIDRSet)+len(eg.ToEntities) > 0:
		return nil, fmt.Errorf("%s.toFQDNs: cannot be combined with toEndpoints, toCIDR, toCIDRSet or toEntities in one egress entry", path)
	}
	var sels []Selector
	for i, f := range eg.ToFQDNs {
		s, err := NewFQDNSelector(f, fmt.Sprintf("%s.toFQDNs[%d]", path, i))
		if err != nil {
			return nil, err
		}
		sels = append(sels, s)
	}
	for i := range prs {
		if prs[i].DNS != nil {
			return nil, fmt.Errorf("%s.toFQDNs: rules.dns in the same entry is not supported (give the DNS server its own egress entry)", path)
		}
		prs[i].Any, prs[i].Peers = false, slices.Clone(sels)
	}
	return prs, nil
}

// compileDNSRules validates rules.dns[]; an empty list allows every name.
func compileDNSRules(r *l7Rules, path string) ([]fqdn.Selector, error) {
	if r.HTTP != nil || r.Kafka != nil {
		return nil, fmt.Errorf("%s: http or kafka with dns in one port rule: give one", path)
	}
	if len(r.DNS) > maxDNSRules {
		return nil, fmt.Errorf("%s.dns: %d rules, more than %d", path, len(r.DNS), maxDNSRules)
	}
	out := make([]fqdn.Selector, 0, max(len(r.DNS), 1))
	for i, d := range r.DNS {
		if _, err := fqdn.Compile(d, fmt.Sprintf("%s.dns[%d]", path, i)); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		out = append(out, fqdn.Selector{MatchPattern: "*"})
	}
	return out, nil
}

// dnsPorts checks a DNS port rule's ports: a port and TCP or UDP (ANY
// means both; SCTP is left out, DNS does not run over it).
func dnsPorts(ports []PortProto, path string) ([]PortProto, error) {
	var out []PortProto
	for _, pp := range ports {
		switch {
		case pp.Port == 0 && pp.Name == "":
			return nil, fmt.Errorf("%s.ports: DNS rules need a port (53)", path)
		case pp.Proto == ProtoTCP || pp.Proto == ProtoUDP:
			out = append(out, pp)
		case pp.Proto != ProtoSCTP:
			return nil, fmt.Errorf("%s.ports: DNS rules need TCP or UDP ports", path)
		}
	}
	return out, nil
}

// DNSEntry marks the egress policy map entry Key as redirected to the
// DNS proxy, which lets the endpoint resolve only names matching one of
// Names (an L4-only rule on the same key adds "*").
type DNSEntry struct {
	Key   Key
	Names []fqdn.Selector
}

// DNSRedirected returns the DNS entry of k, if k is redirected to the
// DNS proxy.
func (m *MapState) DNSRedirected(k Key) (DNSEntry, bool) {
	if m == nil {
		return DNSEntry{}, false
	}
	i, ok := slices.BinarySearchFunc(m.DNS, k, func(e DNSEntry, k Key) int { return Compare(e.Key, k) })
	if !ok {
		return DNSEntry{}, false
	}
	return m.DNS[i], true
}

// HasDNS reports whether some entry is redirected to the DNS proxy.
func (m *MapState) HasDNS() bool { return m != nil && len(m.DNS) > 0 }

func dnsEqual(a, b []DNSEntry) bool {
	return slices.EqualFunc(a, b, func(x, y DNSEntry) bool { return x.Key == y.Key && slices.Equal(x.Names, y.Names) })
}

// dnsBuilder merges the DNS rules of every key, as l7Builder does for HTTP.
type dnsBuilder struct {
	rules map[Key][]fqdn.Selector
	l4    map[Key]bool
}

// add records the DNS rules of k (nil: an L4-only rule or an HTTP one).
// A nil builder (a policy without DNS rules) records nothing.
func (b *dnsBuilder) add(k Key, names []fqdn.Selector) {
	if b == nil {
		return
	}
	if names == nil {
		if b.l4 == nil {
			b.l4 = map[Key]bool{}
		}
		b.l4[k] = true
		return
	}
	if b.rules == nil {
		b.rules = map[Key][]fqdn.Selector{}
	}
	b.rules[k] = append(b.rules[k], names...)
}

// entries returns the merged entries; a key an L4-only rule allows too
// allows every name.
func (b *dnsBuilder) entries() []DNSEntry {
	if b == nil || len(b.rules) == 0 {
		return nil
	}
	l4 := b.l4
	out := make([]DNSEntry, 0, len(b.rules))
	for k, ns := range b.rules {
		if l4[k] {
			ns = []fqdn.Selector{{MatchPattern: "*"}}
		}
		ns = slices.Clone(ns)
		slices.SortFunc(ns, func(a, b fqdn.Selector) int { return strings.Compare(a.String(), b.String()) })
		ns = slices.CompactFunc(ns, func(a, b fqdn.Selector) bool { return a.String() == b.String() })
		out = append(out, DNSEntry{Key: k, Names: ns})
	}
	slices.SortFunc(out, func(a, b DNSEntry) int { return Compare(a.Key, b.Key) })
	return out
}

// anyDNS reports whether some peer rule of prs has DNS rules.
func anyDNS(prs []PeerRule) bool {
	return slices.ContainsFunc(prs, func(pr PeerRule) bool { return pr.DNS != nil })
}

// HasDNSRules reports whether any of p's rules has rules.dns or toFQDNs.
func (p *Policy) HasDNSRules() bool {
	for _, r := range p.Rules {
		for _, pr := range r.Egress {
			if pr.DNS != nil || slices.ContainsFunc(pr.Peers, func(s Selector) bool { _, ok := s.(*FQDNSelector); return ok }) {
				return true
			}
		}
	}
	return false
}
