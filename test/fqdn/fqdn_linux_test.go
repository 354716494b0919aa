package fqdn

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/dnsproxy"
	"github.com/membrane-cni/membrane/pkg/agent/metrics"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

func TestMain(m *testing.M) { os.Exit(nodeharness.Main(m, "membrane-agent")) }

// Addresses of the world netns (a documentation range, only ever inside
// the test's namespaces): the DNS server and the two names' servers.
var (
	nodeSide  = netip.MustParsePrefix("192.0.2.1/24")
	worldSide = netip.MustParsePrefix("192.0.2.2/24")
	dnsAddr   = netip.MustParseAddr("192.0.2.53")
	allowedIP = netip.MustParseAddr("192.0.2.10")
	deniedIP  = netip.MustParseAddr("192.0.2.20")

	// The IPv6 side of a dual-stack env (newEnvDual).
	nodeSide6  = netip.MustParsePrefix("2001:db8:53::1/64")
	worldSide6 = netip.MustParsePrefix("2001:db8:53::2/64")
	dnsAddr6   = netip.MustParseAddr("2001:db8:53::53")
	allowedIP6 = netip.MustParseAddr("2001:db8:53::10")
	deniedIP6  = netip.MustParseAddr("2001:db8:53::20")
)

// answerTTL is the TTL of the test server's answers (seconds), but for
// the names of ttls: long.test (allowed.test's address) and short.test
// (denied.test's).
const answerTTL = 8

var ttls = map[string]uint32{"long.test.": 300, "short.test.": 2}

// env is one node netns with an agent and its DNS proxy, a world netns
// and pod A.
type env struct {
	t       testing.TB
	node    *nodeharness.Node
	world   *testutil.NS
	c       *client.Client
	pod     *testutil.NS
	podIP   netip.Addr
	podIP6  netip.Addr // dual-stack only
	epID    int64
	metrics *metrics.Metrics
	dual    bool
	proc    *nodeharness.Proc // newEnvProc: the agent process
}

func newEnv(t *testing.T) *env { return newEnvTB(t) }

func newEnvTB(t testing.TB) *env { return newEnvWith(t, false) }

// newEnvDual is newEnv on a dual-stack node whose world also has IPv6:
// the DNS server answers AAAA queries too, at dnsAddr6 as at dnsAddr.
func newEnvDual(t *testing.T) *env { return newEnvWith(t, true) }

func newEnvWith(t testing.TB, dual bool) *env { return newEnvOpts(t, dual, nil) }

// newEnvProc is newEnv with the agent as a membrane-agent process (with
// the DNS proxy and flags), which the test may SIGKILL and restart.
func newEnvProc(t *testing.T, flags ...string) *env {
	return newEnvOpts(t, false, append([]string{"--dns-proxy", "--tofqdns-proxy-port", "10053",
		"--tofqdns-proxy-response-max-delay", "5s"}, flags...))
}

func newEnvOpts(t testing.TB, dual bool, procFlags []string, mods ...func(*agent.Config)) *env {
	t.Helper()
	testutil.RequireRoot(t)
	e := &env{t: t, world: testutil.NewNS(t, "mbt-fqdnw"), metrics: metrics.New(), dual: dual}
	o := nodeharness.Options{Prefix: "mbt-fqdn", IPv4Range: "10.231.0.0/24", Network: "membrane-fqdn", Debug: true}
	if dual {
		o.IPv6Range = "fd00:231::/112"
	}
	e.node = nodeharness.New(t, o)
	e.link()
	dnsServer(t, e.world, dual)
	if dual {
		testutil.EchoServer(t, e.world, allowedIP6, 80)
		testutil.EchoServer(t, e.world, deniedIP6, 80)
	}
	testutil.EchoServer(t, e.world, allowedIP, 80)
	testutil.EchoServer(t, e.world, deniedIP, 80)
	if procFlags != nil {
		e.proc = e.node.Process(procFlags...)
		e.proc.Start()
	} else {
		e.node.StartAgent(func(cfg *agent.Config) {
			cfg.DNSProxy = &dnsproxy.Config{Port: 10053, HoldTimeout: 5 * time.Second}
			cfg.API.Metrics = e.metrics
			for _, mod := range mods {
				mod(cfg)
			}
		})
	}
	e.c = e.node.Client()
	e.pod, e.podIP, e.podIP6, e.epID = e.addPod("a")
	return e
}

