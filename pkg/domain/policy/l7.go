package policy

import (
	"cmp"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
)

// HTTPRule is one entry of a port rule's rules.http[], as Cilium
// documents it: every field given must match (an empty rule matches
// every request). Method and Path are extended POSIX-like regular
// expressions anchored at both ends (Go RE2 syntax); Host is a regular
// expression on the Host header (port stripped); each of Headers is
// "Name" (the header is present) or "Name: value" (a value equal to it).
type HTTPRule struct {
	Method  string   `json:"method,omitempty"`
	Path    string   `json:"path,omitempty"`
	Host    string   `json:"host,omitempty"`
	Headers []string `json:"headers,omitempty"`
}

// maxHTTPRules bounds the rules.http[] of one port rule; maxRegexp the
// length of one regular expression.
const (
	maxHTTPRules = 256
	maxRegexp    = 1024
)

// CompiledHTTPRule is an HTTPRule with its regular expressions compiled.
type CompiledHTTPRule struct {
	Rule               HTTPRule
	method, path, host *regexp.Regexp
	headers            []headerMatch
}

type headerMatch struct {
	name, value string
	hasValue    bool
}

// CompileHTTPRule validates r; an error names the field below path.
func CompileHTTPRule(r HTTPRule, path string) (*CompiledHTTPRule, error) {
	c := &CompiledHTTPRule{Rule: r}
	var err error
	if c.method, err = anchored(r.Method, path+".method"); err != nil {
		return nil, err
	}
	if c.path, err = anchored(r.Path, path+".path"); err != nil {
		return nil, err
	}
	if r.Path != "" && !strings.HasPrefix(r.Path, "/") {
		return nil, fmt.Errorf("%s.path: %q must start with '/'", path, r.Path)
	}
	if c.host, err = anchored(r.Host, path+".host"); err != nil {
		return nil, err
	}
	for i, h := range r.Headers {
		name, value, has := strings.Cut(h, ":")
		name = strings.TrimSpace(name)
		if name == "" || strings.ContainsAny(name, " \t\r\n") {
			return nil, fmt.Errorf("%s.headers[%d]: %q is not \"Name\" or \"Name: value\"", path, i, h)
		}
		c.headers = append(c.headers, headerMatch{http.CanonicalHeaderKey(name), strings.TrimSpace(value), has})
	}
	return c, nil
}

func anchored(expr, path string) (*regexp.Regexp, error) {
	if expr == "" {
		return nil, nil
	}
	if len(expr) > maxRegexp {
		return nil, fmt.Errorf("%s: regular expression longer than %d bytes", path, maxRegexp)
	}
	re, err := regexp.Compile("^(?:" + expr + ")$")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return re, nil
}

// Matches reports whether the request (method, path without query, host
// without port, header) matches every field of the rule.
func (c *CompiledHTTPRule) Matches(method, path, host string, header http.Header) bool {
	if c.method != nil && !c.method.MatchString(method) {
		return false
	}
	if c.path != nil && !c.path.MatchString(path) {
		return false
	}
	if c.host != nil && !c.host.MatchString(host) {
		return false
	}
	for _, h := range c.headers {
		vs, ok := header[h.name]
		if !ok || (h.hasValue && !slices.Contains(vs, h.value)) {
			return false
		}
	}
	return true
}

// L7Entry marks the policy map entry Key as redirected to the L7 proxy,
// which allows only requests matching one of HTTP. An entry whose HTTP
// holds an empty rule allows every request (an L4-only rule on the same
// port and peer), but the port is still redirected.
type L7Entry struct {
	Key  Key
	HTTP []HTTPRule
}

// L7Parser names the proxy an L7 entry is redirected to; each parser's
// proxy listens on its own port of the node (ProxyPorts).
type L7Parser string

// ParserHTTP is the HTTP proxy (cmd/membrane-proxy); ParserDNS the
// agent's DNS proxy (DNSEntry).
const (
	ParserHTTP L7Parser = "http"
	ParserDNS  L7Parser = "dns"
)

// Parser is the proxy e's traffic goes to. Every entry is HTTP today;
// another protocol's rules on L7Entry name their parser here.
func (e L7Entry) Parser() L7Parser { return ParserHTTP }

// ProxyPorts maps each parser to its proxy's listening port on the node
// (the proxies' configuration, not the policy's).
type ProxyPorts map[L7Parser]uint16

