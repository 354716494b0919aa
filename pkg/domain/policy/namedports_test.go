package policy

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

func TestValidatePortName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"http", true}, {"h2c", true}, {"serve-80-tcp", true}, {"a", true}, {"abcdefghijklmno", true},
		{"", false}, {"abcdefghijklmnop", false}, {"80", false}, {"-http", false}, {"http-", false},
		{"ht--tp", false}, {"HTTP", false}, {"http_2", false}, {"ht tp", false}, {"http\x00", false}, {"é", false},
	} {
		if err := ValidatePortName(tc.name); (err == nil) != tc.ok {
			t.Errorf("ValidatePortName(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

func TestNewNamedPorts(t *testing.T) {
	got, err := NewNamedPorts([]NamedPort{{"web", ProtoTCP, 8080}, {"dns", ProtoUDP, 53}, {"dns", ProtoTCP, 53}, {"web", ProtoTCP, 8080}})
	if err != nil {
		t.Fatal(err)
	}
	if want := "dns/TCP=53,dns/UDP=53,web/TCP=8080"; got.String() != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	if p, ok := got.Lookup("dns", ProtoUDP); !ok || p != 53 {
		t.Fatalf("Lookup(dns, UDP) = %d, %v", p, ok)
	}
	if _, ok := got.Lookup("web", ProtoSCTP); ok {
		t.Fatal("Lookup(web, SCTP) found a TCP port")
	}
	for _, bad := range [][]NamedPort{
		{{"web", ProtoTCP, 80}, {"web", ProtoTCP, 81}},
		{{"Web", ProtoTCP, 80}},
		{{"web", ProtoICMP, 80}},
		{{"web", ProtoTCP, 0}},
	} {
		if _, err := NewNamedPorts(bad); err == nil {
			t.Errorf("NewNamedPorts(%v): no error", bad)
		}
	}
}

func TestParseNamedPort(t *testing.T) {
	for in, want := range map[string]string{"http=80": "http/TCP=80", "dns/udp=53": "dns/UDP=53", "x/SCTP=65535": "x/SCTP=65535"} {
		p, err := ParseNamedPort(in)
		if err != nil || NamedPorts([]NamedPort{p}).String() != want {
			t.Errorf("ParseNamedPort(%q) = %v, %v; want %s", in, p, err, want)
		}
	}
	for _, bad := range []string{"http", "http=0", "http=65536", "http=+80", "http=080", "http/icmp=1", "HTTP=80", "=80", "http=", "http=8 0"} {
		if _, err := ParseNamedPort(bad); err == nil {
			t.Errorf("ParseNamedPort(%q): no error", bad)
		}
	}
}

// FuzzParseNamedPort: whatever is accepted is a valid named port and
// prints back as it parses.
func FuzzParseNamedPort(f *testing.F) {
	for _, s := range []string{"http=80", "dns/udp=53", "a-b/SCTP=1", "http", "-x=1", "x=99999", "\xff=1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseNamedPort(s)
		if err != nil {
			return
		}
		ps, err := NewNamedPorts([]NamedPort{p})
		if err != nil {
			t.Fatalf("ParseNamedPort(%q) = %+v, refused by NewNamedPorts: %v", s, p, err)
		}
		again, err := ParseNamedPort(ps.String())
		if err != nil || again != p {
			t.Fatalf("round trip of %q: %+v, %v", s, again, err)
		}
	})
}

// FuzzPolicyPortName: a port name in a policy is refused unless it is
// an IANA_SVC_NAME, and an accepted one compiles to a named key.
func FuzzPolicyPortName(f *testing.F) {
	for _, s := range []string{"http", "HTTP", "a--b", "x", "0", "abcdefghijklmnop", "-a", "a b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if name == "" {
			return // not a named port: portValue keeps "" as the number 0
		}
		got, err := compilePort(portValue{set: true, name: name}, 0, "", "TCP", "p")
		if (err == nil) != (ValidatePortName(name) == nil) {
			t.Fatalf("compilePort(%q) = %v, ValidatePortName = %v", name, err, ValidatePortName(name))
		}
		if err == nil && (len(got) != 1 || got[0].Name != name || got[0].Port != 0 || got[0].Proto != ProtoTCP) {
			t.Fatalf("compilePort(%q) = %+v", name, got)
		}
	})
}

