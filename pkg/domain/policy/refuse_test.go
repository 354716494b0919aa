package policy

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// Issue #32 item 8: a policy with a part the agent refuses still
// isolates the pods it selects; the refused part allows nothing, the
// other entries stay in force. The refused fields these documents rely
// on are a named port with an endPort and a port name that is no
// IANA_SVC_NAME (both refused by Kubernetes too), an unknown field
// inside an entry (authentication), one inside a deny entry, a deny
// entry it cannot compile, and fromRequires (which restricts the other
// entries, so it refuses the whole direction).
func TestPartialRefusal(t *testing.T) {
	const server, client identity.NumericIdentity = 420, 421
	for _, tc := range []struct {
		name, doc   string
		opts        ParseOptions
		wantRefused []string // Refusal.Path
		wantPorts   []uint16 // ingress ports allowed from client
	}{
		{"NetworkPolicy named port with endPort refused, numbered entry kept", `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: a}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - ports: [{port: http, endPort: 90}]
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: 8080}]
`, ParseOptions{NamespaceLabels: true}, []string{"spec.ingress[0]"}, []uint16{8080}},
		{"NetworkPolicy only entry refused: isolated, nothing allowed", `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: a}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: HTTP, protocol: TCP}, {port: 80}]
`, ParseOptions{}, []string{"spec.ingress[0]"}, nil},
		{"CNP unknown field in one entry", `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: server}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: client}}]
    authentication: {mode: required}
  - fromEndpoints: [{matchLabels: {app: client}}]
    toPorts: [{ports: [{port: "443", protocol: TCP}]}]
`, ParseOptions{}, []string{"spec.ingress[0]"}, []uint16{443}},
		{"CNP fromRequires refuses the whole direction", `apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: server}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: client}}]
    toPorts: [{ports: [{port: "443", protocol: TCP}]}]
  - fromRequires: [{matchLabels: {env: prod}}]
`, ParseOptions{}, []string{"spec.ingress"}, nil},
		{"CNP deny rules refuse the whole direction", `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: server}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: client}}]
  ingressDeny:
  - fromEndpoints: [{matchLabels: {app: client}}]
    toPorts: [{ports: [{port: "22", protocol: TCP}]}]
    fromNodes: [{matchLabels: {a: b}}]
`, ParseOptions{}, []string{"spec.ingress"}, nil},
		{"CNP deny entry it cannot compile refuses the whole direction", `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: server}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: client}}]
  ingressDeny:
  - fromEndpoints: [{matchLabels: {app: client}}]
    toPorts: [{ports: [{port: "70000", protocol: TCP}]}]
`, ParseOptions{}, []string{"spec.ingress"}, nil},
		{"NetworkPolicy unknown narrowing field refuses the direction", `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: a}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    fromRequires: [{matchLabels: {env: prod}}]
`, ParseOptions{}, []string{"spec.ingress"}, nil},
		{"CNP L7 rules without a proxy", `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: server}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: client}}]
    toPorts: [{ports: [{port: "80", protocol: TCP}], rules: {http: [{method: GET}]}}]
`, ParseOptions{NoL7: true}, []string{"spec.ingress[0]"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Strict (PUT /v1/policy): the caller sees the refusal.
			if _, err := ParseWith([]byte(tc.doc), tc.opts); !errors.Is(err, ErrInvalidPolicy) {
				t.Fatalf("strict parse: err = %v, want ErrInvalidPolicy", err)
			}
			opts := tc.opts
			opts.PartialRefusal = true
			pols, err := ParseWith([]byte(tc.doc), opts)
			if err != nil {
				t.Fatalf("partial parse: %v", err)
			}
			p := pols[0]
			var paths []string
			for _, r := range p.Refused {
				paths = append(paths, r.Path)
				if r.Reason == "" || !strings.Contains(r.String(), r.Path) {
					t.Errorf("refusal %+v: want a reason naming the field", r)
				}
			}
			if !slices.Equal(paths, tc.wantRefused) || !p.Partial() {
				t.Fatalf("refused = %v (%s), want %v", paths, p.RefusedSummary(), tc.wantRefused)
			}
			r := NewRepository()
			r.UpsertIdentity(server, podLabels(t, "a", "app=server"))
			r.UpsertIdentity(client, podLabels(t, "a", "app=client"))
			r.Import(pols)
			m := r.MapState(server)
			if m == nil || !m.IngressEnforced {
				t.Fatalf("server: %+v, want ingress enforced (isolated)", m)
			}
			var ports []uint16
			for _, k := range m.Allow {
				if k.Dir == Ingress && k.Identity == client && k.Proto == ProtoTCP && !m.Denies(k) {
					ports = append(ports, k.Port)
				}
			}
			if len(m.L7) > 0 || !slices.Equal(ports, tc.wantPorts) {
				t.Errorf("client's TCP ports = %v (L7 %v), want %v", ports, m.L7, tc.wantPorts)
			}
		})
	}
}

// A refusal the agent cannot confine to an entry (the subject, the
// policy types, a field outside the rules) refuses the whole document
// even in partial mode: there is nothing understood to isolate.
func TestPartialRefusalSubjectRefused(t *testing.T) {
	for _, doc := range []string{`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: a}
spec:
  podSelector: {matchExpressions: [{key: app, operator: Matches, values: [x]}]}
  ingress: []
`, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: a}
spec:
  podSelector: {}
  policyTypes: [Sideways]
`, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  nodeSelector: {}
  endpointSelector: {}
  ingress: []
`} {
		if _, err := ParseWith([]byte(doc), ParseOptions{PartialRefusal: true}); !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("err = %v, want the document refused", err)
		}
	}
}

// A partially refused document persisted in policy.json reads back as it
// was in force.
func TestPartialRefusalFileRoundTrip(t *testing.T) {
	pols, err := ParseWith([]byte(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: a}
spec:
  podSelector: {}
  ingress: [{ports: [{port: http, endPort: 90}]}]
`), ParseOptions{PartialRefusal: true})
	if err != nil {
		t.Fatal(err)
	}
	b, err := MarshalFile(3, pols)
	if err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() + "/policy.json"
	if err := WriteFile(path, b); err != nil {
		t.Fatal(err)
	}
	_, got, err := ReadFile(path)
	if err != nil {
		t.Fatalf("ReadFile: %v", err)
	}
	if len(got) != 1 || len(got[0].Refused) != 1 || !got[0].Rules[0].IngressEnforced || len(got[0].Rules[0].Ingress) != 0 {
		t.Fatalf("read back %+v", got[0])
	}
}