// link connects the world netns to the node netns by a veth: the node
// reaches 192.0.2.0/24 through it, the world routes everything back.
func (e *env) link() {
	t := e.t
	hnl, wnl := e.node.NS.Netlink(t), e.world.Netlink(t)
	name := "mbtw" + testutil.RandomSuffix(6)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
	if err := hnl.LinkAdd(veth); err != nil {
		t.Fatalf("world veth: %v", err)
	}
	peer, err := hnl.LinkByName(name + "p")
	if err != nil {
		t.Fatal(err)
	}
	wh, err := e.world.Handle()
	if err != nil {
		t.Fatal(err)
	}
	defer wh.Close()
	if err := hnl.LinkSetNsFd(peer, int(wh)); err != nil {
		t.Fatalf("move veth peer: %v", err)
	}
	addr := func(nl *netlink.Handle, link string, p netip.Prefix, extra ...netip.Addr) {
		l, err := nl.LinkByName(link)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range append([]netip.Prefix{p}, hostPrefixes(extra)...) {
			if err := nl.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), a.Addr().BitLen())},
				Flags: unix.IFA_F_NODAD}); err != nil {
				t.Fatalf("address %s on %s: %v", a, link, err)
			}
		}
		if err := nl.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	addr(hnl, name, nodeSide)
	addr(wnl, name+"p", worldSide, dnsAddr, allowedIP, deniedIP)
	if e.dual {
		addr(hnl, name, nodeSide6)
		addr(wnl, name+"p", worldSide6, dnsAddr6, allowedIP6, deniedIP6)
	}
	lo, _ := wnl.LinkByName("lo")
	_ = wnl.LinkSetUp(lo)
	wl, _ := wnl.LinkByName(name + "p")
	gw := nodeSide.Addr().AsSlice()
	if err := wnl.RouteAdd(&netlink.Route{LinkIndex: wl.Attrs().Index, Gw: gw}); err != nil {
		t.Fatalf("world default route: %v", err)
	}
	if e.dual {
		_, all6, _ := net.ParseCIDR("::/0")
		if err := wnl.RouteAdd(&netlink.Route{LinkIndex: wl.Attrs().Index, Dst: all6, Gw: nodeSide6.Addr().AsSlice()}); err != nil {
			t.Fatalf("world default route (IPv6): %v", err)
		}
	}
}

func hostPrefixes(as []netip.Addr) []netip.Prefix {
	out := make([]netip.Prefix, len(as))
	for i, a := range as {
		out[i] = netip.PrefixFrom(a, a.BitLen())
	}
	return out
}

// dnsServer answers allowed.test and denied.test with their servers'
// addresses, node.test with the node's own address (TTL answerTTL) on
// dnsAddr:53, UDP and TCP, in ns; with dual, AAAA queries too (the IPv6
// servers' addresses) and on dnsAddr6:53 as well.
func dnsServer(t testing.TB, ns *testutil.NS, dual bool) {
	t.Helper()
	servers := []netip.AddrPort{netip.AddrPortFrom(dnsAddr, 53)}
	if dual {
		servers = append(servers, netip.AddrPortFrom(dnsAddr6, 53))
	}
	dnsServerAt(t, ns, dual, servers...)
}

// dnsServerAt is dnsServer listening on servers (UDP and TCP) in ns.
func dnsServerAt(t testing.TB, ns *testutil.NS, dual bool, servers ...netip.AddrPort) {
	t.Helper()
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		ips := map[string]netip.Addr{"allowed.test.": allowedIP, "denied.test.": deniedIP, "node.test.": nodeSide.Addr(),
			"long.test.": allowedIP, "short.test.": deniedIP}
		if dual && q.Qtype == dns.TypeAAAA {
			ips = map[string]netip.Addr{"allowed.test.": allowedIP6, "denied.test.": deniedIP6, "node.test.": nodeSide6.Addr()}
		}
		ip, ok := ips[strings.ToLower(q.Name)]
		if !ok {
			ip, ok = benchName(q.Name)
		}
		hdr := dns.RR_Header{Name: q.Name, Rrtype: q.Qtype, Class: dns.ClassINET, Ttl: ttls[strings.ToLower(q.Name)]}
		if hdr.Ttl == 0 {
			hdr.Ttl = answerTTL
		}
		switch {
		case !ok:
			m.Rcode = dns.RcodeNameError
		case q.Qtype == dns.TypeA:
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: ip.AsSlice()})
		case q.Qtype == dns.TypeAAAA && ip.Is6():
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: ip.AsSlice()})
		}
		_ = w.WriteMsg(m)
	})
	for _, server := range servers {
		addr := server.String()
		for _, network := range []string{"udp", "tcp"} {
			srv := &dns.Server{Net: network, Handler: h}
			err := ns.Do(func() error {
				if network == "udp" {
					pc, err := net.ListenPacket("udp", addr)
					srv.PacketConn = pc
					return err
				}
				ln, err := net.Listen("tcp", addr)
				srv.Listener = ln
				return err
			})
			if err != nil {
				t.Fatalf("dns server %s %s: %v", network, addr, err)
			}
			go func() { _ = srv.ActivateAndServe() }()
			t.Cleanup(func() { _ = srv.Shutdown() })
		}
	}
}

