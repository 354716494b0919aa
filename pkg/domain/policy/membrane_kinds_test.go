package policy

import (
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// ciliumDocExample is the "Layer 3 and 4 together" example of Cilium's
// policy documentation with apiVersion and kind replaced.
const ciliumDocExample = `apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata:
  name: "l3-l4-rule"
  namespace: shop
spec:
  description: "L3-L4 policy to restrict access to port 80 from frontend"
  endpointSelector:
    matchLabels:
      role: backend
  ingress:
  - fromEndpoints:
    - matchLabels:
        role: frontend
    toPorts:
    - ports:
      - port: "80"
        protocol: TCP
  egress:
  - toCIDRSet:
    - cidr: 10.0.0.0/8
      except: [10.96.0.0/12]
    toEntities: [cluster]
`

func TestMembraneNetworkPolicyIsCNP(t *testing.T) {
	pols, err := Parse([]byte(ciliumDocExample))
	if err != nil {
		t.Fatal(err)
	}
	p := pols[0]
	if p.Kind != KindMNP || p.Key() != "MembraneNetworkPolicy:shop/l3-l4-rule" || len(p.Rules) != 1 {
		t.Fatalf("policy = %s %s with %d rules", p.Kind, p.Key(), len(p.Rules))
	}
	r := p.Rules[0]
	backend := labels.Labels{{Source: "k8s", Key: "role", Value: "backend"}, {Source: "k8s", Key: NamespaceLabel, Value: "shop"}}
	elsewhere := labels.Labels{{Source: "k8s", Key: "role", Value: "backend"}, {Source: "k8s", Key: NamespaceLabel, Value: "other"}}
	if !r.Subject.Matches(backend) || r.Subject.Matches(elsewhere) {
		t.Fatalf("subject %s: want the namespace implied", r.Subject.Key())
	}
	if !r.IngressEnforced || !r.EgressEnforced || len(r.Ingress[0].Ports) != 1 || r.Ingress[0].Ports[0] != (PortProto{Port: 80, Proto: ProtoTCP}) {
		t.Fatalf("rule = %+v", r)
	}
	// The same document as a CiliumNetworkPolicy compiles to the same rules.
	cnp := strings.Replace(strings.Replace(ciliumDocExample, "membrane.io/v2", "cilium.io/v2", 1), "MembraneNetworkPolicy", "CiliumNetworkPolicy", 1)
	cp, err := Parse([]byte(cnp))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cp[0].Rules[0].Subject.Key(), r.Subject.Key(); got != want {
		t.Fatalf("CNP subject %s, MNP subject %s", got, want)
	}
}

func TestClusterwidePolicy(t *testing.T) {
	doc := `apiVersion: membrane.io/v2
kind: MembraneClusterwideNetworkPolicy
metadata: {name: db-from-web}
specs:
- endpointSelector: {matchLabels: {app: db}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: web}}]
`
	pols, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	p := pols[0]
	if p.Namespace != "" || p.Key() != "MembraneClusterwideNetworkPolicy:/db-from-web" || !Clusterwide(p.Kind) {
		t.Fatalf("policy %s %q: want cluster-wide", p.Kind, p.Key())
	}
	db := labels.Labels{{Source: "k8s", Key: "app", Value: "db"}, {Source: "k8s", Key: NamespaceLabel, Value: "any"}}
	web := labels.Labels{{Source: "k8s", Key: "app", Value: "web"}, {Source: "k8s", Key: NamespaceLabel, Value: "other"}}
	r := p.Rules[0]
	if !r.Subject.Matches(db) || !r.Ingress[0].Peers[0].Matches(web) {
		t.Fatalf("cluster-wide selectors restricted: subject %s peer %s", r.Subject.Key(), r.Ingress[0].Peers[0].Key())
	}
	ccnp := strings.Replace(strings.Replace(doc, "membrane.io/v2", "cilium.io/v2", 1), "MembraneClusterwide", "CiliumClusterwide", 1)
	if _, err := Parse([]byte(ccnp)); err != nil {
		t.Fatalf("CiliumClusterwideNetworkPolicy: %v", err)
	}
	_, err = Parse([]byte(strings.Replace(doc, "{name: db-from-web}", "{name: x, namespace: a}", 1)))
	if err == nil || !strings.Contains(err.Error(), "metadata.namespace") {
		t.Fatalf("namespaced cluster-wide policy: err = %v, want metadata.namespace", err)
	}
}
