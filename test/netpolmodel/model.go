// Package netpolmodel is the NetworkPolicy conformance table shared by
// test/netpol (policies through the agent's API) and test/e2e (policies
// through the API server): the subset of networking.k8s.io/v1
// NetworkPolicy the cases use, an independent model of the spec that
// computes the expected reachability matrices (not the agent's policy
// code), the cases in the style of the upstream e2e suite (kubernetes
// test/e2e/network/netpol), and the report printing expected, observed
// and comparison matrices.
package netpolmodel

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// The types below are the subset of networking.k8s.io/v1 NetworkPolicy
// the cases use, serialised as the API server would (JSON field names).
// The model evaluates them itself; the agent receives them as JSON.

type Policy struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   ObjectMeta `json:"metadata"`
	Spec       Spec       `json:"spec"`
}

type ObjectMeta struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
}

type Spec struct {
	PodSelector LabelSelector `json:"podSelector"`
	PolicyTypes []string      `json:"policyTypes,omitempty"`
	Ingress     []Rule        `json:"ingress,omitempty"`
	Egress      []Rule        `json:"egress,omitempty"`
}

// Rule is an ingress rule (From) or an egress rule (To).
type Rule struct {
	From  []Peer `json:"from,omitempty"`
	To    []Peer `json:"to,omitempty"`
	Ports []Port `json:"ports,omitempty"`
}

type Peer struct {
	PodSelector       *LabelSelector `json:"podSelector,omitempty"`
	NamespaceSelector *LabelSelector `json:"namespaceSelector,omitempty"`
	IPBlock           *IPBlock       `json:"ipBlock,omitempty"`
}

type IPBlock struct {
	CIDR   string   `json:"cidr"`
	Except []string `json:"except,omitempty"`
}

type Port struct {
	Protocol string `json:"protocol,omitempty"`
	Port     *int   `json:"port,omitempty"`
	EndPort  *int   `json:"endPort,omitempty"`
}

type LabelSelector struct {
	MatchLabels      map[string]string `json:"matchLabels,omitempty"`
	MatchExpressions []LabelExpr       `json:"matchExpressions,omitempty"`
}

type LabelExpr struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values,omitempty"`
}

// NewPolicy returns a NetworkPolicy name in ns selecting pods by sel.
// types lists policyTypes (none: Kubernetes' default).
func NewPolicy(ns, name string, sel LabelSelector, types ...string) *Policy {
	return &Policy{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy",
		Metadata: ObjectMeta{Name: name, Namespace: ns}, Spec: Spec{PodSelector: sel, PolicyTypes: types}}
}

// WithIngress appends ingress rules.
func (p *Policy) WithIngress(r ...Rule) *Policy {
	p.Spec.Ingress = append(p.Spec.Ingress, r...)
	return p
}

// WithEgress appends egress rules.
func (p *Policy) WithEgress(r ...Rule) *Policy {
	p.Spec.Egress = append(p.Spec.Egress, r...)
	return p
}

// PodSel is a selector matching the labels kv (key, value, ...).
func PodSel(kv ...string) LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return LabelSelector{MatchLabels: m}
}

// NSName selects the namespace ns by its kubernetes.io/metadata.name label.
func NSName(ns string) *LabelSelector {
	return &LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}
}

// IntP returns a pointer to n.
func IntP(n int) *int { return &n }

// Builders of the cases.

const (
	ing = "Ingress"
	eg  = "Egress"
)

// EveryPod is the empty selector.
var EveryPod = LabelSelector{}

// SelP is PodSel as a pointer.
func SelP(kv ...string) *LabelSelector { s := PodSel(kv...); return &s }

// From is an ingress rule from peers.
func From(peers ...Peer) Rule { return Rule{From: peers} }

// To is an egress rule to peers.
func To(peers ...Peer) Rule { return Rule{To: peers} }

// On restricts r to ports.
func (r Rule) On(ports ...Port) Rule { r.Ports = ports; return r }

// TCP is the TCP port.
func TCP(port int) Port { return Port{Protocol: "TCP", Port: IntP(port)} }