func mustPorts(t testing.TB, ss ...string) NamedPorts {
	t.Helper()
	var ps []NamedPort
	for _, s := range ss {
		p, err := ParseNamedPort(s)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	out, err := NewNamedPorts(ps)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

const knpIngressNamed = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: named-in, namespace: x}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: serve-80-tcp, protocol: TCP}]
`

// Ingress on a named port: each selected endpoint's own port of that
// name and protocol, nothing for an endpoint without it (upstream's
// "should allow ingress access on one named port").
func TestNamedPortIngress(t *testing.T) {
	const server, client identity.NumericIdentity = 500, 501
	r := NewRepository()
	r.UpsertIdentity(server, podLabels(t, "x", "app=server"))
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.Import(mustParse(t, knpIngressNamed))

	m := r.MapState(server)
	if !m.IngressEnforced || len(m.Named) != 1 || m.Named[0] != (NamedKey{Identity: client, Name: "serve-80-tcp", Proto: ProtoTCP}) {
		t.Fatalf("MapState = %+v", m)
	}
	for _, tc := range []struct {
		name  string
		ports NamedPorts
		allow []uint16 // TCP ports allowed from client
	}{
		{"declares it as 80", mustPorts(t, "serve-80-tcp=80", "serve-81-tcp=81"), []uint16{80}},
		{"declares it as 8080", mustPorts(t, "serve-80-tcp=8080"), []uint16{8080}},
		{"declares only the UDP one", mustPorts(t, "serve-80-tcp/UDP=80"), nil},
		{"declares no ports", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := r.MapStateFor(server, tc.ports)
			for _, port := range []uint16{80, 81, 8080} {
				want := slices.Contains(tc.allow, port)
				if got.Allows(client, port, ProtoTCP, Ingress) != want {
					t.Errorf("TCP %d from client: allowed=%v, want %v", port, !want, want)
				}
				if got.Allows(client, port, ProtoUDP, Ingress) {
					t.Errorf("UDP %d from client allowed", port)
				}
				if got.Allows(server, port, ProtoTCP, Ingress) {
					t.Errorf("TCP %d from another peer allowed", port)
				}
			}
			if again := r.MapStateFor(server, tc.ports); again != got {
				t.Error("MapStateFor not shared for the same ports")
			}
		})
	}
}

// A policy on SCTP named ports allows nothing over TCP, whatever the
// pod names its TCP port.
func TestNamedPortProtocolMustMatch(t *testing.T) {
	const server, client identity.NumericIdentity = 500, 501
	r := NewRepository()
	r.UpsertIdentity(server, podLabels(t, "x", "app=server"))
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.Import(mustParse(t, strings.Replace(knpIngressNamed, "protocol: TCP", "protocol: SCTP", 1)))
	m := r.MapStateFor(server, mustPorts(t, "serve-80-tcp=80"))
	if m.Allows(client, 80, ProtoTCP, Ingress) || m.Allows(client, 80, ProtoSCTP, Ingress) {
		t.Fatal("SCTP named port matched a TCP port")
	}
	m = r.MapStateFor(server, mustPorts(t, "serve-80-tcp/SCTP=80"))
	if !m.Allows(client, 80, ProtoSCTP, Ingress) || m.Allows(client, 80, ProtoTCP, Ingress) {
		t.Fatal("SCTP named port: want SCTP 80 only")
	}
}

const cnpEgressNamed = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: named-out, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: client}}
  egress:
  - toEndpoints: [{matchLabels: {app: server}}]
    toPorts: [{ports: [{port: http, protocol: TCP}]}]
`

// Egress on a named port: each peer identity's own number, recomputed
// when the ports of a peer identity change (upstream's "should allow
// egress access on one named port").
func TestNamedPortEgress(t *testing.T) {
	const client, serverA, serverB, other identity.NumericIdentity = 600, 601, 602, 603
	r := NewRepository()
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.UpsertIdentity(serverA, podLabels(t, "x", "app=server", "v=a"))
	r.UpsertIdentity(serverB, podLabels(t, "x", "app=server", "v=b"))
	r.UpsertIdentity(other, podLabels(t, "x", "app=other"))
	r.SetEndpointPorts("ep-a", serverA, mustPorts(t, "http=8080"))
	r.SetEndpointPorts("ep-other", other, mustPorts(t, "http=80"))
	r.Import(mustParse(t, cnpEgressNamed))
	m := r.MapState(client)
	check := func(m *MapState, peer identity.NumericIdentity, port uint16, want bool) {
		t.Helper()
		if m.Allows(peer, port, ProtoTCP, Egress) != want {
			t.Errorf("egress to %d on TCP %d: allowed=%v, want %v", peer, port, !want, want)
		}
	}
	check(m, serverA, 8080, true)
	check(m, serverA, 80, false)
	check(m, serverB, 8080, false) // declares nothing yet
	check(m, other, 80, false)     // not a peer of the rule

	// serverB comes up naming http 9090: the client's policy changes;
	// each server keeps its own number.
	res := r.SetEndpointPorts("ep-b", serverB, mustPorts(t, "http=9090"))
	if !slices.Contains(changedIDs(res), client) {
		t.Fatalf("changed = %v, want the client", changedIDs(res))
	}
	m = r.MapState(client)
	check(m, serverB, 9090, true)
	check(m, serverA, 9090, false)
	check(m, serverB, 8080, false)

	// A new serverA endpoint numbering http 8081: both numbers for the
	// identity (the policy map is per identity); when the old endpoint
	// goes, only 8081.
	r.SetEndpointPorts("ep-a2", serverA, mustPorts(t, "http=8081"))
	m = r.MapState(client)
	check(m, serverA, 8080, true)
	check(m, serverA, 8081, true)
	res = r.RemoveEndpointPorts("ep-a")
	if !slices.Contains(changedIDs(res), client) {
		t.Fatalf("changed = %v, want the client", changedIDs(res))
	}
	m = r.MapState(client)
	check(m, serverA, 8080, false)
	check(m, serverA, 8081, true)

	// Ports of an identity no named egress rule reaches change nothing.
	if res := r.SetEndpointPorts("ep-other2", other, mustPorts(t, "http=81")); len(res.Changed) != 0 {
		t.Fatalf("changed = %v, want none", changedIDs(res))
	}
}

