package l7

import (
	"context"
	"testing"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// namedIngress and namedEgress are ingressPolicy and egressPolicy on
// B's port named http (80) instead of the number.
const namedIngress = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: b-http-named, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: b}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: a}}]
    toPorts:
    - ports: [{port: http, protocol: TCP}]
      rules:
        http: [{method: GET, path: /public}]
`

const namedEgress = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: a-http-named, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: a}}
  egress:
  - toEndpoints: [{matchLabels: {app: b}}]
    toPorts:
    - ports: [{port: http, protocol: TCP}]
      rules:
        http: [{method: GET, path: /public}]
`

// TestHTTPNamedPort: B declares port 80 as http; an HTTP rule on
// port: http redirects A's requests to B:80 to the proxy, which lets
// GET /public through and answers 403 to the rest, in B's ingress
// policy and in A's egress policy alike; C gets nothing.
func TestHTTPNamedPort(t *testing.T) {
	n := newNode(t, "10.244.86.0/24", nodeOpts{pods: []string{}})
	http80, err := policy.NewNamedPorts([]policy.NamedPort{{Name: "http", Proto: policy.ProtoTCP, Port: 80}})
	if err != nil {
		t.Fatal(err)
	}
	n.node.Agent.Server.SetLabeler(func(ctx context.Context, spec *endpoint.Endpoint) (labels.Labels, policy.NamedPorts, error) {
		if spec.PodName == "b" {
			return spec.Labels, http80, nil
		}
		return spec.Labels, spec.NamedPorts, nil
	})
	for _, name := range []string{"a", "b", "c"} {
		n.addPod(name)
	}
	a, b := n.pods["a"], n.pods["b"]
	httpServer(t, b)
	n.expect(a, "GET", "/private", 200, "b GET /private") // no policy yet

	// Ingress (the harness's helpers fail the whole test, so no subtests).
	n.importPolicy(namedIngress)
	checkView(t, "b", n.l7Acked(b))
	n.enforced()
	n.cGetsNothing()
	n.deletePolicy("default/b-http-named")

	// Egress.
	n.importPolicy(namedEgress)
	checkView(t, "a", n.l7Acked(a))
	n.enforced()
	if code, _, err := a.request(n.pods["c"], "GET", "/public", dropTimeout); err == nil {
		t.Errorf("a reached c:80 (status %d) outside its egress policy", code)
	}
}

// checkView checks that pod's policy view redirects port 80 with the
// rule GET /public.
func checkView(t *testing.T, pod string, view *models.EndpointPolicy) {
	t.Helper()
	if len(view.ComputedL7) != 1 || view.ComputedL7[0].Port != 80 || len(view.ComputedL7[0].HTTP) != 1 || view.ComputedL7[0].HTTP[0].Path != "/public" {
		t.Errorf("pod %s: policy view computed-l7 = %+v, want port 80 with GET /public", pod, view.ComputedL7)
	}
}
