package policy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

const toNodesPolicy = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: to-db-nodes, namespace: default}
spec:
  endpointSelector: {}
  egress:
  - toNodes: [{matchLabels: {role: db}}]
    toPorts: [{ports: [{port: "5432", protocol: TCP}]}]
  - toNodes: [{matchExpressions: [{key: "node:zone", operator: In, values: [a]}]}]
`

// TestNodeSelectors: with NodeSelectorLabels, toNodes selects the
// per-node identities whose Node labels match (never the host, a pod
// with the same labels or remote-node itself); remote-node and cluster
// still select per-node identities. Without it, toNodes is refused
// naming the flag.
func TestNodeSelectors(t *testing.T) {
	nodeIdentity := func(kv map[string]string) []string {
		ls, err := NodeIdentityLabels(kv)
		if err != nil {
			t.Fatal(err)
		}
		return ls.Strings()
	}
	const pod identity.NumericIdentity = 300
	db, web, zoneA := identity.MinNodeIdentity, identity.MinNodeIdentity+1, identity.MinNodeIdentity+2
	r := NewRepository()
	r.UpsertIdentity(pod, podLabels(t, "default", "role=db"))
	r.UpsertIdentity(identity.ReservedHost, mustLabels(t, hostLabelsOf(t, map[string]string{"role": "db"})...))
	r.UpsertIdentity(db, mustLabels(t, nodeIdentity(map[string]string{"role": "db"})...))
	r.UpsertIdentity(web, mustLabels(t, nodeIdentity(map[string]string{"role": "web"})...))
	r.UpsertIdentity(zoneA, mustLabels(t, nodeIdentity(map[string]string{"role": "web", "zone": "a"})...))

	if _, err := Parse([]byte(toNodesPolicy)); err == nil || !strings.Contains(err.Error(), "spec.egress[0].toNodes: needs --enable-node-selector-labels") ||
		!errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("toNodes without NodeSelectorLabels: %v", err)
	}
	pols, err := ParseWith([]byte(toNodesPolicy), ParseOptions{NodeSelectorLabels: true})
	if err != nil {
		t.Fatal(err)
	}
	r.Import(pols)
	m := r.MapState(pod)
	addr := netip.MustParseAddr("192.0.2.1")
	for _, c := range []struct {
		peer identity.NumericIdentity
		port uint16
		want bool
	}{
		{db, 5432, true},
		{db, 22, false},
		{web, 5432, false},
		{zoneA, 22, true}, // node:zone In (a), any port
		{pod, 5432, false},
		{identity.ReservedHost, 5432, false},
		{identity.ReservedRemoteNode, 5432, false},
	} {
		if got := m.AllowsAddr(c.peer, addr, c.port, ProtoTCP, Egress); got != c.want {
			t.Errorf("egress to %#x port %d: %v, want %v", uint32(c.peer), c.port, got, c.want)
		}
	}
	// The entities still select per-node identities.
	ents, err := ParseWith([]byte(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: entities, namespace: default}
spec:
  endpointSelector: {}
  egress:
  - toEntities: [remote-node]
    toPorts: [{ports: [{port: "4240", protocol: TCP}]}]
  - toEntities: [cluster]
    toPorts: [{ports: [{port: "53", protocol: UDP}]}]
`), ParseOptions{NodeSelectorLabels: true})
	if err != nil {
		t.Fatal(err)
	}
	r.Import(ents)
	m = r.MapState(pod)
	if !m.AllowsAddr(web, addr, 4240, ProtoTCP, Egress) || !m.AllowsAddr(web, addr, 53, ProtoUDP, Egress) {
		t.Errorf("remote-node or cluster does not select a per-node identity")
	}
	// A node selector key of another source is refused.
	if _, err := ParseWith([]byte(strings.Replace(toNodesPolicy, "{role: db}", "{\"k8s:role\": db}", 1)), ParseOptions{NodeSelectorLabels: true}); err == nil {
		t.Error("toNodes with a k8s: key accepted")
	}
}
