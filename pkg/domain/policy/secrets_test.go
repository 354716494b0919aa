package policy

import (
	"errors"
	"net/http"
	"strings"
	"testing"
)

const secretPolicy = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: s, namespace: %NS%}
spec:
  endpointSelector: {}
  ingress:
  - toPorts:
    - ports: [{port: "80", protocol: TCP}]
      rules: {http: [{headerMatches: [{name: X-Token, secret: %REF%}]}]}
`

func secretDoc(ns, ref string) []byte {
	return []byte(strings.NewReplacer("%NS%", ns, "%REF%", ref).Replace(secretPolicy))
}

// TestSecretRefsParse: a headerMatches secret is accepted only in the
// agent's secrets namespace (the policy's namespace when the reference
// names none, as in Cilium); a secret anywhere else is refused naming
// the field and the namespace, and without a secrets namespace
// (standalone, kvstore) every secret is refused naming Kubernetes mode.
func TestSecretRefsParse(t *testing.T) {
	const secretsNS = "membrane-secrets"
	tests := []struct {
		name, ns, ref, opt string
		want               HeaderSecretRef
		err                string
	}{
		{"named namespace", "app", "{namespace: membrane-secrets, name: token}", secretsNS, HeaderSecretRef{Namespace: secretsNS, Name: "token"}, ""},
		{"policy's namespace", secretsNS, "{name: token}", secretsNS, HeaderSecretRef{Namespace: secretsNS, Name: "token"}, ""},
		{"kube-system", "app", "{namespace: kube-system, name: token}", secretsNS, HeaderSecretRef{},
			`headerMatches[0].secret: secret kube-system/token is outside the policy secrets namespace "membrane-secrets"`},
		{"policy's namespace elsewhere", "app", "{name: token}", secretsNS, HeaderSecretRef{},
			`secret app/token is outside the policy secrets namespace`},
		{"standalone", secretsNS, "{namespace: membrane-secrets, name: token}", "", HeaderSecretRef{},
			`header secrets are read in Kubernetes mode only`},
		{"bad name", "app", "{namespace: membrane-secrets, name: Token_1}", secretsNS, HeaderSecretRef{}, `name "Token_1" is not a Secret name`},
		{"bad namespace", "app", "{namespace: a.b, name: t}", secretsNS, HeaderSecretRef{}, `namespace "a.b" is not a namespace name`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps, err := ParseWith(secretDoc(tt.ns, tt.ref), ParseOptions{SecretsNamespace: tt.opt})
			if tt.err != "" {
				if err == nil || !errors.Is(err, ErrInvalidPolicy) || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want ErrInvalidPolicy containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := ps[0].Rules[0].Ingress[0].HTTP[0].HeaderMatches[0].Secret
			if got == nil || *got != tt.want {
				t.Errorf("secret = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestSecretRefusedPart: from the API server (partial refusal) the entry
// naming kube-system's secret allows nothing and is reported; the other
// entries stay.
func TestSecretRefusedPart(t *testing.T) {
	doc := []byte(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: s, namespace: app}
spec:
  endpointSelector: {}
  ingress:
  - toPorts:
    - ports: [{port: "80", protocol: TCP}]
      rules: {http: [{headerMatches: [{name: X-Token, secret: {namespace: kube-system, name: admin-token}}]}]}
  - toPorts:
    - ports: [{port: "81", protocol: TCP}]
`)
	ps, err := ParseWith(doc, ParseOptions{SecretsNamespace: "membrane-secrets", PartialRefusal: true})
	if err != nil {
		t.Fatal(err)
	}
	p := ps[0]
	if len(p.Refused) != 1 || !strings.Contains(p.Refused[0].Reason, "kube-system/admin-token is outside the policy secrets namespace") {
		t.Fatalf("refused = %+v", p.Refused)
	}
	if in := p.Rules[0].Ingress; len(in) != 1 || in[0].HTTP != nil {
		t.Errorf("ingress = %+v, want only the port 81 entry", in)
	}
}

