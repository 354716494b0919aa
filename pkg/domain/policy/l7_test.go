package policy

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

const l7Policy = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: l7}
spec:
  endpointSelector: {matchLabels: {app: b}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: a}}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
      rules:
        http:
        - {method: GET, path: "/public.*"}
        - {method: PUT, path: /x, host: "b\\.test", headers: ["X-Token: t1", X-Trace]}
    - ports: [{port: "9090", protocol: TCP}]
`

func TestL7MapState(t *testing.T) {
	r := NewRepository()
	const a, b, c identity.NumericIdentity = 300, 301, 302
	r.UpsertIdentity(a, podLabels(t, "default", "app=a"))
	r.UpsertIdentity(b, podLabels(t, "default", "app=b"))
	r.UpsertIdentity(c, podLabels(t, "default", "app=c"))
	r.Import(mustParse(t, l7Policy))
	m := r.MapState(b)
	k80 := Key{a, 80, ProtoTCP, Ingress}
	k9090 := Key{a, 9090, ProtoTCP, Ingress}
	if !m.Has(k80) || !m.Has(k9090) || !m.Redirected(k80) || m.Redirected(k9090) {
		t.Fatalf("80 must be allowed and redirected, 9090 allowed and not: %+v", m)
	}
	if len(m.L7) != 1 || len(m.L7[0].HTTP) != 2 || !m.HasL7() {
		t.Fatalf("L7 = %+v, want one entry with 2 rules", m.L7)
	}
	if m.Allows(c, 80, ProtoTCP, Ingress) {
		t.Error("c must not reach port 80")
	}
	// An L4-only rule on the same key allows every request (still through the proxy).
	r.Import(mustParse(t, strings.Replace(l7Policy, "name: l7", "name: l4", 1)+"    - ports: [{port: \"80\", protocol: TCP}]\n"))
	m = r.MapState(b)
	if !m.Redirected(k80) || len(m.L7[0].HTTP) != 1 || compareHTTPRule(m.L7[0].HTTP[0], HTTPRule{}) != 0 {
		t.Errorf("L4 rule on an L7 port: L7 = %+v, want one allow-all rule", m.L7)
	}
	if _, err := r.DeleteByName("default/l7"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.DeleteByName("default/l4"); err != nil {
		t.Fatal(err)
	}
	if m := r.MapState(b); m.HasL7() {
		t.Errorf("rules removed: L7 = %+v", m.L7)
	}
}

func TestL7ParseErrors(t *testing.T) {
	head := "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: x}\nspec:\n  endpointSelector: {}\n  ingress:\n  - toPorts:\n"
	tests := []struct{ name, doc, want string }{
		{"bad path regexp", "    - ports: [{port: \"80\", protocol: TCP}]\n      rules: {http: [{path: \"/(\"}]}\n", "spec.ingress[0].toPorts[0].rules.http[0].path"},
		{"relative path", "    - ports: [{port: \"80\", protocol: TCP}]\n      rules: {http: [{path: \"x\"}]}\n", "must start with '/'"},
		{"headerMatches secret outside Kubernetes mode", "    - ports: [{port: \"80\", protocol: TCP}]\n      rules: {http: [{headerMatches: [{name: X-Token, secret: {name: s}}]}]}\n", "headerMatches[0].secret: header secrets are read in Kubernetes mode only"},
		{"headerMatches mismatch", "    - ports: [{port: \"80\", protocol: TCP}]\n      rules: {http: [{headerMatches: [{name: X-A, value: b, mismatch: DROP}]}]}\n", "headerMatches[0].mismatch"},
		{"headerMatches add without value", "    - ports: [{port: \"80\", protocol: TCP}]\n      rules: {http: [{headerMatches: [{name: X-A, mismatch: ADD}]}]}\n", "mismatch ADD needs a value"},
		{"headerMatches name", "    - ports: [{port: \"80\", protocol: TCP}]\n      rules: {http: [{headerMatches: [{name: \"X A\", value: b}]}]}\n", "headerMatches[0].name"},
		{"headerMatches unknown field", "    - ports: [{port: \"80\", protocol: TCP}]\n      rules: {http: [{headerMatches: [{name: X-A, regex: b}]}]}\n", `unsupported field`},
		{"kafka role and apiKey", "    - ports: [{port: \"9092\", protocol: TCP}]\n      rules: {kafka: [{role: produce, apiKey: fetch}]}\n", `rules.kafka[0]: role "produce" and apiKey "fetch" together`},
		{"kafka role", "    - ports: [{port: \"9092\", protocol: TCP}]\n      rules: {kafka: [{role: admin}]}\n", `rules.kafka[0].role: "admin"`},
		{"kafka apiKey", "    - ports: [{port: \"9092\", protocol: TCP}]\n      rules: {kafka: [{apiKey: listpartitionreassignments}]}\n", `rules.kafka[0].apiKey: unknown Kafka API key`},
		{"kafka apiVersion", "    - ports: [{port: \"9092\", protocol: TCP}]\n      rules: {kafka: [{apiVersion: \"-1\"}]}\n", `rules.kafka[0].apiVersion: "-1"`},
		{"kafka topic", "    - ports: [{port: \"9092\", protocol: TCP}]\n      rules: {kafka: [{topic: \"a/b\"}]}\n", `rules.kafka[0].topic: "a/b" is not a Kafka topic name`},
		{"kafka and http", "    - ports: [{port: \"9092\", protocol: TCP}]\n      rules: {kafka: [{}], http: [{}]}\n", `kafka with http or dns in one port rule`},
		{"kafka unknown field", "    - ports: [{port: \"9092\", protocol: TCP}]\n      rules: {kafka: [{group: g}]}\n", `unsupported field "spec.ingress[0].toPorts[0].rules.kafka[0].group"`},
		{"l7proto", "    - ports: [{port: \"80\", protocol: TCP}]\n      rules: {l7proto: x}\n", `unsupported field "spec.ingress[0].toPorts[0].rules.l7proto" (generic L7 parsers`},
		{"udp", "    - ports: [{port: \"80\", protocol: UDP}]\n      rules: {http: [{}]}\n", "need TCP ports"},
		{"no port", "    - rules: {http: [{}]}\n", "need at least one port"},
		{"bad header", "    - ports: [{port: \"80\", protocol: TCP}]\n      rules: {http: [{headers: [\": v\"]}]}\n", "headers[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(head + tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestHTTPRuleMatches(t *testing.T) {
	c, err := CompileHTTPRule(HTTPRule{Method: "GET|HEAD", Path: "/public(/.*)?", Host: `b\.test`, Headers: []string{"x-token: t1", "X-Trace"}}, "r")
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{"X-Token": {"t1"}, "X-Trace": {""}}
	tests := []struct {
		name, method, path, host string
		header                   http.Header
		want                     bool
	}{
		{"all match", "GET", "/public/a", "b.test", h, true},
		{"head", "HEAD", "/public", "b.test", h, true},
		{"method anchored", "GETX", "/public", "b.test", h, false},
		{"path anchored", "GET", "/x/public", "b.test", h, false},
		{"private", "GET", "/private", "b.test", h, false},
		{"host", "GET", "/public", "c.test", h, false},
		{"header value", "GET", "/public", "b.test", http.Header{"X-Token": {"t2"}, "X-Trace": {""}}, false},
		{"header missing", "GET", "/public", "b.test", http.Header{"X-Token": {"t1"}}, false},
	}
	for _, tt := range tests {
		if got := c.Matches(tt.method, tt.path, tt.host, tt.header); got != tt.want {
			t.Errorf("%s: Matches = %v, want %v", tt.name, got, tt.want)
		}
	}
	all, _ := CompileHTTPRule(HTTPRule{}, "r")
	if !all.Matches("POST", "/anything", "", nil) {
		t.Error("an empty rule must match every request")
	}
}

func TestRedirects(t *testing.T) {
	k80 := Key{Identity: 1001, Port: 80, Proto: ProtoTCP, Dir: Ingress}
	k81 := Key{Identity: 1001, Port: 81, Proto: ProtoTCP, Dir: Ingress}
	m := NewMapState(1, true, false, []Key{k80, k81})
	m.L7 = []L7Entry{{Key: k80, HTTP: []HTTPRule{{Path: "/public"}}}}
	got, err := m.Redirects(ProxyPorts{ParserHTTP: 15001})
	if err != nil || len(got) != 1 || got[k80] != 15001 || got[k81] != 0 {
		t.Errorf("Redirects = %v, %v; want only %v -> 15001", got, err, k80)
	}
	if _, err := m.Redirects(ProxyPorts{}); !errors.Is(err, ErrNoProxy) {
		t.Errorf("Redirects without an HTTP proxy port: %v, want ErrNoProxy", err)
	}
	if got, err := NewMapState(1, true, false, []Key{k80}).Redirects(nil); got != nil || err != nil {
		t.Errorf("Redirects of an L4-only policy = %v, %v; want none", got, err)
	}
}

// TestHeaderMatches: a headerMatches entry without a mismatch action
// decides the rule (a value, or presence without one); the others never
// fail it and are reported as mismatches, with the change each makes.
func TestHeaderMatches(t *testing.T) {
	c, err := CompileHTTPRule(HTTPRule{HeaderMatches: []HeaderMatch{
		{Name: "x-env", Value: "prod"},
		{Name: "X-Present"},
		{Name: "X-Trace", Value: "on", Mismatch: MismatchLog},
		{Name: "X-Team", Value: "payments", Mismatch: MismatchAdd},
		{Name: "X-Debug", Mismatch: MismatchDelete},
		{Name: "X-Tenant", Value: "t1", Mismatch: MismatchReplace},
	}}, "r")
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{"X-Env": {"prod"}, "X-Present": {""}}
	if !c.Matches("GET", "/", "h", h) {
		t.Fatal("a request with X-Env prod and X-Present does not match")
	}
	for _, bad := range []http.Header{{"X-Env": {"prod"}}, {"X-Env": {"dev"}, "X-Present": {"1"}}, {"X-Present": {"1"}}} {
		if c.Matches("GET", "/", "h", bad) {
			t.Errorf("%v matches", bad)
		}
	}
	ms := c.Mismatches(h)
	var got []string
	for _, m := range ms {
		got = append(got, m.String())
		m.Apply(h)
	}
	// X-Debug is absent: DELETE's match is presence, so it mismatches too
	// (deleting nothing).
	want := []string{"LOG X-Trace", "ADD X-Team", "DELETE X-Debug", "REPLACE X-Tenant"}
	if !slices.Equal(got, want) {
		t.Errorf("mismatches %q, want %q", got, want)
	}
	if h.Get("X-Team") != "payments" || h.Get("X-Tenant") != "t1" || h.Get("X-Trace") != "" {
		t.Errorf("after the actions: %v", h)
	}
	h = http.Header{"X-Env": {"prod"}, "X-Present": {"1"}, "X-Trace": {"on"}, "X-Team": {"payments"}, "X-Debug": {"1"}, "X-Tenant": {"t1"}}
	if ms := c.Mismatches(h); len(ms) != 0 {
		t.Errorf("a request satisfying every match: mismatches %v", ms)
	}
}
