package policy

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// matches reports whether entry k matches a new connection with peer on
// port/proto in dir (zero fields are wildcards).
func matches(k Key, peer identity.NumericIdentity, port uint16, proto uint8, dir Direction) bool {
	return k.Dir == dir && (k.Identity == 0 || k.Identity == peer) &&
		(k.Proto == 0 || (k.Proto == proto && (k.Port == 0 || k.Port == port)))
}

// TestApplyDenyPrecedence: whatever allows and denies a policy holds,
// the datapath's lookup (the first of Lookups that is an entry, as the
// BPF longest-prefix match finds it) denies exactly the connections some
// deny matches and allows exactly those some allow matches and no deny
// does: Cilium's precedence, a deny wins over any allow however specific.
func TestApplyDenyPrecedence(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	peers := []identity.NumericIdentity{0, 300, 301, 302}
	protos := []uint8{0, ProtoTCP, ProtoUDP}
	ports := []uint16{0, 22, 80}
	randKey := func() Key {
		k := Key{Identity: peers[rng.IntN(len(peers))], Proto: protos[rng.IntN(len(protos))], Dir: Direction(rng.IntN(2))}
		if k.Proto != 0 {
			k.Port = ports[rng.IntN(len(ports))]
		}
		return k
	}
	for iter := range 3000 {
		var allow, deny []Key
		for range rng.IntN(6) {
			allow = append(allow, randKey())
		}
		for range rng.IntN(4) {
			deny = append(deny, randKey())
		}
		m := NewMapState(1, true, true, slices.Clone(allow))
		m.applyDeny(deny)
		for _, d := range m.Deny {
			if !m.Has(d) {
				t.Fatalf("iter %d: deny %+v is not an entry", iter, d)
			}
		}
		for _, peer := range peers[1:] {
			for _, proto := range protos[1:] {
				for _, port := range ports[1:] {
					for _, dir := range []Direction{Ingress, Egress} {
						in := func(k Key) bool { return matches(k, peer, port, proto, dir) }
						want := slices.ContainsFunc(allow, in) && !slices.ContainsFunc(deny, in)
						if got := m.Allows(peer, port, proto, dir); got != want {
							t.Fatalf("iter %d: allow %v deny %v: Allows(%d, %d/%d, %s) = %v, want %v (entries %v, deny %v)",
								iter, allow, deny, peer, port, proto, dir, got, want, m.Allow, m.Deny)
						}
					}
				}
			}
		}
	}
}

// TestDenyAcrossKinds: an ingressDeny of a CiliumNetworkPolicy drops
// what a Kubernetes NetworkPolicy and a CiliumClusterwideNetworkPolicy
// allow, however specific the allow, and only that; an egressDeny on a
// CIDR drops what an allow on the same CIDR's identities and on any
// peer allows, except the except.
func TestDenyAcrossKinds(t *testing.T) {
	const server, client, other identity.NumericIdentity = 420, 421, 422
	r := NewRepository()
	r.UpsertIdentity(server, podLabels(t, "a", "app=server"))
	r.UpsertIdentity(client, podLabels(t, "a", "app=client"))
	r.UpsertIdentity(other, podLabels(t, "a", "app=other"))
	r.Import(mustParse(t, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-all, namespace: a}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress: [{}]
  egress: [{}]
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: ssh-from-client}
spec:
  endpointSelector: {matchLabels: {app: server}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: client}}]
    toPorts: [{ports: [{port: "22", protocol: TCP}]}]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: deny, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: server}}
  ingressDeny:
  - fromEndpoints: [{matchLabels: {app: client}}]
  - toPorts: [{ports: [{port: "23", protocol: TCP}]}]
  egressDeny:
  - toCIDRSet: [{cidr: 10.0.0.0/8, except: [10.1.0.0/16]}]
    toPorts: [{ports: [{port: "53", protocol: UDP}]}]
