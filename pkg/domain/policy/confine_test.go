package policy

import (
	"slices"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// Issue #32 item 2: a namespaced policy's subject is always confined to
// its namespace, whatever its selector says about the namespace label.
// Peers keep their semantics: a NetworkPolicy podSelector peer is
// confined (namespaceSelector picks other namespaces), a CNP peer that
// names the namespace label may select other namespaces (as in Cilium).
func TestNamespacedSubjectConfined(t *testing.T) {
	const inA, inB, inSys identity.NumericIdentity = 400, 401, 402
	for _, tc := range []struct {
		name, doc string
	}{
		{"NetworkPolicy podSelector names namespace b", `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: reach-b, namespace: a}
spec:
  podSelector: {matchLabels: {io.kubernetes.pod.namespace: b}}
  policyTypes: [Ingress]
`},
		{"NetworkPolicy podSelector NotIn a", `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: reach-others, namespace: a}
spec:
  podSelector:
    matchExpressions: [{key: io.kubernetes.pod.namespace, operator: NotIn, values: [a]}]
  policyTypes: [Ingress]
`},
		{"CNP endpointSelector NotIn a", `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: reach-others, namespace: a}
spec:
  endpointSelector:
    matchExpressions: [{key: k8s:io.kubernetes.pod.namespace, operator: NotIn, values: [a]}]
  ingress: []
`},
		{"MembraneNetworkPolicy endpointSelector names namespace b", `apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata: {name: reach-b, namespace: a}
spec:
  endpointSelector: {matchLabels: {k8s:io.kubernetes.pod.namespace: b}}
  ingress: []
`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRepository()
			r.UpsertIdentity(inB, podLabels(t, "b", "app=x"))
			r.UpsertIdentity(inSys, podLabels(t, "kube-system", "app=x"))
			r.Import(mustParse(t, tc.doc))
			for _, id := range []identity.NumericIdentity{inB, inSys} {
				if m := r.MapState(id); m != nil && m.IngressEnforced {
					t.Errorf("identity %d of another namespace: ingress enforced by a policy of namespace a", id)
				}
			}
		})
	}
	// The subject still selects the policy's own namespace when its
	// selector allows it.
	r := NewRepository()
	r.UpsertIdentity(inA, podLabels(t, "a", "app=x"))
	r.UpsertIdentity(inB, podLabels(t, "b", "app=x"))
	r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: own, namespace: a}
spec:
  endpointSelector:
    matchExpressions: [{key: k8s:io.kubernetes.pod.namespace, operator: In, values: [a, b]}]
  ingress: []
`))
	if m := r.MapState(inA); m == nil || !m.IngressEnforced {
		t.Errorf("identity of namespace a: %+v, want ingress enforced", m)
	}
	if m := r.MapState(inB); m != nil && m.IngressEnforced {
		t.Errorf("identity of namespace b: ingress enforced by a policy of namespace a")
	}
	// Cluster-wide policies select every namespace, as before.
	r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: all}
spec:
  endpointSelector: {matchLabels: {app: x}}
  ingress: []
`))
	if m := r.MapState(inB); m == nil || !m.IngressEnforced {
		t.Errorf("identity of namespace b under a cluster-wide policy: %+v, want ingress enforced", m)
	}
}

func TestNamespacedPeerScope(t *testing.T) {
	const server, peerA, peerB identity.NumericIdentity = 410, 411, 412
	for _, tc := range []struct {
		name, doc string
		want      []identity.NumericIdentity // peers allowed into server
	}{
		{"NetworkPolicy podSelector peer stays in its namespace", `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: a}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {io.kubernetes.pod.namespace: b}}}]
`, nil},
		{"NetworkPolicy namespaceSelector peer reaches b", `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: a}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: b}}}]
`, []identity.NumericIdentity{peerB}},
		{"CNP peer without namespace label stays in its namespace", `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: server}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: client}}]
`, []identity.NumericIdentity{peerA}},
		{"CNP peer naming the namespace label reaches b (Cilium)", `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: server}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: client, k8s:io.kubernetes.pod.namespace: b}}]
`, []identity.NumericIdentity{peerB}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRepository()
			r.UpsertIdentity(server, podLabels(t, "a", "app=server"))
			r.UpsertIdentity(peerA, podLabels(t, "a", "app=client"))
			r.UpsertIdentity(peerB, podLabels(t, "b", "app=client"))
			r.Import(mustParse(t, tc.doc))
			m := r.MapState(server)
			if m == nil || !m.IngressEnforced {
				t.Fatalf("server: %+v, want ingress enforced", m)
			}
			var got []identity.NumericIdentity
			for _, k := range m.Allow {
				if k.Dir == Ingress && k.Identity != 0 {
					got = append(got, k.Identity)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("ingress peers = %v, want %v", got, tc.want)
			}
		})
	}
}
