package policy

import (
	"cmp"
	"fmt"
	"maps"
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
// HeaderMatches are Cilium's: a header that must have a value (or be
// present, without one), and what to do when it does not (Mismatch).
type HTTPRule struct {
	Method        string        `json:"method,omitempty"`
	Path          string        `json:"path,omitempty"`
	Host          string        `json:"host,omitempty"`
	Headers       []string      `json:"headers,omitempty"`
	HeaderMatches []HeaderMatch `json:"headerMatches,omitempty"`
}

// HeaderMatch is one rules.http[].headerMatches[] entry, as Cilium's.
// Mismatch "" (the default) makes a request without the header value
// fail the rule; the other actions let the rule match and act on the
// request the proxy forwards: LOG records the mismatch in the access
// record, ADD adds the header with Value (keeping other values),
// DELETE removes the header, REPLACE sets it to Value. Secret names a
// Kubernetes Secret whose one entry is the value, as in Cilium: while it
// does not resolve (absent, or not exactly one entry) Value stands in, and
// without a Value the match never holds (the rule matches no request,
// whatever Mismatch says). The policy never holds the secret's value: the
// agent sends the values to the proxy apart from the rules
// (CompileHTTPRuleWith).
type HeaderMatch struct {
	Mismatch string           `json:"mismatch,omitempty"`
	Name     string           `json:"name"`
	Secret   *HeaderSecretRef `json:"secret,omitempty"`
	Value    string           `json:"value,omitempty"`
}

// HeaderSecretRef is Cilium's reference to a Secret holding a header
// value. A parsed policy's references all name a namespace (the policy's
// when the document gave none) and only the agent's secrets namespace
// (ParseOptions.SecretsNamespace).
type HeaderSecretRef struct {
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
}

// String is the reference as logs, events and the API show it in place
// of a value: "secret ns/name".
func (r HeaderSecretRef) String() string { return "secret " + r.Namespace + "/" + r.Name }

// Key is the reference's "ns/name", the key of SecretValues.
func (r HeaderSecretRef) Key() string { return r.Namespace + "/" + r.Name }

// SecretValues resolves header secrets ("ns/name" to the value); a
// missing key is a secret that does not resolve.
type SecretValues map[string]string

// Header mismatch actions (HeaderMatch.Mismatch).
const (
	MismatchFail    = ""
	MismatchLog     = "LOG"
	MismatchAdd     = "ADD"
	MismatchDelete  = "DELETE"
	MismatchReplace = "REPLACE"
)

// maxHeaderMatches bounds a rule's headerMatches; maxHeaderValue a value.
const (
	maxHeaderMatches = 64
	maxHeaderValue   = 8 << 10
)

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
	mismatch    string // HeaderMatch.Mismatch (headerMatches only)
	// never: a secret that does not resolve and no value to fall back
	// on; the rule matches no request.
	never bool
}

// matches reports whether header holds the match's value (is present,
// without one).
func (h headerMatch) matches(header http.Header) bool {
	vs, ok := header[h.name]
	return ok && (!h.hasValue || slices.Contains(vs, h.value))
}

// HeaderMismatch is a headerMatches entry with a mismatch action that a
// request matched by its rule does not satisfy: what the proxy does to
// the request (Apply) and records.
type HeaderMismatch struct {
	Name, Value, Action string
}

// String is the access record's form: "ACTION name".
func (m HeaderMismatch) String() string { return m.Action + " " + m.Name }

// Apply changes header as the action says (LOG changes nothing).
func (m HeaderMismatch) Apply(header http.Header) {
	switch m.Action {
	case MismatchAdd:
		header.Add(m.Name, m.Value)
	case MismatchDelete:
		header.Del(m.Name)
	case MismatchReplace:
		header.Set(m.Name, m.Value)
	}
}

// CompileHTTPRule validates r; an error names the field below path. A
// headerMatches secret compiles as if it did not resolve (CompileHTTPRuleWith).
func CompileHTTPRule(r HTTPRule, path string) (*CompiledHTTPRule, error) {
	return CompileHTTPRuleWith(r, path, nil)
}

