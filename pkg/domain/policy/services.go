package policy

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// toServices (egress, allow and deny entries) selects the backends of
// Kubernetes Services, as Cilium does: a Service with a pod selector
// stands for that selector, confined to the Service's namespace (the pods
// it selects, whatever their addresses); a Service without one stands
// for the addresses of its EndpointSlices, which select the CIDR
// identities of those host prefixes (like toFQDNs: an address that is a
// pod's, the node's or another reserved entry keeps its identity, so such
// a rule never selects a pod, as Cilium's CIDR selectors do not). Both
// follow the Services and their EndpointSlices (Repository.SetService)
// without a policy change.

// serviceRule is one toServices entry (Cilium's api.Service).
type serviceRule struct {
	K8sService         *k8sServiceName     `json:"k8sService"`
	K8sServiceSelector *k8sServiceSelector `json:"k8sServiceSelector"`
}

type k8sServiceName struct {
	ServiceName string `json:"serviceName"`
	Namespace   string `json:"namespace"`
}

type k8sServiceSelector struct {
	Selector  *labelSelector `json:"selector"`
	Namespace string         `json:"namespace"`
}

// maxServiceRules bounds the toServices entries of one egress entry.
const maxServiceRules = 64

// Service is what a toServices rule resolves against: a Service's name,
// labels and pod selector, or, for a Service without one, the addresses
// of its EndpointSlices.
type Service struct {
	Namespace, Name string
	Labels          map[string]string
	// Selector is the Service's pod selector (spec.selector); nil or
	// empty: a Service without selector, whose Addrs are its backends.
	Selector map[string]string
	Addrs    []netip.Addr
	// pods is Selector compiled (nil without one).
	pods *LabelSelector
}

// ServiceSelector selects the backends of the Services it names: one by
// name, or those whose labels Labels selects; in Namespace, or in any
// namespace when Namespace is empty (Cilium's semantics).
type ServiceSelector struct {
	Namespace string
	Name      string
	Labels    *LabelSelector
	key       string
}

// Key implements Selector.
func (s *ServiceSelector) Key() string { return s.key }

// Matches implements Selector: labels alone never name a Service (the
// repository resolves the selector against its Services).
func (s *ServiceSelector) Matches(labels.Labels) bool { return false }

// String describes the selector (GET /v1/policy).
func (s *ServiceSelector) String() string { return s.key }

// SelectsService reports whether s names Service svc.
func (s *ServiceSelector) SelectsService(svc *Service) bool {
	if s.Namespace != "" && s.Namespace != svc.Namespace {
		return false
	}
	if s.Labels == nil {
		return s.Name == svc.Name
	}
	return s.Labels.Matches(serviceLabels(svc.Labels))
}

// serviceLabels turns a Service's labels into a label set (source k8s)
// a service selector's matchLabels match.
func serviceLabels(m map[string]string) labels.Labels {
	out := make(labels.Labels, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, labels.Label{Source: labels.SourceK8s, Key: k, Value: m[k]})
	}
	return out
}

// compileServices compiles the toServices entries at path.
func compileServices(rules []serviceRule, path string) ([]Selector, error) {
	if len(rules) > maxServiceRules {
		return nil, fmt.Errorf("%s.toServices: %d entries, more than %d", path, len(rules), maxServiceRules)
	}
	var out []Selector
	for i, r := range rules {
		p := fmt.Sprintf("%s.toServices[%d]", path, i)
		switch {
		case r.K8sService != nil && r.K8sServiceSelector != nil:
			return nil, fmt.Errorf("%s: k8sService and k8sServiceSelector: give one", p)
		case r.K8sService != nil:
			n := r.K8sService
			if n.ServiceName == "" {
				return nil, fmt.Errorf("%s.k8sService.serviceName: missing", p)
			}
			if err := checkObjectName(n.ServiceName, n.Namespace); err != nil {
				return nil, fmt.Errorf("%s.k8sService: %w", p, err)
			}
			out = append(out, &ServiceSelector{Namespace: n.Namespace, Name: n.ServiceName,
				key: "service{" + n.Namespace + "/" + n.ServiceName + "}"})
		case r.K8sServiceSelector != nil:
			n := r.K8sServiceSelector
			if n.Selector == nil {
				return nil, fmt.Errorf("%s.k8sServiceSelector.selector: missing", p)
			}
			if err := checkObjectName("x", n.Namespace); err != nil {
				return nil, fmt.Errorf("%s.k8sServiceSelector: %w", p, err)
			}
			ls, err := compileSelector(n.Selector, p+".k8sServiceSelector.selector", "", scopeFree)
			if err != nil {
				return nil, err
			}
			out = append(out, &ServiceSelector{Namespace: n.Namespace, Labels: ls,
				key: "service{" + n.Namespace + " " + ls.Key() + "}"})
		default:
			return nil, fmt.Errorf("%s: give k8sService or k8sServiceSelector", p)
		}
	}
	return out, nil
}

