package flows

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// TestExplainNamedPorts: a flow that a rule on a named port allows names
// the rule's policy: on ingress by the local endpoint's own number for
// the name, on egress by the number the peer gives it (a pod on another
// node, known from the ipcache); another number names nothing.
func TestExplainNamedPorts(t *testing.T) {
	ix, err := index.New()
	if err != nil {
		t.Fatal(err)
	}
	lbls := func(app string) labels.Labels {
		ls, err := labels.New(mustLabel(t, "k8s:app="+app), mustLabel(t, "k8s:io.kubernetes.pod.namespace=default"))
		if err != nil {
			t.Fatal(err)
		}
		return ls
	}
	ports := func(np ...policy.NamedPort) policy.NamedPorts {
		n, err := policy.NewNamedPorts(np)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	txn := ix.WriteTxn()
	insert := func(table string, obj any) {
		if err := index.Insert(txn, table, obj); err != nil {
			t.Fatalf("%s: %v", table, err)
		}
	}
	for i, app := range []string{"a", "b"} {
		id := identity.NumericIdentity(1001 + i)
		ep := &endpoint.Endpoint{ID: endpoint.ID(3 + i), Namespace: "default", PodName: app, Labels: lbls(app), Identity: id,
			IPv4: netip.AddrFrom4([4]byte{10, 0, 0, byte(3 + i)}), State: endpoint.StateReady}
		if app == "b" {
			ep.NamedPorts = ports(policy.NamedPort{Name: "http", Proto: policy.ProtoTCP, Port: 8080})
		}
		insert(index.TableEndpoints, ep)
		insert(index.TableIdentities, &index.Identity{ID: id, Labels: ep.Labels, Key: ep.Labels.Key()})
	}
	c := lbls("c")
	insert(index.TableIdentities, &index.Identity{ID: 1003, Labels: c, Key: c.Key()})
	insert(index.TableIPCache, &index.IPCacheEntry{Prefix: netip.MustParsePrefix("10.1.0.5/32"), Identity: 1003, Source: index.SourceRemote,
		Claims: []index.IPCacheClaim{{Source: index.SourceRemote, Identity: 1003, Origin: "k8s",
			NamedPorts: ports(policy.NamedPort{Name: "dns", Proto: policy.ProtoUDP, Port: 5353})}}})
	pols, err := policy.Parse([]byte(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-http, namespace: default}
spec:
  podSelector: {matchLabels: {app: b}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: a}}}]
    ports: [{port: http}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a-dns, namespace: default}
spec:
  podSelector: {matchLabels: {app: a}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {app: c}}}]
    ports: [{port: dns, protocol: UDP}]
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pols {
		insert(index.TablePolicies, &index.PolicyRow{Key: p.Key(), Policy: p})
	}
	txn.Commit()
	s, _ := newStore(t, Config{Index: ix, Rate: 1 << 30, Node: "n"})
	ingress := func(port uint16) datapath.FlowEvent {
		return datapath.FlowEvent{Endpoint: 4, Identity: 1002, PeerIdentity: 1001, Verdict: datapath.FlowForwarded, Dir: policy.Ingress,
			Src: netip.MustParseAddr("10.0.0.3"), Dst: netip.MustParseAddr("10.0.0.4"), SrcPort: 40000, DstPort: port,
			Proto: policy.ProtoTCP, Enforced: true}
	}
	egress := func(port uint16) datapath.FlowEvent {
		return datapath.FlowEvent{Endpoint: 3, Identity: 1001, PeerIdentity: 1003, Verdict: datapath.FlowForwarded, Dir: policy.Egress,
			Src: netip.MustParseAddr("10.0.0.3"), Dst: netip.MustParseAddr("10.1.0.5"), SrcPort: 40001, DstPort: port,
			Proto: policy.ProtoUDP, Enforced: true}
	}
	for _, tc := range []struct {
		name string
		ev   datapath.FlowEvent
		want []string
	}{
		{"ingress on the endpoint's number for the name", ingress(8080), []string{"default/b-http"}},
		{"ingress on another number", ingress(80), nil},
		{"egress on the remote peer's number for the name", egress(5353), []string{"default/a-dns"}},
		{"egress on another number", egress(53), nil},
	} {
		fl := s.fromFlow(tc.ev)
		if !slices.Equal(fl.Policies, tc.want) {
			t.Errorf("%s: policies %v, want %v", tc.name, fl.Policies, tc.want)
		}
	}
}