// CompileHTTPRuleWith is CompileHTTPRule with the values of the
// headerMatches secrets. Errors never hold a secret's value.
func CompileHTTPRuleWith(r HTTPRule, path string, secrets SecretValues) (*CompiledHTTPRule, error) {
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
		c.headers = append(c.headers, headerMatch{name: http.CanonicalHeaderKey(name), value: strings.TrimSpace(value), hasValue: has})
	}
	if len(r.HeaderMatches) > maxHeaderMatches {
		return nil, fmt.Errorf("%s.headerMatches: %d entries, more than %d", path, len(r.HeaderMatches), maxHeaderMatches)
	}
	for i, h := range r.HeaderMatches {
		hp := fmt.Sprintf("%s.headerMatches[%d]", path, i)
		if h.Name == "" || !validHeaderName(h.Name) {
			return nil, fmt.Errorf("%s.name: %q is not an HTTP header name", hp, h.Name)
		}
		if h.Secret != nil {
			if err := validSecretRef(*h.Secret); err != nil {
				return nil, fmt.Errorf("%s.secret: %w", hp, err)
			}
		}
		if len(h.Value) > maxHeaderValue || strings.ContainsAny(h.Value, "\r\n\x00") {
			return nil, fmt.Errorf("%s.value: longer than %d bytes or holding CR, LF or NUL", hp, maxHeaderValue)
		}
		switch h.Mismatch {
		case MismatchFail, MismatchLog, MismatchDelete:
		case MismatchAdd, MismatchReplace:
			if h.Value == "" && h.Secret == nil {
				return nil, fmt.Errorf("%s: mismatch %s needs a value (or a secret)", hp, h.Mismatch)
			}
		default:
			return nil, fmt.Errorf("%s.mismatch: %q: want LOG, ADD, DELETE or REPLACE (or none)", hp, h.Mismatch)
		}
		m, err := resolveHeaderMatch(h, secrets)
		if err != nil {
			return nil, fmt.Errorf("%s.secret: %w", hp, err)
		}
		c.headers = append(c.headers, m)
	}
	return c, nil
}

// resolveHeaderMatch is h with its secret's value, as Cilium's: the
// secret's value when it resolves to a non-empty one, else Value when
// given, else a resolved empty secret is a presence match and an
// unresolved one never matches.
func resolveHeaderMatch(h HeaderMatch, secrets SecretValues) (headerMatch, error) {
	m := headerMatch{name: http.CanonicalHeaderKey(h.Name), value: h.Value, hasValue: h.Value != "", mismatch: h.Mismatch}
	if h.Secret == nil {
		return m, nil
	}
	v, ok := secrets[h.Secret.Key()]
	switch {
	case ok && v != "":
		if len(v) > maxHeaderValue || strings.ContainsAny(v, "\r\n\x00") {
			// The message names the secret, never its value.
			return m, fmt.Errorf("%s: value longer than %d bytes or holding CR, LF or NUL", h.Secret, maxHeaderValue)
		}
		m.value, m.hasValue = v, true
	case h.Value != "":
	case ok: // an empty secret: the header's presence (an empty value)
	default:
		m.never = true
	}
	return m, nil
}

// validSecretRef checks a reference's names (DNS subdomains, as
// Kubernetes names Secrets; the namespace a DNS label).
func validSecretRef(r HeaderSecretRef) error {
	if !validDNSName(r.Name, 253) {
		return fmt.Errorf("name %q is not a Secret name (a DNS subdomain)", r.Name)
	}
	if r.Namespace != "" && (!validDNSName(r.Namespace, 63) || strings.Contains(r.Namespace, ".")) {
		return fmt.Errorf("namespace %q is not a namespace name (a DNS label)", r.Namespace)
	}
	return nil
}

// validDNSName: lowercase letters, digits, '-' and '.', at most max
// bytes, starting and ending with a letter or digit.
func validDNSName(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i, c := range []byte(s) {
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && ((c != '-' && c != '.') || i == 0 || i == len(s)-1) {
			return false
		}
	}
	return true
}

// validHeaderName: a token (RFC 9110), what a header field name may be.
func validHeaderName(s string) bool {
	for _, c := range []byte(s) {
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return true
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
		if h.never || (h.mismatch == MismatchFail && !h.matches(header)) {
			return false
		}
	}
	return true
}