// An egress entry on a named port without peers reaches every identity
// declaring the name on its numbers, and the identities that are no
// endpoint's (world) on the cluster's (namedpeer_test.go); an egress
// CIDR rule on a named port the numbers the cluster's endpoints give it
// (namedcidr_test.go), on its addresses only.
func TestNamedPortEgressAnyPeerAndCIDR(t *testing.T) {
	const client, server identity.NumericIdentity = 700, 701
	r := NewRepository()
	r.UpsertIdentity(client, podLabels(t, "x", "app=client"))
	r.UpsertIdentity(server, podLabels(t, "y", "app=server"))
	r.SetEndpointPorts("s", server, mustPorts(t, "dns/UDP=5353"))
	r.Import(mustParse(t, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: any-named, namespace: x}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - ports: [{port: dns, protocol: UDP}]
  - to: [{ipBlock: {cidr: 10.0.0.0/8}}]
    ports: [{port: dns, protocol: UDP}]
`))
	m := r.MapState(client)
	if !m.Allows(server, 5353, ProtoUDP, Egress) || m.Allows(server, 53, ProtoUDP, Egress) || m.Allows(client, 5353, ProtoUDP, Egress) ||
		!m.Allows(identity.ReservedWorld, 5353, ProtoUDP, Egress) || m.Allows(identity.ReservedWorld, 53, ProtoUDP, Egress) {
		t.Fatalf("MapState = %+v", m)
	}
	want := []CIDREntry{{Dir: Egress, Proto: ProtoUDP, Port: 5353, Prefix: netip.MustParsePrefix("10.0.0.0/8"), Allow: true}}
	if !slices.Equal(m.CIDR, want) {
		t.Fatalf("CIDR entries %+v, want %+v", m.CIDR, want)
	}
}

// An ingress CIDR rule on a named port is resolved against the
// endpoint's own port, next to a numbered CIDR rule on the same number.
func TestNamedPortIngressCIDR(t *testing.T) {
	const server identity.NumericIdentity = 800
	r := NewRepository()
	r.UpsertIdentity(server, podLabels(t, "x", "app=server"))
	r.Import(mustParse(t, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: cidr-named, namespace: x}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{ipBlock: {cidr: 10.1.0.0/16}}]
    ports: [{port: web}]
  - from: [{ipBlock: {cidr: 10.2.0.0/16}}]
    ports: [{port: 8080}]
`))
	unresolved := r.MapState(server)
	m := r.MapStateFor(server, mustPorts(t, "web=8080"))
	addr := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	for _, tc := range []struct {
		m    *MapState
		a    string
		port uint16
		want bool
	}{
		{m, "10.1.2.3", 8080, true}, {m, "10.2.2.3", 8080, true}, {m, "10.1.2.3", 80, false},
		{unresolved, "10.1.2.3", 8080, false}, {unresolved, "10.2.2.3", 8080, true},
	} {
		if got := tc.m.AllowsAddr(identity.ReservedWorld, addr(tc.a), tc.port, ProtoTCP, Ingress); got != tc.want {
			t.Errorf("%s TCP %d (resolved=%v): allowed=%v, want %v", tc.a, tc.port, tc.m == m, got, tc.want)
		}
	}
	if m.Equal(unresolved) {
		t.Fatal("resolved policy equals the unresolved one")
	}
}