// Block is an ipBlock peer.
func Block(cidr string, except ...string) Peer {
	return Peer{IPBlock: &IPBlock{CIDR: cidr, Except: except}}
}

// --- The model: the NetworkPolicy spec, evaluated per connection. ---

// Pod is a pod as the model sees it.
type Pod struct {
	NS, Name string
	Labels   map[string]string
	IP       netip.Addr
}

// String is namespace/name.
func (p Pod) String() string { return p.NS + "/" + p.Name }

// nsLabels are a namespace's labels: only its name label today (the
// agent matches namespaceSelector on it alone).
func nsLabels(ns string) map[string]string {
	return map[string]string{"kubernetes.io/metadata.name": ns}
}

func (s *LabelSelector) matches(ls map[string]string) bool {
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
func (p *Policy) types() (ingress, egress bool) {
	if len(p.Spec.PolicyTypes) == 0 {
		return true, len(p.Spec.Egress) > 0
	}
	return slices.Contains(p.Spec.PolicyTypes, "Ingress"), slices.Contains(p.Spec.PolicyTypes, "Egress")
}

func (p *Policy) selects(pod Pod) bool {
	return p.Metadata.Namespace == pod.NS && p.Spec.PodSelector.matches(pod.Labels)
}

// peerMatches: an ipBlock matches the address (in cidr, outside every
// except), whoever has it; otherwise namespaceSelector (absent: the
// policy's namespace) and podSelector (absent: every pod) must both
// match.
func (peer Peer) matches(policyNS string, other Pod) bool {
	if b := peer.IPBlock; b != nil {
		if !netip.MustParsePrefix(b.CIDR).Contains(other.IP) {
			return false
		}
		for _, e := range b.Except {
			if netip.MustParsePrefix(e).Contains(other.IP) {
				return false
			}
		}
		return true
	}
	if peer.NamespaceSelector == nil {
		if other.NS != policyNS {
			return false
		}
	} else if !peer.NamespaceSelector.matches(nsLabels(other.NS)) {
		return false
	}
	return peer.PodSelector == nil || peer.PodSelector.matches(other.Labels)
}

// portMatches: no ports is every port; a port's protocol defaults to
// TCP; no port number is every port of the protocol; endPort makes a
// range.
func portMatches(ports []Port, port int, proto string) bool {
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
func allowedDir(pols []*Policy, pod, other Pod, port int, proto string, egress bool) bool {
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
			if len(peers) == 0 || slices.ContainsFunc(peers, func(peer Peer) bool { return peer.matches(p.Metadata.Namespace, other) }) {
				return true
			}
		}
	}
	return !selected
}

// Allows is the spec's verdict for a connection from src to dst's
// port: src's egress and dst's ingress must both allow it. A pod's
// connection to itself never leaves its network namespace: always
// allowed (as upstream's AllowLoopback).
func Allows(pols []*Policy, src, dst Pod, port int, proto string) bool {
	if src.NS == dst.NS && src.Name == dst.Name {
		return true
	}
	return allowedDir(pols, src, dst, port, proto, true) && allowedDir(pols, dst, src, port, proto, false)
}

// --- Reachability matrices. ---

// ProbeKey is a port and protocol the table probes.
type ProbeKey struct {
	Port  int
	Proto string
}

// String is protocol/port.
func (k ProbeKey) String() string { return fmt.Sprintf("%s/%d", k.Proto, k.Port) }

// ProbeKeys are the ports and protocols every case probes.
var ProbeKeys = []ProbeKey{{80, "TCP"}, {81, "TCP"}, {80, "UDP"}, {81, "UDP"}}

// Matrix is a reachability table: m[from][to] for the world's pods.
type Matrix [][]bool

// NewMatrix is an n x n matrix, all blocked.
func NewMatrix(n int) Matrix {
	m := make(Matrix, n)
	for i := range m {
		m[i] = make([]bool, n)
	}
	return m
}

// Equal reports whether m and o agree in every cell.
func (m Matrix) Equal(o Matrix) bool {
	for i := range m {
		if !slices.Equal(m[i], o[i]) {
			return false
		}
	}
	return true
}