// Mismatches are the rule's headerMatches with a mismatch action that
// header does not satisfy, in the rule's order: for a request the rule
// matched, what the proxy applies and records.
func (c *CompiledHTTPRule) Mismatches(header http.Header) []HeaderMismatch {
	var out []HeaderMismatch
	for _, h := range c.headers {
		if h.mismatch != MismatchFail && !h.matches(header) {
			out = append(out, HeaderMismatch{Name: h.name, Value: h.value, Action: h.mismatch})
		}
	}
	return out
}

// L7Entry marks the policy map entry Key as redirected to the L7 proxy,
// which allows only requests matching one of HTTP (or, for a Kafka
// entry, Kafka). An entry whose rules hold an empty rule allows every
// request (an L4-only rule on the same port and peer), but the port is
// still redirected. An entry that rules of both protocols redirect
// (Cilium refuses to compute such a policy) has neither: its proxy
// denies every request.
type L7Entry struct {
	Key   Key
	HTTP  []HTTPRule  `json:",omitempty"`
	Kafka []KafkaRule `json:",omitempty"`
}

// L7Parser names the proxy an L7 entry is redirected to; each parser's
// proxy listens on its own port of the node (ProxyPorts).
type L7Parser string

// ParserHTTP is the HTTP proxy (cmd/membrane-proxy), ParserKafka its
// Kafka listener; ParserDNS the agent's DNS proxy (DNSEntry).
const (
	ParserHTTP  L7Parser = "http"
	ParserKafka L7Parser = "kafka"
	ParserDNS   L7Parser = "dns"
)

// Parser is the proxy e's traffic goes to: Kafka's for Kafka rules,
// else HTTP's.
func (e L7Entry) Parser() L7Parser {
	if e.Kafka != nil {
		return ParserKafka
	}
	return ParserHTTP
}

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
		return x.Key == y.Key && slices.Equal(x.Kafka, y.Kafka) && slices.EqualFunc(x.HTTP, y.HTTP, func(p, q HTTPRule) bool {
			return compareHTTPRule(p, q) == 0
		})
	})
}

// l7Builder merges the L7 rules of every key: the union of the rules of
// all rules on that key, an L4-only rule on a redirected key allowing
// every request.
type l7Builder struct {
	rules map[Key][]HTTPRule
	kafka map[Key][]KafkaRule
	l4    map[Key]bool
}

// add records the L7 rules of k (both nil: an L4-only rule). A nil
// builder (a policy without L7 rules) records nothing.
func (b *l7Builder) add(k Key, http []HTTPRule, kafka []KafkaRule) {
	if b == nil {
		return
	}
	switch {
	case http == nil && kafka == nil:
		if b.l4 == nil {
			b.l4 = map[Key]bool{}
		}
		b.l4[k] = true
	case kafka != nil:
		if b.kafka == nil {
			b.kafka = map[Key][]KafkaRule{}
		}
		b.kafka[k] = append(b.kafka[k], kafka...)
	default:
		if b.rules == nil {
			b.rules = map[Key][]HTTPRule{}
		}
		b.rules[k] = append(b.rules[k], http...)
	}
}

// clone returns a copy of b that add changes without changing b (nil:
// an empty builder).
func (b *l7Builder) clone() *l7Builder {
	if b == nil {
		return &l7Builder{}
	}
	c := &l7Builder{rules: maps.Clone(b.rules), kafka: maps.Clone(b.kafka), l4: maps.Clone(b.l4)}
	for k, rs := range c.rules {
		c.rules[k] = slices.Clip(rs)
	}
	for k, rs := range c.kafka {
		c.kafka[k] = slices.Clip(rs)
	}
	return c
}

// NamedL7Entry is the L7 rules one rule gives an ingress named entry
// (both nil: an L4-only rule); MapState.ForPorts merges them into the
// L7 entry of the key Key resolves to.
type NamedL7Entry struct {
	Key   NamedKey
	HTTP  []HTTPRule  `json:",omitempty"`
	Kafka []KafkaRule `json:",omitempty"`
}

