package actors_test

import (
	"context"
	"errors"
	"testing"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

const httpPolicy = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: l7}
spec:
  endpointSelector: {matchLabels: {app: b}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: a}}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
      rules: {http: [{method: GET, path: /public}]}
`

const l4Policy = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: l4}
spec:
  endpointSelector: {matchLabels: {app: b}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: a}}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
`

// TestImportRefusesL7WithoutProxy: with Config.NoL7 (no proxy can enforce
// HTTP rules), a policy with rules.http is refused at import as an
// invalid policy and nothing is imported; an L4 policy still imports.
// Without NoL7 the same policy imports.
func TestImportRefusesL7WithoutProxy(t *testing.T) {
	parse := func(doc string) []*policy.Policy {
		pols, err := policy.Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		return pols
	}
	h := startSystem(t, func(c *actors.Config) { c.NoL7 = true })
	ctx := context.Background()
	if _, err := h.sys.ImportPolicy(ctx, parse(httpPolicy)); !errors.Is(err, policy.ErrInvalidPolicy) {
		t.Fatalf("import of an HTTP policy without a proxy: %v, want ErrInvalidPolicy", err)
	}
	if n := len(h.ix.Policies()); n != 0 {
		t.Fatalf("%d policies in the index after the refused import", n)
	}
	if _, err := h.sys.ImportPolicy(ctx, parse(l4Policy)); err != nil {
		t.Fatalf("L4 policy: %v", err)
	}
	h2 := startSystem(t, nil)
	if _, err := h2.sys.ImportPolicy(ctx, parse(httpPolicy)); err != nil {
		t.Fatalf("HTTP policy with a proxy: %v", err)
	}
}