// Expected computes the model's Matrix for k.
func Expected(pols []*Policy, pods []Pod, k ProbeKey) Matrix {
	m := NewMatrix(len(pods))
	for i, src := range pods {
		for j, dst := range pods {
			m[i][j] = Allows(pols, src, dst, k.Port, k.Proto)
		}
	}
	return m
}

// render prints a Matrix as upstream's truth tables: rows are the
// sources, columns the destinations, cell(i, j) gives the mark.
func render(pods []Pod, cell func(i, j int) string) string {
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

// DiffReport prints the expected, observed and comparison tables ('.'
// for allowed, 'X' for blocked; in the comparison '.' is agreement and
// 'X' a disagreement) of k.
func DiffReport(pods []Pod, k ProbeKey, want, got Matrix) string {
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

// World is what a case needs from the harness: pod addresses and the
// pods' range, for the ipBlock cases.
type World interface {
	// Host32 is pod ns/name's address as a /32.
	Host32(ns, name string) string
	// CIDR is the range every pod's address is in.
	CIDR() string
}

// Step is the whole set of policies in effect for one check.
type Step func(w World) []*Policy

// Policies is a Step of fixed policies.
func Policies(ps ...*Policy) Step { return func(World) []*Policy { return ps } }

// Case is one row of the conformance table: after each step the full
// reachability matrix of every port and protocol is checked.
type Case struct {
	Name  string
	Steps []Step
}

// Cases is the conformance table.
var Cases = []Case{
	{"no policies: everything passes", []Step{Policies()}},
	{"default deny ingress in x", []Step{Policies(NewPolicy("x", "deny-ingress", EveryPod, ing))}},
	{"default deny egress in x", []Step{Policies(NewPolicy("x", "deny-egress", EveryPod, eg))}},
	{"default deny both directions in x", []Step{Policies(NewPolicy("x", "deny-all", EveryPod, ing, eg))}},
	{"allow ingress from the same namespace", []Step{Policies(
		NewPolicy("x", "same-ns", EveryPod, ing).WithIngress(From(Peer{PodSelector: &LabelSelector{}})))}},
	{"policyTypes defaulted: ingress rules only enforce ingress", []Step{Policies(
		NewPolicy("x", "default-types", EveryPod).WithIngress(From(Peer{PodSelector: SelP("pod", "b")})))}},
	{"allow ingress to x/a from namespace y (namespaceSelector on kubernetes.io/metadata.name)", []Step{Policies(
		NewPolicy("x", "from-y", PodSel("pod", "a"), ing).WithIngress(From(Peer{NamespaceSelector: NSName("y")})))}},
	{"allow ingress to x/a from namespaces other than x (NotIn)", []Step{Policies(
		NewPolicy("x", "not-x", PodSel("pod", "a"), ing).WithIngress(From(Peer{NamespaceSelector: &LabelSelector{
			MatchExpressions: []LabelExpr{{Key: "kubernetes.io/metadata.name", Operator: "NotIn", Values: []string{"x"}}}}})))}},
	{"podSelector AND namespaceSelector in one peer", []Step{Policies(
		NewPolicy("x", "b-in-y", PodSel("pod", "a"), ing).WithIngress(From(Peer{NamespaceSelector: NSName("y"), PodSelector: SelP("pod", "b")})))}},
	{"podSelector OR namespaceSelector as two peers", []Step{Policies(
		NewPolicy("x", "y-or-b", PodSel("pod", "a"), ing).WithIngress(From(Peer{NamespaceSelector: NSName("y")}, Peer{PodSelector: SelP("pod", "b")})))}},
	{"any namespace's pods c (empty namespaceSelector)", []Step{Policies(
		NewPolicy("x", "any-c", PodSel("pod", "a"), ing).WithIngress(From(Peer{NamespaceSelector: &LabelSelector{}, PodSelector: SelP("pod", "c")})))}},
	{"ingress on TCP 81 only, from anywhere", []Step{Policies(
		NewPolicy("x", "port-81", PodSel("pod", "a"), ing).WithIngress(Rule{}.On(TCP(81))))}},
	{"port range with endPort and a UDP port, from namespace z", []Step{Policies(
		NewPolicy("x", "range", PodSel("pod", "a"), ing).WithIngress(From(Peer{NamespaceSelector: NSName("z")}).On(
			Port{Protocol: "TCP", Port: IntP(80), EndPort: IntP(81)}, Port{Protocol: "UDP", Port: IntP(81)})))}},
	{"UDP on every port only", []Step{Policies(
		NewPolicy("x", "udp", EveryPod, ing).WithIngress(Rule{}.On(Port{Protocol: "UDP"})))}},
	{"egress to namespace y on TCP 80 only", []Step{Policies(
		NewPolicy("x", "egress-y-80", EveryPod, eg).WithEgress(To(Peer{NamespaceSelector: NSName("y")}).On(TCP(80))))}},
	{"ipBlock: a pod's /32 admits that pod and no other", []Step{func(w World) []*Policy {
		return []*Policy{NewPolicy("x", "pod-32", PodSel("pod", "a"), ing).WithIngress(From(Block(w.Host32("y", "b"))))}
	}}},
	{"ipBlock except carves out pods", []Step{func(w World) []*Policy {
		return []*Policy{NewPolicy("x", "except", PodSel("pod", "a"), ing).WithIngress(
			From(Block(w.CIDR(), w.Host32("y", "b"), w.Host32("z", "c"))))}
	}}},
	{"egress to 0.0.0.0/0 allows every pod", []Step{Policies(
		NewPolicy("x", "egress-all", EveryPod, eg).WithEgress(To(Block("0.0.0.0/0"))))}},
	{"egress to 0.0.0.0/0 except a pod", []Step{func(w World) []*Policy {
		return []*Policy{NewPolicy("x", "egress-except", EveryPod, eg).WithEgress(To(Block("0.0.0.0/0", w.Host32("y", "a"))))}
	}}},
	{"an except is not undone by another policy's broader ipBlock on another port", []Step{func(w World) []*Policy {
		return []*Policy{
			NewPolicy("x", "except-80", PodSel("pod", "a"), ing).WithIngress(From(Block(w.CIDR(), w.Host32("y", "b"))).On(TCP(80))),
			NewPolicy("x", "all-81", PodSel("pod", "a"), ing).WithIngress(From(Block("0.0.0.0/0")).On(TCP(81))),
		}
	}}},
	{"a selector of another policy allows an excepted pod", []Step{func(w World) []*Policy {
		return []*Policy{
			NewPolicy("x", "except-yb", PodSel("pod", "a"), ing).WithIngress(From(Block(w.CIDR(), w.Host32("y", "b")))),
			NewPolicy("x", "yb", PodSel("pod", "a"), ing).WithIngress(From(Peer{NamespaceSelector: NSName("y"), PodSelector: SelP("pod", "b")}).On(TCP(81))),
		}
	}}},
	{"multiple policies are OR'd", []Step{Policies(
		NewPolicy("x", "y-on-80", PodSel("pod", "a"), ing).WithIngress(From(Peer{NamespaceSelector: NSName("y")}).On(TCP(80))),
		NewPolicy("x", "z-on-81", PodSel("pod", "a"), ing).WithIngress(From(Peer{NamespaceSelector: NSName("z")}).On(TCP(81))))}},
	{"egress of x and ingress of y both apply", []Step{Policies(
		NewPolicy("x", "egress-to-y", EveryPod, eg).WithEgress(To(Peer{NamespaceSelector: NSName("y")})),
		NewPolicy("y", "ingress-from-a", EveryPod, ing).WithIngress(From(Peer{NamespaceSelector: &LabelSelector{}, PodSelector: SelP("pod", "a")})))}},
	{"policy update, then deletion", []Step{
		Policies(NewPolicy("x", "changing", PodSel("pod", "a"), ing).WithIngress(From(Peer{NamespaceSelector: NSName("y")}))),
		Policies(NewPolicy("x", "changing", PodSel("pod", "a"), ing).WithIngress(From(Peer{NamespaceSelector: NSName("z")}).On(TCP(81)))),
		Policies(),
	}},
}
