package policy

import (
	"fmt"
	"strings"
	"testing"
)

// TestKNPPolicyTypes: which directions a NetworkPolicy isolates, for
// every combination of ingress and egress absent, empty or non-empty,
// with policyTypes absent or given. Without policyTypes, Kubernetes
// isolates ingress always and egress only when the egress list has an
// entry; given, policyTypes decides, and a non-empty section of a type
// it does not list is refused.
func TestKNPPolicyTypes(t *testing.T) {
	sections := map[string]string{"absent": "", "empty": "[]", "non-empty": "[{}]"}
	order := []string{"absent", "empty", "non-empty"}
	typeSets := []struct {
		name  string
		types string // "" : policyTypes absent
	}{
		{"policyTypes absent", ""},
		{"policyTypes [Ingress]", "[Ingress]"},
		{"policyTypes [Egress]", "[Egress]"},
		{"policyTypes [Ingress, Egress]", "[Ingress, Egress]"},
	}
	for _, ts := range typeSets {
		for _, in := range order {
			for _, eg := range order {
				name := fmt.Sprintf("%s/ingress %s/egress %s", ts.name, in, eg)
				t.Run(name, func(t *testing.T) {
					doc := knpHead + "spec:\n  podSelector: {}\n"
					if ts.types != "" {
						doc += "  policyTypes: " + ts.types + "\n"
					}
					if sections[in] != "" {
						doc += "  ingress: " + sections[in] + "\n"
					}
					if sections[eg] != "" {
						doc += "  egress: " + sections[eg] + "\n"
					}
					wantIn, wantEg := true, eg == "non-empty"
					if ts.types != "" {
						wantIn, wantEg = strings.Contains(ts.types, "Ingress"), strings.Contains(ts.types, "Egress")
					}
					var wantErr string
					switch {
					case in == "non-empty" && !wantIn:
						wantErr = "spec.ingress: present but spec.policyTypes does not list Ingress"
					case eg == "non-empty" && !wantEg:
						wantErr = "spec.egress: present but spec.policyTypes does not list Egress"
					}
					pols, err := Parse([]byte(doc))
					if wantErr != "" {
						if err == nil || !strings.Contains(err.Error(), wantErr) {
							t.Fatalf("Parse(%q) = %v, want an error containing %q", doc, err, wantErr)
						}
						return
					}
					if err != nil {
						t.Fatalf("Parse(%q): %v", doc, err)
					}
					r := pols[0].Rules[0]
					if r.IngressEnforced != wantIn || r.EgressEnforced != wantEg {
						t.Errorf("Parse(%q): ingress enforced %v, egress enforced %v; want %v, %v",
							doc, r.IngressEnforced, r.EgressEnforced, wantIn, wantEg)
					}
					if want := map[string]int{"non-empty": 1}[in]; len(r.Ingress) != want {
						t.Errorf("%d ingress rules, want %d", len(r.Ingress), want)
					}
					if want := map[string]int{"non-empty": 1}[eg]; len(r.Egress) != want {
						t.Errorf("%d egress rules, want %d", len(r.Egress), want)
					}
				})
			}
		}
	}
}