// checkObjectName refuses a name or namespace that cannot be a
// Kubernetes object's.
func checkObjectName(name, ns string) error {
	if strings.ContainsAny(name, "/ \t\n") || strings.ContainsAny(ns, "/ \t\n") {
		return fmt.Errorf("name %q or namespace %q contains '/' or whitespace", name, ns)
	}
	return nil
}

// withServices adds an egress entry's toServices to its peer rules: the
// entry selects the Services' backends (and the peers of its other
// fields).
func withServices(prs []PeerRule, rules []serviceRule, others int, path string) ([]PeerRule, error) {
	if len(rules) == 0 {
		return prs, nil
	}
	sels, err := compileServices(rules, path)
	if err != nil {
		return nil, err
	}
	for i := range prs {
		if others == 0 {
			prs[i].Any, prs[i].Peers = false, nil
		}
		prs[i].Peers = append(slices.Clone(prs[i].Peers), sels...)
	}
	return prs, nil
}

// SetService sets (svc non-nil) or removes Service namespace/name. The
// service selectors naming it select its pods or its addresses from
// then on; the identities whose policy changed are in the Result (the
// revision is not bumped: the rules did not change). svc is not kept:
// the repository copies it.
func (r *Repository) SetService(namespace, name string, svc *Service) Result {
	k := namespace + "/" + name
	old := r.services[k]
	var cur *Service
	if svc != nil {
		cur = &Service{Namespace: namespace, Name: name, Labels: maps.Clone(svc.Labels), Selector: maps.Clone(svc.Selector)}
		if len(cur.Selector) > 0 {
			reqs := []Requirement{nsRequirement(namespace)}
			for _, lk := range slices.Sorted(maps.Keys(cur.Selector)) {
				reqs = append(reqs, Requirement{Source: labels.SourceK8s, Key: lk, Op: OpIn, Values: []string{cur.Selector[lk]}})
			}
			cur.pods = NewLabelSelector(reqs)
		} else {
			for _, ip := range svc.Addrs {
				if ip.IsValid() {
					cur.Addrs = append(cur.Addrs, ip.Unmap())
				}
			}
			slices.SortFunc(cur.Addrs, netip.Addr.Compare)
			cur.Addrs = slices.Compact(cur.Addrs)
		}
		r.services[k] = cur
	} else {
		if old == nil {
			return Result{Revision: r.revision}
		}
		delete(r.services, k)
	}
	affected := idSet{}
	// Addresses: unlink the old ones, link the new ones.
	var oldAddrs, newAddrs []netip.Addr
	if old != nil {
		oldAddrs = old.Addrs
	}
	if cur != nil {
		newAddrs = cur.Addrs
	}
	for _, ip := range oldAddrs {
		if _, keep := slices.BinarySearchFunc(newAddrs, ip, netip.Addr.Compare); !keep {
			if names := r.svcNames[ip]; names != nil {
				delete(names, k)
				if len(names) == 0 {
					delete(r.svcNames, ip)
				}
			}
			r.fqdnSync(ip, affected)
		}
	}
	for _, ip := range newAddrs {
		names := r.svcNames[ip]
		if names == nil {
			names = map[string]struct{}{}
			r.svcNames[ip] = names
		}
		names[k] = struct{}{}
		r.fqdnSync(ip, affected)
	}
	// Pod selectors: re-evaluate every identity for the selectors that
	// name the Service, before or after (its labels may have changed).
	var reselected []string
	for cs := range r.svcSels {
		s := cs.sel.(*ServiceSelector)
		if (old != nil && s.SelectsService(old)) || (cur != nil && s.SelectsService(cur)) {
			r.reselectService(cs)
			for k := range cs.peerOf {
				reselected = append(reselected, k)
			}
		}
	}
	res := r.finish(affected)
	slices.Sort(reselected)
	res.Reselected = slices.Compact(reselected)
	return res
}