// addPod runs CNI ADD for pod name (namespace default) and labels it
// app=<name>.
func (e *env) addPod(name string) (*testutil.NS, netip.Addr, netip.Addr, int64) {
	t := e.t
	p := e.node.AddPod(name)
	ep, err := e.c.EndpointPatchLabels(context.Background(), "container-id:"+p.RT.ContainerID, []string{"k8s:app=" + name}, nil)
	if err != nil {
		t.Fatalf("label pod: %v", err)
	}
	return p.NS, p.IPv4, p.IPv6, ep.ID
}

// resolve asks the test DNS server for name's A record from pod A over
// network (udp or tcp), as the pod would: to dnsAddr:53.
func (e *env) resolve(network, name string) (*dns.Msg, error) {
	return resolveFrom(e.pod, network, name)
}

func resolveFrom(pod *testutil.NS, network, name string) (*dns.Msg, error) {
	return resolveAt(pod, network, name, netip.AddrPortFrom(dnsAddr, 53))
}

// resolveAt asks server for name's A record from pod over network.
func resolveAt(pod *testutil.NS, network, name string, server netip.AddrPort) (*dns.Msg, error) {
	var resp *dns.Msg
	err := pod.Do(func() error {
		c := &dns.Client{Net: network, Timeout: 10 * time.Second}
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		var err error
		resp, _, err = c.Exchange(m, server.String())
		return err
	})
	return resp, err
}

// connect reports whether the pod reaches ip:80 (a bounded attempt).
func (e *env) connect(ip netip.Addr) error {
	return testutil.Exchange(e.pod, ip, 80, 2*time.Second)
}

func (e *env) importPolicy(dnsRule string) { e.importPolicyFQDN(dnsRule, "matchName: allowed.test") }

