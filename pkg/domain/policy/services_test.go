package policy

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

const servicesPolicy = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: svc, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: client}}
  egress:
  - toServices:
    - k8sService: {serviceName: db, namespace: "y"}
    - k8sService: {serviceName: ext, namespace: "y"}
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
  - toServices:
    - k8sServiceSelector: {selector: {matchLabels: {tier: cache}}, namespace: "y"}
`

// toServices follows the Services: a Service with a selector allows its
// pods (in its namespace only), one without allows the host prefixes of
// its EndpointSlices' addresses; backend and selector changes move the
// allowed peers without a policy change.
func TestToServices(t *testing.T) {
	r := NewRepository()
	const client, db, dbOther, cache, web identity.NumericIdentity = 300, 301, 302, 303, 304
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.UpsertIdentity(db, podLabels(t, "y", "app=db"))
	r.UpsertIdentity(dbOther, podLabels(t, "z", "app=db"))
	r.UpsertIdentity(cache, podLabels(t, "y", "app=cache"))
	r.UpsertIdentity(web, podLabels(t, "y", "app=web"))
	r.Import(mustParse(t, servicesPolicy))
	m := r.MapState(client)
	if !m.EgressEnforced || m.Allows(db, 80, ProtoTCP, Egress) {
		t.Fatalf("no Services yet: %+v", m.Allow)
	}
	res := r.SetService("y", "db", &Service{Selector: map[string]string{"app": "db"}})
	if len(res.Changed) != 1 || res.Changed[0].Identity != client {
		t.Fatalf("SetService db: %+v", res)
	}
	m = r.MapState(client)
	if !m.Allows(db, 80, ProtoTCP, Egress) || m.Allows(db, 81, ProtoTCP, Egress) || m.Allows(dbOther, 80, ProtoTCP, Egress) {
		t.Fatalf("db by name: %+v", m.Allow)
	}
	// A Service without selector: its addresses' host prefixes.
	e1, e2 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	res = r.SetService("y", "ext", &Service{Addrs: []netip.Addr{e1}})
	id1, ok := res.CIDRUpserts[netip.PrefixFrom(e1, 32)]
	if !ok || !r.MapState(client).Allows(id1, 80, ProtoTCP, Egress) {
		t.Fatalf("ext %s: %+v", e1, res)
	}
	res = r.SetService("y", "ext", &Service{Addrs: []netip.Addr{e2}})
	id2, ok := res.CIDRUpserts[netip.PrefixFrom(e2, 32)]
	if !ok || len(res.CIDRDeletes) != 1 || res.CIDRDeletes[0] != netip.PrefixFrom(e1, 32) {
		t.Fatalf("ext moved to %s: %+v", e2, res)
	}
	if m := r.MapState(client); !m.Allows(id2, 80, ProtoTCP, Egress) || m.Allows(id1, 80, ProtoTCP, Egress) {
		t.Fatalf("ext moved: %+v", m.Allow)
	}
	// By selector over the Services' labels, in namespace y only.
	r.SetService("z", "cache", &Service{Labels: map[string]string{"tier": "cache"}, Selector: map[string]string{"app": "db"}})
	if r.MapState(client).Allows(dbOther, 0, ProtoTCP, Egress) {
		t.Fatal("a Service of namespace z selected by a selector of namespace y")
	}
	r.SetService("y", "cache", &Service{Labels: map[string]string{"tier": "cache"}, Selector: map[string]string{"app": "cache"}})
	if m := r.MapState(client); !m.Allows(cache, 81, ProtoTCP, Egress) || m.Allows(web, 81, ProtoTCP, Egress) {
		t.Fatalf("cache by selector: %+v", m.Allow)
	}
	// The Service's selector changes: its new pods, not its old ones.
	r.SetService("y", "cache", &Service{Labels: map[string]string{"tier": "cache"}, Selector: map[string]string{"app": "web"}})
	if m := r.MapState(client); m.Allows(cache, 81, ProtoTCP, Egress) || !m.Allows(web, 81, ProtoTCP, Egress) {
		t.Fatalf("cache re-selected: %+v", m.Allow)
	}
	// Relabelled: the selector no longer names it.
	r.SetService("y", "cache", &Service{Labels: map[string]string{"tier": "other"}, Selector: map[string]string{"app": "web"}})
	if r.MapState(client).Allows(web, 81, ProtoTCP, Egress) {
		t.Fatal("relabelled Service still selected")
	}
	// Deleted: nothing left of it; the policy going drops the identity.
	r.SetService("y", "db", nil)
	if r.MapState(client).Allows(db, 80, ProtoTCP, Egress) {
		t.Fatal("deleted Service still selected")
	}
	res, _ = r.DeleteByName("x/svc")
	if len(res.CIDRDeletes) != 1 || res.CIDRDeletes[0] != netip.PrefixFrom(e2, 32) {
		t.Fatalf("policy deleted: %+v", res)
	}
}

func TestToServicesRefused(t *testing.T) {
	for _, tc := range []struct{ entry, want string }{
		{`{k8sService: {serviceName: a}, k8sServiceSelector: {selector: {}}}`, "give one"},
		{`{k8sService: {namespace: a}}`, "serviceName: missing"},
		{`{k8sServiceSelector: {namespace: a}}`, "selector: missing"},
		{`{}`, "give k8sService or k8sServiceSelector"},
		{`{k8sService: {serviceName: a, port: 80}}`, "toServices[0].k8sService.port"},
	} {
		doc := strings.Replace(servicesPolicy, "    - k8sService: {serviceName: db, namespace: \"y\"}\n", "    - "+tc.entry+"\n", 1)
		if _, err := Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.entry, err, tc.want)
		}
	}
}

// The entities remote-node and kube-apiserver select the reserved
// identities 6 and 7 (7 carries remote-node's label too, as in Cilium);
// cluster includes both, world neither.
func TestEntitiesRemoteNodeKubeAPIServer(t *testing.T) {
	r := NewRepository()
	const a identity.NumericIdentity = 300
	r.UpsertIdentity(a, podLabels(t, "default", "app=a"))
	r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: entities}
spec:
  endpointSelector: {matchLabels: {app: a}}
  egress:
  - toEntities: [kube-apiserver]
    toPorts: [{ports: [{port: "6443", protocol: TCP}]}]
  - toEntities: [remote-node]
    toPorts: [{ports: [{port: "10250", protocol: TCP}]}]
  - toEntities: [cluster]
    toPorts: [{ports: [{port: "53", protocol: UDP}]}]
  - toEntities: [world]
    toPorts: [{ports: [{port: "443", protocol: TCP}]}]
`))
	m := r.MapState(a)
	for _, tc := range []struct {
		peer  identity.NumericIdentity
		port  uint16
		proto uint8
		want  bool
	}{
		{identity.ReservedKubeAPIServer, 6443, ProtoTCP, true},
		{identity.ReservedRemoteNode, 6443, ProtoTCP, false},
		{identity.ReservedHost, 6443, ProtoTCP, false},
		{identity.ReservedRemoteNode, 10250, ProtoTCP, true},
		{identity.ReservedKubeAPIServer, 10250, ProtoTCP, true},
		{identity.ReservedHost, 10250, ProtoTCP, false},
		{identity.ReservedRemoteNode, 53, ProtoUDP, true},
		{identity.ReservedKubeAPIServer, 53, ProtoUDP, true},
		{identity.ReservedWorld, 53, ProtoUDP, false},
		{identity.ReservedRemoteNode, 443, ProtoTCP, false},
		{identity.ReservedKubeAPIServer, 443, ProtoTCP, false},
	} {
		if got := m.Allows(tc.peer, tc.port, tc.proto, Egress); got != tc.want {
			t.Errorf("%s port %d/%d: allowed %v, want %v", tc.peer, tc.port, tc.proto, got, tc.want)
		}
	}
	if sels := r.Selections("default/entities"); len(sels) != 4 || sels[1].Selector != "entity{kube-apiserver}" ||
		len(sels[1].Identities) != 1 || sels[1].Identities[0] != identity.ReservedKubeAPIServer {
		t.Errorf("selections %+v", sels)
	}
}