`))
	m := r.MapState(server)
	if m == nil || !m.IngressEnforced || !m.EgressEnforced {
		t.Fatalf("server: %+v, want both directions enforced", m)
	}
	for _, tc := range []struct {
		peer  identity.NumericIdentity
		port  uint16
		proto uint8
		want  bool
	}{
		{client, 22, ProtoTCP, false}, // the CCNP's exact allow loses to the L3 deny
		{client, 80, ProtoTCP, false},
		{other, 80, ProtoTCP, true},
		{other, 23, ProtoTCP, false}, // any peer's port 23
		{other, 23, ProtoUDP, true},
	} {
		if got := m.Allows(tc.peer, tc.port, tc.proto, Ingress); got != tc.want {
			t.Errorf("ingress from %d to %d/%d: allowed %v, want %v", tc.peer, tc.port, tc.proto, got, tc.want)
		}
	}
	world := identity.ReservedWorld
	for _, tc := range []struct {
		addr  string
		port  uint16
		proto uint8
		want  bool
	}{
		{"10.2.3.4", 53, ProtoUDP, false},
		{"10.1.3.4", 53, ProtoUDP, true}, // the except
		{"10.2.3.4", 53, ProtoTCP, true},
		{"192.0.2.1", 53, ProtoUDP, true},
	} {
		if got := m.AllowsAddr(world, netip.MustParseAddr(tc.addr), tc.port, tc.proto, Egress); got != tc.want {
			t.Errorf("egress to %s %d/%d: allowed %v, want %v", tc.addr, tc.port, tc.proto, got, tc.want)
		}
	}
}

// TestDenyOnlyIsolates: a policy with only deny entries makes its
// direction default-deny, as Cilium's enableDefaultDeny default does.
func TestDenyOnlyIsolates(t *testing.T) {
	const server, client identity.NumericIdentity = 420, 421
	r := NewRepository()
	r.UpsertIdentity(server, podLabels(t, "a", "app=server"))
	r.UpsertIdentity(client, podLabels(t, "a", "app=client"))
	r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: deny, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: server}}
  ingressDeny:
  - fromEndpoints: [{matchLabels: {app: client}}]
`))
	m := r.MapState(server)
	if m == nil || !m.IngressEnforced || m.EgressEnforced {
		t.Fatalf("server: %+v, want ingress enforced only", m)
	}
	if m.Allows(client, 80, ProtoTCP, Ingress) || m.Allows(server, 80, ProtoTCP, Ingress) {
		t.Error("a deny-only ingress allows something")
	}
}

// TestDenyDropsRedirects: an L7 allow a deny covers is no longer
// redirected, and the deny is not.
func TestDenyDropsRedirects(t *testing.T) {
	const server, client identity.NumericIdentity = 420, 421
	r := NewRepository()
	r.UpsertIdentity(server, podLabels(t, "a", "app=server"))
	r.UpsertIdentity(client, podLabels(t, "a", "app=client"))
	r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: server}}
  ingress:
  - toPorts: [{ports: [{port: "80", protocol: TCP}], rules: {http: [{method: GET}]}}]
  ingressDeny:
  - fromEndpoints: [{matchLabels: {app: client}}]
`))
	m := r.MapState(server)
	for _, e := range m.L7 {
		if m.Denies(e.Key) {
			t.Errorf("L7 entry %+v denies", e.Key)
		}
	}
	if len(m.L7) != 1 || m.Allows(client, 80, ProtoTCP, Ingress) || !m.Allows(server, 80, ProtoTCP, Ingress) {
		t.Errorf("L7 %v, client allowed %v, want one redirect and client denied", m.L7, m.Allows(client, 80, ProtoTCP, Ingress))
	}
}

// TestICMPRules: icmps compile to entries on the ICMP type (by number or
// by Cilium's name, per family), in allow and deny entries.
func TestICMPRules(t *testing.T) {
	const server, client identity.NumericIdentity = 420, 421
	r := NewRepository()
	r.UpsertIdentity(server, podLabels(t, "a", "app=server"))
	r.UpsertIdentity(client, podLabels(t, "a", "app=client"))
	r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: server}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: client}}]
    icmps: [{fields: [{type: 8}, {type: EchoRequest, family: IPv6}, {type: 0}]}]
  egressDeny:
  - icmps: [{fields: [{type: DestinationUnreachable}]}]
  egress: [{}]
`))
	m := r.MapState(server)
	for _, tc := range []struct {
		proto uint8
		typ   uint8
		dir   Direction
		want  bool
	}{
		{ProtoICMP, 8, Ingress, true},
		{ProtoICMP, 0, Ingress, true},
		{ProtoICMP, 13, Ingress, false},
		{ProtoICMPv6, 128, Ingress, true},
		{ProtoICMPv6, 8, Ingress, false},
		{ProtoICMP, 3, Egress, false},
		{ProtoICMP, 8, Egress, true},
	} {
		if got := m.Allows(client, ICMPTypePort(tc.typ), tc.proto, tc.dir); got != tc.want {
			t.Errorf("%s ICMP proto %d type %d: allowed %v, want %v", tc.dir, tc.proto, tc.typ, got, tc.want)
		}
	}
	if m.Allows(client, 0, ProtoICMP, Ingress) {
		t.Error("a rule on ICMP type 0 allows every type")
	}
}

func TestICMPRulesRefused(t *testing.T) {
	for _, tc := range []struct{ entry, want string }{
		{`icmps: [{fields: [{type: 256}]}]`, "spec.ingress[0].icmps[0].fields[0].type: 256 outside 0..255"},
		{`icmps: [{fields: [{type: PacketTooBig}]}]`, `unknown IPv4 ICMP type name "PacketTooBig"`},
		{`icmps: [{fields: [{type: 8, family: IPv5}]}]`, `unsupported family "IPv5"`},
		{`icmps: [{fields: [{family: IPv4}]}]`, "fields[0].type: missing"},
		{`icmps: [{fields: []}]`, "icmps[0].fields: missing"},
		{"icmps: [{fields: [{type: 8}]}]\n    toPorts: [{ports: [{port: \"80\"}]}]", "icmps and toPorts in one entry"},
	} {
		doc := cnpHead + "  namespace: a\nspec:\n  endpointSelector: {}\n  ingress:\n  - " + tc.entry + "\n"
		_, err := Parse([]byte(doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one containing %q", tc.entry, err, tc.want)
		}
	}
	doc := cnpHead + "  namespace: a\nspec:\n  endpointSelector: {}\n  ingressDeny:\n  - toPorts: [{ports: [{port: \"80\"}], rules: {http: [{}]}}]\n"
	if _, err := Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), `"spec.ingressDeny[0].toPorts[0].rules"`) {
		t.Errorf("deny with L7 rules: err = %v, want the field refused", err)
	}
}