// reselectService re-evaluates service selector cs for every identity
// that is not a CIDR identity (those follow the addresses: fqdnSync);
// finish recomputes the subjects of the rules peering it.
func (r *Repository) reselectService(cs *cachedSelector) {
	for id, ls := range r.ids {
		if _, isCIDR := r.cidrIDs[id]; isCIDR {
			continue
		}
		m := r.matchesLabels(cs, ls)
		_, had := cs.ids[id]
		if m == had {
			continue
		}
		if m {
			cs.ids[id] = struct{}{}
		} else {
			delete(cs.ids, id)
		}
		r.changed[cs] = struct{}{}
	}
}

// svcMatchesLabels reports whether a Service s names selects (by its pod
// selector) an identity with labels ls.
func (r *Repository) svcMatchesLabels(s *ServiceSelector, ls labels.Labels) bool {
	for _, svc := range r.services {
		if svc.pods != nil && s.SelectsService(svc) && svc.pods.Matches(ls) {
			return true
		}
	}
	return false
}

// svcSelectsPrefix reports whether s selects the CIDR identity of p: a
// host prefix that is a backend address of a Service s names.
func (r *Repository) svcSelectsPrefix(s *ServiceSelector, p netip.Prefix) bool {
	if p.Bits() != p.Addr().BitLen() {
		return false
	}
	for k := range r.svcNames[p.Addr()] {
		if svc := r.services[k]; svc != nil && s.SelectsService(svc) {
			return true
		}
	}
	return false
}

// svcWanted reports whether a cached service selector names a Service
// with backend address ip.
func (r *Repository) svcWanted(ip netip.Addr) bool {
	for k := range r.svcNames[ip] {
		svc := r.services[k]
		for cs := range r.svcSels {
			if svc != nil && cs.sel.(*ServiceSelector).SelectsService(svc) {
				return true
			}
		}
	}
	return false
}

// svcSelectorChanged syncs the backend addresses of the Services s
// names, after s's cache entry was made or dropped.
func (r *Repository) svcSelectorChanged(s *ServiceSelector) {
	for ip, names := range r.svcNames {
		for k := range names {
			if svc := r.services[k]; svc != nil && s.SelectsService(svc) {
				r.fqdnSync(ip, r.staged)
				break
			}
		}
	}
}

// Services returns the Services known, by "namespace/name" (copies).
func (r *Repository) Services() map[string]Service {
	out := make(map[string]Service, len(r.services))
	for k, s := range r.services {
		out[k] = Service{Namespace: s.Namespace, Name: s.Name, Labels: maps.Clone(s.Labels),
			Selector: maps.Clone(s.Selector), Addrs: slices.Clone(s.Addrs)}
	}
	return out
}

// ServiceBackends returns what service selector key resolves to now:
// the Services it names ("namespace/name"), each with its pod selector
// or backend addresses. Empty when no Service matches or the selector
// is not cached.
func (r *Repository) ServiceBackends(sel *ServiceSelector) []Service {
	var out []Service
	for _, k := range slices.Sorted(maps.Keys(r.services)) {
		svc := r.services[k]
		if sel.SelectsService(svc) {
			out = append(out, Service{Namespace: svc.Namespace, Name: svc.Name, Selector: maps.Clone(svc.Selector), Addrs: slices.Clone(svc.Addrs)})
		}
	}
	return out
}

// Selection is what one peer selector of a policy selects now: the
// identities of its cache entry and, for a service selector, the
// Services it names with their pod selectors or backend addresses.
// GET /v1/policy shows them for the selectors whose meaning is not in
// the document itself (toServices, entities).
type Selection struct {
	Selector   string
	Identities []identity.NumericIdentity
	Services   []Service
}

// Selections returns the selections of the service and entity
// selectors of policy key, in selector order (nil: none, or no such
// policy).
func (r *Repository) Selections(key string) []Selection {
	p := r.policies[key]
	if p == nil {
		return nil
	}
	seen := map[string]bool{}
	var out []Selection
	for _, rule := range p.Rules {
		forPeers(rule, func(s Selector) {
			ss, isSvc := s.(*ServiceSelector)
			_, isEntity := s.(*EntitySelector)
			if (!isSvc && !isEntity) || seen[s.Key()] {
				return
			}
			seen[s.Key()] = true
			sel := Selection{Selector: s.Key()}
			if cs := r.selectors[s.Key()]; cs != nil {
				sel.Identities = slices.Sorted(maps.Keys(cs.ids))
			}
			if isSvc {
				sel.Services = r.ServiceBackends(ss)
			}
			out = append(out, sel)
		})
	}
	slices.SortFunc(out, func(a, b Selection) int { return strings.Compare(a.Selector, b.Selector) })
	return out
}

// Policy returns the policy of key (nil: none).
func (r *Repository) Policy(key string) *Policy { return r.policies[key] }
