package policy

import (
	"errors"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

const nsLabelPolicy = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-team-a, namespace: prod}
spec:
  podSelector: {}
  ingress:
  - from:
    - namespaceSelector:
        matchLabels: {team: a}
        matchExpressions:
        - {key: env, operator: In, values: [prod]}
`

func TestNamespaceSelectorLabels(t *testing.T) {
	if _, err := Parse([]byte(nsLabelPolicy)); !errors.Is(err, ErrInvalidPolicy) || !strings.Contains(err.Error(), `namespace label "team"`) {
		t.Fatalf("standalone Parse: err = %v, want the namespace label refused", err)
	}
	pols, err := ParseWith([]byte(nsLabelPolicy), ParseOptions{NamespaceLabels: true})
	if err != nil {
		t.Fatal(err)
	}
	sel := pols[0].Rules[0].Ingress[0].Peers[0]
	for _, tc := range []struct {
		ls   []string
		want bool
	}{
		{[]string{"k8s:io.kubernetes.pod.namespace=dev", "k8s:io.cilium.k8s.namespace.labels.team=a", "k8s:io.cilium.k8s.namespace.labels.env=prod"}, true},
		{[]string{"k8s:io.kubernetes.pod.namespace=dev", "k8s:io.cilium.k8s.namespace.labels.team=b", "k8s:io.cilium.k8s.namespace.labels.env=prod"}, false},
		{[]string{"k8s:io.kubernetes.pod.namespace=dev", "k8s:io.cilium.k8s.namespace.labels.team=a"}, false},
		{[]string{"k8s:team=a", "k8s:env=prod", "k8s:io.kubernetes.pod.namespace=dev"}, false}, // pod labels are not namespace labels
	} {
		ls, err := labels.ParseSet(tc.ls)
		if err != nil {
			t.Fatal(err)
		}
		if got := sel.Matches(ls); got != tc.want {
			t.Errorf("%v: match = %v, want %v", tc.ls, got, tc.want)
		}
	}
}
