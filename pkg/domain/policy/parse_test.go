package policy

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

const cnpHead = "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata:\n  name: p\n"
const knpHead = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: p\n"

func TestParseRefuses(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"empty", "", "no policy documents"},
		{"only separators", "---\n---\n", "no policy documents"},
		{"malformed yaml", "a: [b\n", "malformed YAML"},
		{"malformed json", `{"kind": `, "malformed JSON"},
		{"scalar document", "42", "want an object"},
		{"unknown kind", "apiVersion: cilium.io/v2\nkind: CiliumEnvoyConfig\nmetadata: {name: x}\n", `unsupported kind "CiliumEnvoyConfig"`},
		{"membrane kind with cilium apiVersion", "apiVersion: cilium.io/v2\nkind: MembraneNetworkPolicy\nmetadata: {name: x}\n", `unsupported kind "MembraneNetworkPolicy"`},
		{"wrong apiVersion", "apiVersion: cilium.io/v1\nkind: CiliumNetworkPolicy\nmetadata: {name: x}\n", `apiVersion "cilium.io/v1"`},
		{"no name", "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {}\nspec: {endpointSelector: {}}\n", "metadata.name: missing"},
		{"slash in name", "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: a/b}\nspec: {endpointSelector: {}}\n", "contains '/'"},
		{"unknown top field", cnpHead + "status: {}\nspec: {endpointSelector: {}}\n", `unsupported field "status"`},
		{"unknown metadata field", "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: x, uid: u}\nspec: {endpointSelector: {}}\n", `unsupported field "metadata.uid"`},
		{"ingress dns rules refused", cnpHead + "spec:\n  endpointSelector: {}\n  ingress:\n  - toPorts:\n    - ports: [{port: \"53\"}]\n      rules: {dns: [{matchName: x}]}\n", `spec.ingress[0].toPorts[0].rules.dns: DNS rules are egress rules`},
		{"nodeSelector in a namespaced policy", cnpHead + "spec:\n  nodeSelector: {}\n  ingress: []\n", `spec.nodeSelector: only cluster-wide policies`},
		{"ingress toFQDNs refused", cnpHead + "spec:\n  endpointSelector: {}\n  ingress:\n  - toFQDNs: [{matchName: x.com}]\n", `unsupported field "spec.ingress[0].toFQDNs"`},
		{"specs field path", cnpHead + "specs:\n- endpointSelector: {}\n- endpointSelector: {}\n  nodeSelectors: {}\n", `unsupported field "specs[1].nodeSelectors"`},
		{"no spec", cnpHead, "spec: missing"},
		{"spec and specs", cnpHead + "spec: {endpointSelector: {}}\nspecs: [{endpointSelector: {}}]\n", "give one, not both"},
		{"no endpointSelector", cnpHead + "spec: {ingress: []}\n", "spec.endpointSelector: missing"},
		{"bad entity", cnpHead + "spec:\n  endpointSelector: {}\n  egress: [{toEntities: [ingres]}]\n", `spec.egress[0].toEntities[0]: unsupported entity "ingres"`},
		{"bad protocol", cnpHead + "spec:\n  endpointSelector: {}\n  ingress: [{toPorts: [{ports: [{port: \"80\", protocol: ICMP}]}]}]\n", `spec.ingress[0].toPorts[0].ports[0].protocol: unsupported protocol "ICMP"`},
		{"bad port name", cnpHead + "spec:\n  endpointSelector: {}\n  ingress: [{toPorts: [{ports: [{port: Http}]}]}]\n", `spec.ingress[0].toPorts[0].ports[0].port: port name "Http": 'H' is not a lowercase letter`},
		{"named port with L7 over ANY", cnpHead + "spec:\n  endpointSelector: {}\n  ingress: [{toPorts: [{ports: [{port: http}], rules: {http: [{}]}}]}]\n", `spec.ingress[0].toPorts[0].ports: L7 rules need TCP ports`},
		{"named port with L7 and endPort", cnpHead + "spec:\n  endpointSelector: {}\n  ingress: [{toPorts: [{ports: [{port: http, endPort: 90, protocol: TCP}], rules: {http: [{}]}}]}]\n", `endPort: needs a numeric port, not the named port "http"`},
		{"port out of range", cnpHead + "spec:\n  endpointSelector: {}\n  ingress: [{toPorts: [{ports: [{port: \"70000\"}]}]}]\n", "outside 0..65535"},
		{"endPort below port", cnpHead + "spec:\n  endpointSelector: {}\n  ingress: [{toPorts: [{ports: [{port: \"80\", endPort: 79}]}]}]\n", "endPort: 79 not within 80..65535"},
		{"endPort range too large", cnpHead + "spec:\n  endpointSelector: {}\n  ingress: [{toPorts: [{ports: [{port: \"1\", endPort: 60000}]}]}]\n", "more than 1024 ports"},
		{"bad cidr", cnpHead + "spec:\n  endpointSelector: {}\n  egress: [{toCIDR: [10.0.0.0/33]}]\n", `spec.egress[0].toCIDR[0].cidr: "10.0.0.0/33" is not a CIDR`},
		{"except outside", cnpHead + "spec:\n  endpointSelector: {}\n  egress: [{toCIDRSet: [{cidr: 10.0.0.0/8, except: [11.0.0.0/8]}]}]\n", "11.0.0.0/8 is not inside 10.0.0.0/8"},
		{"bad operator", cnpHead + "spec:\n  endpointSelector:\n    matchExpressions: [{key: a, operator: Gt, values: [\"1\"]}]\n", `unsupported operator "Gt"`},
		{"In without values", cnpHead + "spec:\n  endpointSelector:\n    matchExpressions: [{key: a, operator: In}]\n", "In needs at least one value"},
		{"bad label key", cnpHead + "spec:\n  endpointSelector:\n    matchLabels: {\"a b\": x}\n", "contains whitespace"},
		{"type error", cnpHead + "spec:\n  endpointSelector:\n    matchLabels: [a]\n", `want map[string]string`},
		{"knp named port endPort", knpHead + "spec:\n  podSelector: {}\n  ingress: [{ports: [{port: http, endPort: 90}]}]\n", `spec.ingress[0].ports[0].endPort: needs a numeric port, not the named port "http"`},
		{"knp port name too long", knpHead + "spec:\n  podSelector: {}\n  ingress: [{ports: [{port: abcdefghijklmnop}]}]\n", `longer than 15 characters`},
		{"knp namespace label", knpHead + "spec:\n  podSelector: {}\n  ingress: [{from: [{namespaceSelector: {matchLabels: {team: a}}}]}]\n", `namespace label "team" cannot be matched`},
		{"knp empty peer", knpHead + "spec:\n  podSelector: {}\n  ingress: [{from: [{}]}]\n", "needs podSelector, namespaceSelector or ipBlock"},
		{"knp ipBlock with selector", knpHead + "spec:\n  podSelector: {}\n  ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8}, podSelector: {}}]}]\n", "ipBlock cannot be combined"},
		{"knp policy type", knpHead + "spec:\n  podSelector: {}\n  policyTypes: [Both]\n", `unsupported policy type "Both"`},
		{"knp ingress not in types", knpHead + "spec:\n  podSelector: {}\n  policyTypes: [Egress]\n  ingress: [{}]\n", "does not list Ingress"},
		{"knp egress not in types", knpHead + "spec:\n  podSelector: {}\n  policyTypes: [Ingress]\n  egress: [{}]\n", "does not list Egress"},
		{"knp unknown field", knpHead + "spec:\n  podSelector: {}\n  ingress: [{from: [{serviceSelector: {}}]}]\n", `unsupported field "spec.ingress[0].from[0].serviceSelector"`},
		{"duplicate name", cnpHead + "spec: {endpointSelector: {}}\n---\n" + cnpHead + "spec: {endpointSelector: {}}\n", "is also document 1"},
		{"second document named", cnpHead + "spec: {endpointSelector: {}}\n---\n" + strings.Replace(cnpHead, "name: p", "name: q", 1) + "spec: {bogus: 1}\n", "document 2 (CiliumNetworkPolicy default/q)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pols, err := Parse([]byte(tt.doc))
			if err == nil {
				t.Fatalf("Parse() = %d policies, want an error containing %q", len(pols), tt.want)
			}
			if !errors.Is(err, ErrInvalidPolicy) {
				t.Errorf("Parse() = %v, want it to wrap ErrInvalidPolicy", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse() = %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

func mustLabels(t testing.TB, ss ...string) labels.Labels {
	t.Helper()
	ls, err := labels.ParseSet(ss)
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseGood(t *testing.T) {
	pols, err := Parse(readTestdata(t, "good-cnp-multi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(pols) != 2 || pols[0].Key() != "shop/web" || pols[1].Key() != "shop/db" {
		t.Fatalf("policies = %v", pols)
	}
	web := pols[0]
	if web.Kind != KindCNP || web.Labels["team"] != "web" || len(web.Rules) != 1 || !strings.Contains(string(web.Spec), "endpointSelector") {
		t.Fatalf("web = %+v", web)
	}
	r := web.Rules[0]
	shopWeb := mustLabels(t, "k8s:app=web", "k8s:"+NamespaceLabel+"=shop")
	tests := []struct {
		name string
		sel  Selector
		ls   labels.Labels
		want bool
	}{
		{"subject selects app=web in shop", r.Subject, shopWeb, true},
		{"subject refuses tier=debug", r.Subject, mustLabels(t, "k8s:app=web", "k8s:tier=debug", "k8s:"+NamespaceLabel+"=shop"), false},
		{"subject refuses another namespace", r.Subject, mustLabels(t, "k8s:app=web", "k8s:"+NamespaceLabel+"=other"), false},
		{"subject refuses unspec source for k8s:app", r.Subject, mustLabels(t, "app=web", "k8s:"+NamespaceLabel+"=shop"), false},
		{"peer frontend any source in shop", r.Ingress[0].Peers[0], mustLabels(t, "container:app=frontend", "k8s:"+NamespaceLabel+"=shop"), true},
		{"peer frontend not in other ns", r.Ingress[0].Peers[0], mustLabels(t, "k8s:app=frontend", "k8s:"+NamespaceLabel+"=x"), false},
		{"peer naming the namespace", r.Ingress[0].Peers[1], mustLabels(t, "k8s:app=x", "k8s:"+NamespaceLabel+"=monitoring"), true},
		{"host entity", r.Ingress[1].Peers[0], mustLabels(t, "reserved:host"), true},
		{"world entity matches cidr", r.Ingress[1].Peers[1], CIDRLabels(mustPrefix("1.2.3.0/24")), true},
		{"world entity refuses pods", r.Ingress[1].Peers[1], shopWeb, false},
		{"fromCIDR matches inner prefix", r.Ingress[2].Peers[0], CIDRLabels(mustPrefix("10.1.0.0/16")), true},
		{"fromCIDR refuses outer prefix", r.Ingress[2].Peers[0], CIDRLabels(mustPrefix("10.0.0.0/7")), false},
		{"except excluded", r.Ingress[2].Peers[1], CIDRLabels(mustPrefix("172.16.1.0/24")), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.sel.Matches(tt.ls); got != tt.want {
				t.Errorf("%s.Matches(%v) = %v, want %v", tt.sel.Key(), tt.ls, got, tt.want)
			}
		})
	}
	// ports: 443/TCP, 53/ANY (TCP, UDP, SCTP); egress: all, 5000-5009/UDP.
	if got := len(r.Ingress[0].Ports); got != 4 {
		t.Errorf("ingress[0] ports = %v, want 4", r.Ingress[0].Ports)
	}
	if !r.Egress[0].Any || len(r.Egress[0].Ports) != 10 {
		t.Errorf("egress[0] = %+v, want any peer and 10 ports", r.Egress[0])
	}
	db := pols[1].Rules[0]
	if !db.IngressEnforced || !db.EgressEnforced || len(db.Egress) != 0 {
		t.Errorf("db: %+v, want both directions enforced and no egress rule", db)
	}
	if got := len(db.Ingress[0].Ports); got != 4 { // 5432/TCP + 9000-9002/UDP
		t.Errorf("db ports = %v", db.Ingress[0].Ports)
	}
	opsRole := mustLabels(t, "k8s:role=x", "k8s:"+NamespaceLabel+"=ops")
	if !db.Ingress[0].Peers[1].Matches(opsRole) || db.Ingress[0].Peers[1].Matches(mustLabels(t, "k8s:"+NamespaceLabel+"=ops")) {
		t.Errorf("namespaceSelector+podSelector peer %s", db.Ingress[0].Peers[1].Key())
	}
}

func TestParseSeparatorWithContent(t *testing.T) {
	doc := cnpHead + "spec: {endpointSelector: {}}\n--- " +
		`{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "q"}, "spec": {}}` + "\n--- # comment\n"
	pols, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if len(pols) != 2 || pols[1].Key() != "default/q" {
		t.Fatalf("policies = %v", pols)
	}
}

func TestParseListAndDefaults(t *testing.T) {
	pols, err := Parse(readTestdata(t, "good-list.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(pols) != 2 || pols[0].Key() != "default/a" || pols[1].Key() != "prod/deny-all" {
		t.Fatalf("policies = %v", pols)
	}
	if r := pols[0].Rules[1]; !r.IngressEnforced || r.EgressEnforced || len(r.Ingress) != 0 {
		t.Errorf("ingress: [] must enforce ingress with nothing allowed: %+v", r)
	}
	if r := pols[1].Rules[0]; !r.IngressEnforced || r.EgressEnforced {
		t.Errorf("NetworkPolicy without policyTypes and egress: ingress only, got %+v", r)
	}
}

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// fuzzParseSeeds are small, one feature each: the fuzzer minimises
// every new input it keeps, in time quadratic in its length (up to 60 s
// an input), so large seeds (the 1.3 KB testdata documents) kept it
// minimising for most of a run.
var fuzzParseSeeds = []string{
	cnpHead + "spec:\n  endpointSelector: {}\n  egress: [{toPorts: [{ports: [{port: \"53\"}], rules: {dns: [{matchPattern: \"*.x\"}]}}]}, {toFQDNs: [{matchName: a.x}]}]\n",
	cnpHead + "spec:\n  endpointSelector: {}\n  ingress: [{toPorts: [{ports: [{port: \"80\", endPort: 90}]}]}]\n",
	knpHead + "spec:\n  podSelector: {}\n  egress: [{to: [{ipBlock: {cidr: \"::/0\", except: [\"fd00::/8\"]}}]}]\n",
	cnpHead + "spec:\n  endpointSelector: {matchLabels: {k8s:app: web}}\n  egress: [{toCIDRSet: [{cidr: 10.0.0.0/8, except: [10.1.0.0/16]}], toEntities: [world]}]\n",
	cnpHead + "specs:\n- endpointSelector: {matchExpressions: [{key: tier, operator: NotIn, values: [a]}]}\n  ingress: [{fromEndpoints: [{matchLabels: {app: x}}]}]\n",
	knpHead + "spec:\n  podSelector: {}\n  policyTypes: [Ingress, Egress]\n  ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: a}}}], ports: [{port: 53, protocol: UDP}]}]\n",
	`{"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "p"}, "spec": {}}]}`,
}

// maxFuzzSeed bounds a FuzzParse seed's length.
const maxFuzzSeed = 300

func TestFuzzParseSeedsSmall(t *testing.T) {
	for i, seed := range fuzzParseSeeds {
		if len(seed) > maxFuzzSeed {
			t.Errorf("FuzzParse seed %d: %d bytes, more than %d: the fuzzer would spend its time minimising", i, len(seed), maxFuzzSeed)
		}
		if _, err := Parse([]byte(seed)); err != nil {
			t.Errorf("FuzzParse seed %d does not parse: %v", i, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, seed := range fuzzParseSeeds {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		pols, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidPolicy) {
				t.Fatalf("Parse error %v does not wrap ErrInvalidPolicy", err)
			}
			return
		}
		if len(pols) == 0 {
			t.Fatal("Parse succeeded with no policies")
		}
		r := NewRepository()
		r.UpsertIdentity(300, mustLabels(t, "k8s:app=x", "k8s:"+NamespaceLabel+"=default"))
		r.MapState(300)
		res := r.Import(pols)
		// A learned name, then forgotten: its identity goes.
		r.SetFQDN("a.x", []netip.Addr{netip.MustParseAddr("192.0.2.1")})
		r.SetFQDN("a.x", nil)
		for _, p := range pols {
			if p.Name == "" || p.Namespace == "" || len(p.Rules) == 0 {
				t.Fatalf("policy %+v lacks a name, namespace or rules", p)
			}
			if _, err := r.DeleteByName(p.Key()); err != nil {
				t.Fatalf("delete %s: %v", p.Key(), err)
			}
		}
		if len(r.CIDRs()) != 0 || r.Selectors() != 0 || res.Revision == 0 {
			t.Fatalf("after deleting every policy: %d CIDRs, %d selectors left", len(r.CIDRs()), r.Selectors())
		}
	})
}

// TestKNPDefaultPolicyTypes: without policyTypes, Egress is enforced
// only when there is an egress rule, as Kubernetes defaults it.
func TestKNPDefaultPolicyTypes(t *testing.T) {
	for _, tc := range []struct {
		name, egress string
		want         bool
	}{
		{"no egress section", "", false},
		{"empty egress list", "  egress: []\n", false},
		{"an egress rule", "  egress: [{}]\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pols, err := Parse([]byte(knpHead + "spec:\n  podSelector: {}\n" + tc.egress))
			if err != nil {
				t.Fatal(err)
			}
			if r := pols[0].Rules[0]; !r.IngressEnforced || r.EgressEnforced != tc.want {
				t.Errorf("ingress %v egress %v, want true %v", r.IngressEnforced, r.EgressEnforced, tc.want)
			}
		})
	}
}
