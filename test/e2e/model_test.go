package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// The types below are the subset of networking.k8s.io/v1 NetworkPolicy
// the cases use, serialised as the API server would (JSON field names).
// The model evaluates them itself; the agent receives them as JSON.

type netPolicy struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       npSpec     `json:"spec"`
}

type objectMeta struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
}

type npSpec struct {
	PodSelector labelSelector `json:"podSelector"`
	PolicyTypes []string      `json:"policyTypes,omitempty"`
	Ingress     []npRule      `json:"ingress,omitempty"`
	Egress      []npRule      `json:"egress,omitempty"`
}

// npRule is an ingress rule (From) or an egress rule (To).
type npRule struct {
	From  []npPeer `json:"from,omitempty"`
	To    []npPeer `json:"to,omitempty"`
	Ports []npPort `json:"ports,omitempty"`
}

type npPeer struct {
	PodSelector       *labelSelector `json:"podSelector,omitempty"`
	NamespaceSelector *labelSelector `json:"namespaceSelector,omitempty"`
	IPBlock           *ipBlock       `json:"ipBlock,omitempty"`
}

type ipBlock struct {
	CIDR   string   `json:"cidr"`
	Except []string `json:"except,omitempty"`
}

type npPort struct {
	Protocol string `json:"protocol,omitempty"`
	Port     *int   `json:"port,omitempty"`
	EndPort  *int   `json:"endPort,omitempty"`
}

type labelSelector struct {
	MatchLabels      map[string]string `json:"matchLabels,omitempty"`
	MatchExpressions []labelExpr       `json:"matchExpressions,omitempty"`
}

type labelExpr struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values,omitempty"`
}

// newPolicy returns a NetworkPolicy name in ns selecting pods by sel.
// types lists policyTypes (none: Kubernetes' default).
func newPolicy(ns, name string, sel labelSelector, types ...string) *netPolicy {
	return &netPolicy{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy",
		Metadata: objectMeta{Name: name, Namespace: ns}, Spec: npSpec{PodSelector: sel, PolicyTypes: types}}
}

func (p *netPolicy) ingress(r ...npRule) *netPolicy {
	p.Spec.Ingress = append(p.Spec.Ingress, r...)
	return p
}
func (p *netPolicy) egress(r ...npRule) *netPolicy {
	p.Spec.Egress = append(p.Spec.Egress, r...)
	return p
}

func podSel(kv ...string) labelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return labelSelector{MatchLabels: m}
}

func nsName(ns string) *labelSelector {
	return &labelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}
}

func intp(n int) *int { return &n }

// Builders of the cases.

const (
	ing = "Ingress"
	eg  = "Egress"
)

var everyPod = labelSelector{}

func selp(kv ...string) *labelSelector { s := podSel(kv...); return &s }

func from(peers ...npPeer) npRule { return npRule{From: peers} }
func to(peers ...npPeer) npRule   { return npRule{To: peers} }

func (r npRule) on(ports ...npPort) npRule { r.Ports = ports; return r }

func tcp(port int) npPort { return npPort{Protocol: "TCP", Port: intp(port)} }

func block(cidr string, except ...string) npPeer {
	return npPeer{IPBlock: &ipBlock{CIDR: cidr, Except: except}}
}

// --- The model: the NetworkPolicy spec, evaluated per connection. ---

// modelPod is a pod as the model sees it.
type modelPod struct {
	ns, name string
	labels   map[string]string
	ip       netip.Addr
}

func (p modelPod) String() string { return p.ns + "/" + p.name }

// nsLabels are a namespace's labels: only its name label today (the
// agent matches namespaceSelector on it alone).
func nsLabels(ns string) map[string]string {
	return map[string]string{"kubernetes.io/metadata.name": ns}
}

func (s *labelSelector) matches(ls map[string]string) bool {
	for k, v := range s.MatchLabels {
		if got, ok := ls[k]; !ok || got != v {
			return false
		}
	}
	for _, e := range s.MatchExpressions {
		v, ok := ls[e.Key]
		in := ok && slices.Contains(e.Values, v)
		switch e.Operator {
		case "In":
			if !in {
				return false
			}
		case "NotIn":
			if in {
				return false
			}
		case "Exists":
			if !ok {
				return false
			}
		case "DoesNotExist":
			if ok {
				return false
			}
		default:
			panic("operator " + e.Operator)
		}
	}
	return true
}

// types returns the policy's effective policyTypes: as given, else
// Ingress plus Egress when it has egress rules.
func (p *netPolicy) types() (ingress, egress bool) {
	if len(p.Spec.PolicyTypes) == 0 {
		return true, len(p.Spec.Egress) > 0
	}
	return slices.Contains(p.Spec.PolicyTypes, "Ingress"), slices.Contains(p.Spec.PolicyTypes, "Egress")
}

func (p *netPolicy) selects(pod modelPod) bool {
	return p.Metadata.Namespace == pod.ns && p.Spec.PodSelector.matches(pod.labels)
}