// The entity ingress (Cilium's ingress proxy) is accepted and selects
// identity 8 alone, which Membrane never gives to traffic: a policy
// naming it isolates its pods and allows nothing more, as in a Cilium
// cluster without its ingress.
func TestEntityIngress(t *testing.T) {
	r := NewRepository()
	const a, b identity.NumericIdentity = 300, 301
	r.UpsertIdentity(a, podLabels(t, "default", "app=a"))
	r.UpsertIdentity(b, podLabels(t, "default", "app=b"))
	r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: from-ingress}
spec:
  endpointSelector: {matchLabels: {app: a}}
  ingress:
  - fromEntities: [ingress]
`))
	m := r.MapState(a)
	for _, peer := range []identity.NumericIdentity{b, identity.ReservedHost, identity.ReservedWorld, identity.ReservedRemoteNode, identity.ReservedKubeAPIServer} {
		if m.Allows(peer, 80, ProtoTCP, Ingress) {
			t.Errorf("fromEntities: [ingress] admits %s", peer)
		}
	}
	if sels := r.Selections("default/from-ingress"); len(sels) != 1 || sels[0].Selector != "entity{ingress}" ||
		len(sels[0].Identities) != 1 || sels[0].Identities[0] != identity.ReservedIngress {
		t.Errorf("selections %+v, want entity{ingress} selecting identity %d alone", sels, identity.ReservedIngress)
	}
}