// compareNamedL7 orders entries by key, then rules; no rules (nil)
// differs from an empty list (which allows no request).
func compareNamedL7(a, b NamedL7Entry) int {
	return cmp.Or(compareNamedKey(a.Key, b.Key), compareBool(a.HTTP != nil, b.HTTP != nil),
		compareBool(a.Kafka != nil, b.Kafka != nil), slices.CompareFunc(a.HTTP, b.HTTP, compareHTTPRule),
		slices.CompareFunc(a.Kafka, b.Kafka, compareKafkaRule))
}

func namedL7Equal(a, b []NamedL7Entry) bool {
	return slices.EqualFunc(a, b, func(x, y NamedL7Entry) bool { return compareNamedL7(x, y) == 0 })
}

func (b *l7Builder) entries() []L7Entry {
	if b == nil || len(b.rules)+len(b.kafka) == 0 {
		return nil
	}
	out := make([]L7Entry, 0, len(b.rules)+len(b.kafka))
	for k, rs := range b.rules {
		if _, conflict := b.kafka[k]; conflict {
			out = append(out, L7Entry{Key: k}) // both protocols: the HTTP proxy, no rules
			continue
		}
		if b.l4[k] {
			rs = []HTTPRule{{}}
		}
		rs = slices.Clone(rs)
		slices.SortFunc(rs, compareHTTPRule)
		rs = slices.CompactFunc(rs, func(a, b HTTPRule) bool { return compareHTTPRule(a, b) == 0 })
		out = append(out, L7Entry{Key: k, HTTP: rs})
	}
	for k, rs := range b.kafka {
		if _, conflict := b.rules[k]; conflict {
			continue
		}
		if b.l4[k] {
			rs = []KafkaRule{{}}
		}
		rs = slices.Clone(rs)
		slices.SortFunc(rs, compareKafkaRule)
		rs = slices.Compact(rs)
		out = append(out, L7Entry{Key: k, Kafka: rs})
	}
	slices.SortFunc(out, func(a, b L7Entry) int { return Compare(a.Key, b.Key) })
	return out
}

func compareHTTPRule(a, b HTTPRule) int {
	return cmp.Or(cmp.Compare(a.Method, b.Method), cmp.Compare(a.Path, b.Path), cmp.Compare(a.Host, b.Host),
		slices.Compare(a.Headers, b.Headers), slices.CompareFunc(a.HeaderMatches, b.HeaderMatches, compareHeaderMatch))
}

func compareHeaderMatch(a, b HeaderMatch) int {
	var as, bs HeaderSecretRef
	if a.Secret != nil {
		as = *a.Secret
	}
	if b.Secret != nil {
		bs = *b.Secret
	}
	return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Value, b.Value), cmp.Compare(a.Mismatch, b.Mismatch),
		cmp.Compare(boolInt(a.Secret != nil), boolInt(b.Secret != nil)), cmp.Compare(as.Namespace, bs.Namespace), cmp.Compare(as.Name, bs.Name))
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// SecretRefs returns the headerMatches secrets m's L7 entries name,
// sorted, each once.
func (m *MapState) SecretRefs() []HeaderSecretRef {
	if m == nil {
		return nil
	}
	var out []HeaderSecretRef
	for _, e := range m.L7 {
		for _, r := range e.HTTP {
			for _, h := range r.HeaderMatches {
				if h.Secret != nil {
					out = append(out, *h.Secret)
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b HeaderSecretRef) int { return cmp.Compare(a.Key(), b.Key()) })
	return slices.Compact(out)
}

// anyL7 reports whether some peer rule of prs has L7 rules.
func anyL7(prs []PeerRule) bool {
	return slices.ContainsFunc(prs, func(pr PeerRule) bool { return pr.HTTP != nil || pr.Kafka != nil })
}

// HasHTTPRules reports whether any of p's rules has L7 (HTTP or Kafka)
// rules: rules the L7 proxy enforces.
func (p *Policy) HasHTTPRules() bool {
	for _, r := range p.Rules {
		for _, pr := range slices.Concat(r.Ingress, r.Egress) {
			if pr.HTTP != nil || pr.Kafka != nil {
				return true
			}
		}
	}
	return false
}