// TestSecretHeaderMatch: the proxy's matching of a secret (Cilium's): the
// secret's value when it resolves, Value when it does not (or is empty),
// a presence match for an empty secret without Value, and no match at
// all (whatever the mismatch action) for an unresolved secret without
// Value. The secret's value is what ADD and REPLACE write.
func TestSecretHeaderMatch(t *testing.T) {
	ref := &HeaderSecretRef{Namespace: "membrane-secrets", Name: "token"}
	token := http.Header{"X-Token": {"s3cr3t"}}
	fallback := http.Header{"X-Token": {"fallback"}}
	other := http.Header{"X-Token": {"other"}}
	none := http.Header{}
	tests := []struct {
		name    string
		hm      HeaderMatch
		secrets SecretValues
		match   []http.Header
		nomatch []http.Header
	}{
		{"resolved", HeaderMatch{Name: "X-Token", Secret: ref}, SecretValues{"membrane-secrets/token": "s3cr3t"}, []http.Header{token}, []http.Header{other, none, fallback}},
		{"resolved with value", HeaderMatch{Name: "X-Token", Secret: ref, Value: "fallback"}, SecretValues{"membrane-secrets/token": "s3cr3t"}, []http.Header{token}, []http.Header{fallback, none}},
		{"missing with value", HeaderMatch{Name: "X-Token", Secret: ref, Value: "fallback"}, nil, []http.Header{fallback}, []http.Header{token, none}},
		{"missing", HeaderMatch{Name: "X-Token", Secret: ref}, nil, nil, []http.Header{token, other, none}},
		{"missing, LOG", HeaderMatch{Name: "X-Token", Secret: ref, Mismatch: MismatchLog}, SecretValues{"membrane-secrets/other": "s3cr3t"}, nil, []http.Header{token, none}},
		{"empty", HeaderMatch{Name: "X-Token", Secret: ref}, SecretValues{"membrane-secrets/token": ""}, []http.Header{token, other}, []http.Header{none}},
		{"empty with value", HeaderMatch{Name: "X-Token", Secret: ref, Value: "fallback"}, SecretValues{"membrane-secrets/token": ""}, []http.Header{fallback}, []http.Header{token}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := CompileHTTPRuleWith(HTTPRule{HeaderMatches: []HeaderMatch{tt.hm}}, "r", tt.secrets)
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range tt.match {
				if !c.Matches("GET", "/", "h", h) {
					t.Errorf("%v does not match", h)
				}
			}
			for _, h := range tt.nomatch {
				if c.Matches("GET", "/", "h", h) {
					t.Errorf("%v matches", h)
				}
			}
		})
	}
	c, err := CompileHTTPRuleWith(HTTPRule{HeaderMatches: []HeaderMatch{{Name: "X-Token", Secret: ref, Mismatch: MismatchReplace}}}, "r",
		SecretValues{"membrane-secrets/token": "s3cr3t"})
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{"X-Token": {"wrong"}}
	for _, m := range c.Mismatches(h) {
		m.Apply(h)
	}
	if h.Get("X-Token") != "s3cr3t" {
		t.Errorf("REPLACE with a secret: %v", h)
	}
	// A value the proxy cannot match is an error naming the secret, never
	// holding the value.
	_, err = CompileHTTPRuleWith(HTTPRule{HeaderMatches: []HeaderMatch{{Name: "X-Token", Secret: ref}}}, "r", SecretValues{"membrane-secrets/token": "leak\nme"})
	if err == nil || !strings.Contains(err.Error(), "secret membrane-secrets/token") || strings.Contains(err.Error(), "leak") {
		t.Errorf("err = %v", err)
	}
}

// TestL7EqualHeaderMatches: two policies differing only in a headerMatch
// (another secret) are different L7 entries (a change is realised), and
// rules differing only there are not merged.
func TestL7EqualHeaderMatches(t *testing.T) {
	a := []L7Entry{{HTTP: []HTTPRule{{HeaderMatches: []HeaderMatch{{Name: "X", Secret: &HeaderSecretRef{Namespace: "n", Name: "a"}}}}}}}
	b := []L7Entry{{HTTP: []HTTPRule{{HeaderMatches: []HeaderMatch{{Name: "X", Secret: &HeaderSecretRef{Namespace: "n", Name: "b"}}}}}}}
	if l7Equal(a, b) {
		t.Error("entries with other secrets are equal")
	}
	var bl l7Builder
	bl.add(Key{}, slices2(a[0].HTTP[0], b[0].HTTP[0]), nil)
	if es := bl.entries(); len(es) != 1 || len(es[0].HTTP) != 2 {
		t.Errorf("entries = %+v, want both rules", es)
	}
	m := &MapState{L7: append(a, b...)}
	if refs := m.SecretRefs(); len(refs) != 2 || refs[0].Name != "a" || refs[1].Name != "b" {
		t.Errorf("SecretRefs = %v", refs)
	}
}

func slices2(a, b HTTPRule) []HTTPRule { return []HTTPRule{a, b} }