// importPolicyFQDN imports A's policy: rules.dns dnsRule towards the
// world's port 53, toFQDNs fqdnSel on port 80.
func (e *env) importPolicyFQDN(dnsRule, fqdnSel string) {
	e.t.Helper()
	doc := fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: fqdn, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: a}}
  egress:
  - toEntities: [world]
    toPorts:
    - ports: [{port: "53", protocol: ANY}]
      rules:
        dns: [{%s}]
  - toFQDNs: [{%s}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
`, dnsRule, fqdnSel)
	if _, err := e.c.PolicyImport(context.Background(), []byte(doc), "application/yaml"); err != nil {
		e.t.Fatalf("import policy: %v", err)
	}
	e.settle()
}

// settle waits until pod A realised the policy it was computed.
func (e *env) settle() {
	e.t.Helper()
	id := strconv.FormatInt(e.epID, 10)
	testutil.Eventually(e.t, "policy realised", func() bool {
		ep, err := e.c.EndpointGet(context.Background(), id)
		if err != nil || ep.State != "ready" {
			return false
		}
		pol, err := e.c.EndpointPolicy(context.Background(), id)
		if err != nil || pol.RealizedError != "" || !pol.EgressEnforced || !pol.RealizedEgressEnforced || len(pol.Computed) != len(pol.Realized) {
			return false
		}
		for i := range pol.Computed {
			if pol.Computed[i] != pol.Realized[i].PolicyEntry {
				return false
			}
		}
		return true
	})
}

// answerIP returns the single A address of an answer.
func answerIP(m *dns.Msg) (netip.Addr, bool) {
	if m == nil || m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
		return netip.Addr{}, false
	}
	a, ok := m.Answer[0].(*dns.A)
	if !ok {
		return netip.Addr{}, false
	}
	ip, ok := netip.AddrFromSlice(a.A.To4())
	return ip, ok
}

// TestFQDNPolicy (root, real traffic): with toFQDNs allowed.test and
// rules.dns *.test, pod A resolves allowed.test through the proxy and
// connects to its address (not before); it resolves denied.test but its
// connection there is dropped; with rules.dns allowed.test only, the
// resolution of denied.test is refused. After the TTL the learned
// address is removed and the connection is dropped again.
func TestFQDNPolicy(t *testing.T) {
	e := newEnv(t)
	sub := e.node.Agent.System.Events().Subscribe(0)
	defer sub.Close()
	e.importPolicy(`matchPattern: "*.test"`)
	if err := e.connect(allowedIP); err == nil {
		t.Fatal("A reaches allowed.test's address before resolving it")
	}
	for _, network := range []string{"udp", "tcp"} {
		resp, err := e.resolve(network, "allowed.test")
		if ip, ok := answerIP(resp); err != nil || !ok || ip != allowedIP {
			t.Fatalf("%s: allowed.test = %v, %v; want %s", network, resp, err, allowedIP)
		}
		// The answer was held until the address was realised: the very
		// first connection passes.
		if err := e.connect(allowedIP); err != nil {
			t.Fatalf("after resolving allowed.test over %s: connect: %v", network, err)
		}
	}
	resp, err := e.resolve("udp", "denied.test")
	if ip, ok := answerIP(resp); err != nil || !ok || ip != deniedIP {
		t.Fatalf("denied.test under *.test = %v, %v; want %s", resp, err, deniedIP)
	}
	if err := e.connect(deniedIP); err == nil {
		t.Fatal("A reaches denied.test's address: toFQDNs selects only allowed.test")
	}
	entries, err := e.c.FQDNCache(context.Background(), int(e.epID), "")
	if err != nil || !hasEntry(entries, "allowed.test.", allowedIP) || !hasEntry(entries, "denied.test.", deniedIP) {
		t.Fatalf("GET /v1/fqdn/cache = %+v, %v", entries, err)
	}
	e.importPolicy(`matchName: allowed.test`)
	resp, err = e.resolve("udp", "denied.test")
	if err != nil || resp.Rcode != dns.RcodeRefused {
		t.Fatalf("denied.test under rules.dns allowed.test = %v, %v; want REFUSED", resp, err)
	}
	checkEvents(t, sub)
	// After the TTL (min TTL 0) the address is gone from the cache, the
	// ipcache and the policy map: the connection is dropped.
	testutil.Eventually(t, "learned addresses to expire", func() bool {
		es, err := e.c.FQDNCache(context.Background(), -1, "")
		return err == nil && len(es) == 0
	})
	// The ipcache hears of the expiry through the actors, after the
	// cache: it follows shortly (a CI run under load saw it lag the
	// check).
	testutil.EventuallyErr(t, "the expired address out of the ipcache", func() error {
		ipc, err := e.c.IPCache(context.Background())
		if err != nil {
			return err
		}
		for _, en := range ipc {
			if en.CIDR == netip.PrefixFrom(allowedIP, 32).String() {
				return fmt.Errorf("expired address still in the ipcache: %+v", en)
			}
		}
		return nil
	})
	if err := e.connect(allowedIP); err == nil {
		t.Fatal("A reaches allowed.test's address after its TTL")
	}
	expired := false
	for ev, ok := sub.TryNext(); ok; ev, ok = sub.TryNext() {
		expired = expired || (ev.Type == events.FQDNExpired && strings.Contains(ev.Message, "allowed.test."))
	}
	if !expired {
		t.Error("no fqdn-expired event for allowed.test.")
	}
	for verdict, least := range map[string]float64{"allowed": 3, "denied": 1} {
		if n := e.queries(verdict); n < least {
			t.Errorf("membrane_dns_proxy_queries_total{verdict=%q} = %v, want at least %v", verdict, n, least)
		}
	}
}

// queries reads membrane_dns_proxy_queries_total{verdict}.
func (e *env) queries(verdict string) float64 {
	mfs, err := e.metrics.Registry().Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "membrane_dns_proxy_queries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "verdict" && l.GetValue() == verdict {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func hasEntry(es []models.FQDNCacheEntry, name string, ip netip.Addr) bool {
	for _, e := range es {
		if e.FQDN == name && e.IP == ip.String() && e.TTL <= answerTTL+1 {
			return true
		}
	}
	return false
}

// checkEvents finds an allowed and a denied dns-query event.
func checkEvents(t *testing.T, sub *events.Subscription) {
	t.Helper()
	seen := map[string]bool{}
	for {
		ev, ok := sub.TryNext()
		if !ok {
			break
		}
		if ev.Type == events.DNSQuery && ev.DNS != nil {
			seen[ev.DNS.Verdict+" "+ev.DNS.Query] = true
		}
	}
	for _, want := range []string{"allowed allowed.test.", "denied denied.test."} {
		if !seen[want] {
			t.Errorf("no dns-query event %q in %v", want, seen)
		}
	}
}