// TestEnableDefaultDenyFalse: a rule with enableDefaultDeny false for a
// direction applies its denies and redirects there without isolating
// the endpoint; another rule selecting it with default deny still does.
func TestEnableDefaultDenyFalse(t *testing.T) {
	const server, client, other identity.NumericIdentity = 420, 421, 422
	r := NewRepository()
	r.UpsertIdentity(server, podLabels(t, "a", "app=server"))
	r.UpsertIdentity(client, podLabels(t, "a", "app=client"))
	r.UpsertIdentity(other, podLabels(t, "a", "app=other"))
	const open = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: open, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: server}}
  enableDefaultDeny: {ingress: false, egress: false}
  ingressDeny:
  - fromEndpoints: [{matchLabels: {app: client}}]
  ingress:
  - toPorts: [{ports: [{port: "80", protocol: TCP}], rules: {http: [{method: GET}]}}]
`
	r.Import(mustParse(t, open))
	m := r.MapState(server)
	if m == nil || !m.IngressEnforced || m.EgressEnforced {
		t.Fatalf("server: %+v, want ingress (with its denies) enforced, egress open", m)
	}
	if m.Allows(client, 443, ProtoTCP, Ingress) || !m.Allows(other, 443, ProtoTCP, Ingress) || !m.Allows(other, 80, ProtoTCP, Ingress) {
		t.Errorf("client:443 %v other:443 %v other:80 %v, want false true true",
			m.Allows(client, 443, ProtoTCP, Ingress), m.Allows(other, 443, ProtoTCP, Ingress), m.Allows(other, 80, ProtoTCP, Ingress))
	}
	if len(m.L7) != 1 || m.L7[0].Key != (Key{Port: 80, Proto: ProtoTCP, Dir: Ingress}) {
		t.Errorf("L7 %v, want port 80 redirected", m.L7)
	}
	r.Import(mustParse(t, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: isolate, namespace: a}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress: [{from: [{podSelector: {matchLabels: {app: other}}}], ports: [{port: 8080}]}]
`))
	m = r.MapState(server)
	if m.Allows(other, 443, ProtoTCP, Ingress) || !m.Allows(other, 8080, ProtoTCP, Ingress) || m.Allows(client, 8080, ProtoTCP, Ingress) {
		t.Errorf("with a default-deny rule too: other:443 %v other:8080 %v client:8080 %v, want false true false",
			m.Allows(other, 443, ProtoTCP, Ingress), m.Allows(other, 8080, ProtoTCP, Ingress), m.Allows(client, 8080, ProtoTCP, Ingress))
	}
}

// TestReservedEntities: fromEntities health, init and unmanaged select
// the reserved identities of those names and nothing else; cluster
// selects them too.
func TestReservedEntities(t *testing.T) {
	const server, client identity.NumericIdentity = 420, 421
	r := NewRepository()
	r.UpsertIdentity(server, podLabels(t, "a", "app=server"))
	r.UpsertIdentity(client, podLabels(t, "a", "app=client"))
	for _, tc := range []struct {
		entity string
		want   identity.NumericIdentity
	}{{"health", identity.ReservedHealth}, {"init", identity.ReservedInit}, {"unmanaged", identity.ReservedUnmanaged}} {
		r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: server}}
  ingress: [{fromEntities: [`+tc.entity+`]}]
`))
		m := r.MapState(server)
		for _, peer := range []identity.NumericIdentity{identity.ReservedHost, identity.ReservedWorld, identity.ReservedUnmanaged,
			identity.ReservedHealth, identity.ReservedInit, client} {
			if got := m.Allows(peer, 80, ProtoTCP, Ingress); got != (peer == tc.want) {
				t.Errorf("fromEntities %s: peer %s allowed %v", tc.entity, peer, got)
			}
		}
	}
	r.Import(mustParse(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: server}}
  ingress: [{fromEntities: [cluster]}]
`))
	m := r.MapState(server)
	for _, peer := range []identity.NumericIdentity{identity.ReservedHealth, identity.ReservedInit, identity.ReservedUnmanaged, identity.ReservedHost, client} {
		if !m.Allows(peer, 80, ProtoTCP, Ingress) {
			t.Errorf("fromEntities cluster: peer %s refused", peer)
		}
	}
	if m.Allows(identity.ReservedWorld, 80, ProtoTCP, Ingress) {
		t.Error("fromEntities cluster: world allowed")
	}
}