// Redirects returns the proxy port of each redirected entry of m: the
// value the datapath writes into the policy map entry (0 everywhere
// else). Returns ErrNoProxy, naming the entry, if no proxy of an entry's
// parser listens (ports has no port for it): the entry must not allow
// traffic around the proxy.
func (m *MapState) Redirects(ports ProxyPorts) (map[Key]uint16, error) {
	if !m.HasL7() && !m.HasDNS() {
		return nil, nil
	}
	out := make(map[Key]uint16, len(m.L7)+len(m.DNS))
	for _, e := range m.DNS {
		p := ports[ParserDNS]
		if p == 0 {
			return nil, fmt.Errorf("entry %+v: %w for parser %q", e.Key, ErrNoProxy, ParserDNS)
		}
		out[e.Key] = p
	}
	for _, e := range m.L7 {
		p := ports[e.Parser()]
		if p == 0 {
			return nil, fmt.Errorf("entry %+v: %w for parser %q", e.Key, ErrNoProxy, e.Parser())
		}
		out[e.Key] = p
	}
	return out, nil
}

// Redirected reports whether the entry k is redirected to the proxy.
func (m *MapState) Redirected(k Key) bool {
	if m == nil {
		return false
	}
	_, ok := slices.BinarySearchFunc(m.L7, k, func(e L7Entry, k Key) int { return Compare(e.Key, k) })
	return ok
}

// HasL7 reports whether some entry is redirected to the proxy.
func (m *MapState) HasL7() bool { return m != nil && len(m.L7) > 0 }

func l7Equal(a, b []L7Entry) bool {
	return slices.EqualFunc(a, b, func(x, y L7Entry) bool {
		return x.Key == y.Key && slices.EqualFunc(x.HTTP, y.HTTP, func(p, q HTTPRule) bool {
			return p.Method == q.Method && p.Path == q.Path && p.Host == q.Host && slices.Equal(p.Headers, q.Headers)
		})
	})
}

// l7Builder merges the L7 rules of every key: the union of the rules of
// all rules on that key, an L4-only rule on a redirected key allowing
// every request.
type l7Builder struct {
	rules map[Key][]HTTPRule
	l4    map[Key]bool
}

// add records the L7 rules of k (nil: an L4-only rule). A nil builder
// (a policy without L7 rules) records nothing.
func (b *l7Builder) add(k Key, http []HTTPRule) {
	if b == nil {
		return
	}
	if http == nil {
		if b.l4 == nil {
			b.l4 = map[Key]bool{}
		}
		b.l4[k] = true
		return
	}
	if b.rules == nil {
		b.rules = map[Key][]HTTPRule{}
	}
	b.rules[k] = append(b.rules[k], http...)
}

func (b *l7Builder) entries() []L7Entry {
	if b == nil || len(b.rules) == 0 {
		return nil
	}
	out := make([]L7Entry, 0, len(b.rules))
	for k, rs := range b.rules {
		if b.l4[k] {
			rs = []HTTPRule{{}}
		}
		rs = slices.Clone(rs)
		slices.SortFunc(rs, compareHTTPRule)
		rs = slices.CompactFunc(rs, func(a, b HTTPRule) bool { return compareHTTPRule(a, b) == 0 })
		out = append(out, L7Entry{Key: k, HTTP: rs})
	}
	slices.SortFunc(out, func(a, b L7Entry) int { return Compare(a.Key, b.Key) })
	return out
}

func compareHTTPRule(a, b HTTPRule) int {
	return cmp.Or(cmp.Compare(a.Method, b.Method), cmp.Compare(a.Path, b.Path), cmp.Compare(a.Host, b.Host),
		slices.Compare(a.Headers, b.Headers))
}

// anyL7 reports whether some peer rule of prs has L7 rules.
func anyL7(prs []PeerRule) bool {
	return slices.ContainsFunc(prs, func(pr PeerRule) bool { return pr.HTTP != nil })
}

// HasHTTPRules reports whether any of p's rules has L7 (HTTP) rules.
func (p *Policy) HasHTTPRules() bool {
	for _, r := range p.Rules {
		for _, pr := range slices.Concat(r.Ingress, r.Egress) {
			if pr.HTTP != nil {
				return true
			}
		}
	}
	return false
}