// peerMatches: an ipBlock matches the address (in cidr, outside every
// except), whoever has it; otherwise namespaceSelector (absent: the
// policy's namespace) and podSelector (absent: every pod) must both
// match.
func (peer npPeer) matches(policyNS string, other modelPod) bool {
	if b := peer.IPBlock; b != nil {
		if !netip.MustParsePrefix(b.CIDR).Contains(other.ip) {
			return false
		}
		for _, e := range b.Except {
			if netip.MustParsePrefix(e).Contains(other.ip) {
				return false
			}
		}
		return true
	}
	if peer.NamespaceSelector == nil {
		if other.ns != policyNS {
			return false
		}
	} else if !peer.NamespaceSelector.matches(nsLabels(other.ns)) {
		return false
	}
	return peer.PodSelector == nil || peer.PodSelector.matches(other.labels)
}

// portMatches: no ports is every port; a port's protocol defaults to
// TCP; no port number is every port of the protocol; endPort makes a
// range.
func portMatches(ports []npPort, port int, proto string) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		pr := p.Protocol
		if pr == "" {
			pr = "TCP"
		}
		if pr != proto {
			continue
		}
		switch {
		case p.Port == nil:
			return true
		case p.EndPort != nil && port >= *p.Port && port <= *p.EndPort:
			return true
		case port == *p.Port:
			return true
		}
	}
	return false
}

// allowedDir reports whether pod's side of the connection passes in one
// direction: no policy selecting pod for it means allowed; otherwise
// some rule of some such policy must match the other pod and the port.
func allowedDir(pols []*netPolicy, pod, other modelPod, port int, proto string, egress bool) bool {
	selected := false
	for _, p := range pols {
		in, eg := p.types()
		if (egress && !eg) || (!egress && !in) || !p.selects(pod) {
			continue
		}
		selected = true
		rules := p.Spec.Ingress
		if egress {
			rules = p.Spec.Egress
		}
		for _, r := range rules {
			peers := r.From
			if egress {
				peers = r.To
			}
			if !portMatches(r.Ports, port, proto) {
				continue
			}
			if len(peers) == 0 || slices.ContainsFunc(peers, func(peer npPeer) bool { return peer.matches(p.Metadata.Namespace, other) }) {
				return true
			}
		}
	}
	return !selected
}

// modelAllows is the spec's verdict for a connection from src to dst's
// port: src's egress and dst's ingress must both allow it. A pod's
// connection to itself never leaves its network namespace: always
// allowed (as upstream's AllowLoopback).
func modelAllows(pols []*netPolicy, src, dst modelPod, port int, proto string) bool {
	if src.ns == dst.ns && src.name == dst.name {
		return true
	}
	return allowedDir(pols, src, dst, port, proto, true) && allowedDir(pols, dst, src, port, proto, false)
}

// --- Reachability matrices. ---

// probeKey is a port and protocol the table probes.
type probeKey struct {
	port  int
	proto string
}

func (k probeKey) String() string { return fmt.Sprintf("%s/%d", k.proto, k.port) }

var probeKeys = []probeKey{{80, "TCP"}, {81, "TCP"}, {80, "UDP"}, {81, "UDP"}}

// matrix is a reachability table: m[from][to] for the world's pods.
type matrix [][]bool

func newMatrix(n int) matrix {
	m := make(matrix, n)
	for i := range m {
		m[i] = make([]bool, n)
	}
	return m
}

func (m matrix) equal(o matrix) bool {
	for i := range m {
		if !slices.Equal(m[i], o[i]) {
			return false
		}
	}
	return true
}

// expected computes the model's matrix for k.
func expected(pols []*netPolicy, pods []modelPod, k probeKey) matrix {
	m := newMatrix(len(pods))
	for i, src := range pods {
		for j, dst := range pods {
			m[i][j] = modelAllows(pols, src, dst, k.port, k.proto)
		}
	}
	return m
}

// render prints a matrix as upstream's truth tables: rows are the
// sources, columns the destinations, cell(i, j) gives the mark.
func render(pods []modelPod, cell func(i, j int) string) string {
	var b strings.Builder
	b.WriteString("-\t")
	for _, p := range pods {
		b.WriteString(p.String() + "\t")
	}
	b.WriteString("\n")
	for i, p := range pods {
		b.WriteString(p.String() + "\t")
		for j := range pods {
			b.WriteString(cell(i, j) + "\t")
		}
		b.WriteString("\n")
	}
	return b.String()
}

func mark(ok bool) string {
	if ok {
		return "."
	}
	return "X"
}

// diffReport prints the expected, observed and comparison tables ('.'
// for allowed, 'X' for blocked; in the comparison '.' is agreement and
// 'X' a disagreement) of k.
func diffReport(pods []modelPod, k probeKey, want, got matrix) string {
	wrong := 0
	for i := range want {
		for j := range want[i] {
			if want[i][j] != got[i][j] {
				wrong++
			}
		}
	}
	return fmt.Sprintf("%s: %d of %d wrong\nexpected:\n%sobserved:\n%scomparison:\n%s", k, wrong, len(pods)*len(pods),
		render(pods, func(i, j int) string { return mark(want[i][j]) }),
		render(pods, func(i, j int) string { return mark(got[i][j]) }),
		render(pods, func(i, j int) string { return mark(want[i][j] == got[i][j]) }))
}
