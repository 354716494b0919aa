package fqdn

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// resolve6 asks server:53 for name's records of type qtype from pod A
// over network (udp or tcp).
func (e *env) resolve6(network string, server netip.Addr, name string, qtype uint16) (*dns.Msg, error) {
	var resp *dns.Msg
	err := e.pod.Do(func() error {
		c := &dns.Client{Net: network, Timeout: 10 * time.Second}
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), qtype)
		var err error
		resp, _, err = c.Exchange(m, netip.AddrPortFrom(server, 53).String())
		return err
	})
	return resp, err
}

// answerIP6 returns the single AAAA address of an answer.
func answerIP6(m *dns.Msg) (netip.Addr, bool) {
	if m == nil || m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
		return netip.Addr{}, false
	}
	a, ok := m.Answer[0].(*dns.AAAA)
	if !ok {
		return netip.Addr{}, false
	}
	return netip.AddrFromSlice(a.AAAA)
}

// TestFQDNIPv6 (root, real traffic, dual-stack): pod A's DNS queries to
// an IPv6 resolver (UDP and TCP) go through the DNS proxy (the BPF
// programs assign them to its sockets at [::1], the original IPv6
// destination kept): allowed names are answered from the resolver's
// address, a name rules.dns does not allow is refused by the proxy.
// toFQDNs learns the AAAA answer: A reaches allowed.test's IPv6 address
// after resolving it (not before), not denied.test's; the IPv4 side
// goes on as before in the same pod.
func TestFQDNIPv6(t *testing.T) {
	e := newEnvDual(t)
	sub := e.node.Agent.System.Events().Subscribe(0)
	defer sub.Close()
	e.importPolicy(`matchPattern: "*.test"`)
	connect6 := func(ip netip.Addr) error { return testutil.Exchange(e.pod, ip, 80, 2*time.Second) }
	if err := connect6(allowedIP6); err == nil {
		t.Fatal("A reaches allowed.test's IPv6 address before resolving it")
	}
	for _, network := range []string{"udp", "tcp"} {
		resp, err := e.resolve6(network, dnsAddr6, "allowed.test", dns.TypeAAAA)
		if ip, ok := answerIP6(resp); err != nil || !ok || ip != allowedIP6 {
			t.Fatalf("%s to [%s]:53: allowed.test AAAA = %v, %v; want %s", network, dnsAddr6, resp, err, allowedIP6)
		}
		if err := connect6(allowedIP6); err != nil {
			t.Fatalf("after resolving allowed.test AAAA over %s: connect: %v", network, err)
		}
	}
	resp, err := e.resolve6("udp", dnsAddr6, "denied.test", dns.TypeAAAA)
	if ip, ok := answerIP6(resp); err != nil || !ok || ip != deniedIP6 {
		t.Fatalf("denied.test AAAA = %v, %v; want %s", resp, err, deniedIP6)
	}
	if err := connect6(deniedIP6); err == nil {
		t.Fatal("A reaches denied.test's IPv6 address: toFQDNs selects only allowed.test")
	}
	entries, err := e.c.FQDNCache(context.Background(), int(e.epID), "")
	if err != nil || !hasEntry(entries, "allowed.test.", allowedIP6) {
		t.Fatalf("GET /v1/fqdn/cache = %+v, %v; want allowed.test. -> %s", entries, err, allowedIP6)
	}
	// The proxy saw it: a dns-query event names the IPv6 server.
	server := netip.AddrPortFrom(dnsAddr6, 53).String()
	seen := false
	for ev, ok := sub.TryNext(); ok && !seen; ev, ok = sub.TryNext() {
		seen = ev.Type == events.DNSQuery && ev.DNS != nil && ev.DNS.Server == server && ev.DNS.Query == "allowed.test." && ev.DNS.Verdict == "allowed"
	}
	if !seen {
		t.Errorf("no allowed dns-query event for allowed.test. at %s", server)
	}

	// IPv4 in the same pod, through the same proxy.
	resp, err = e.resolve("udp", "allowed.test")
	if ip, ok := answerIP(resp); err != nil || !ok || ip != allowedIP {
		t.Fatalf("IPv4: allowed.test = %v, %v; want %s", resp, err, allowedIP)
	}
	if err := e.connect(allowedIP); err != nil {
		t.Fatalf("IPv4: after resolving allowed.test: %v", err)
	}

	e.importPolicy(`matchName: allowed.test`)
	for _, network := range []string{"udp", "tcp"} {
		resp, err = e.resolve6(network, dnsAddr6, "denied.test", dns.TypeAAAA)
		if err != nil || resp.Rcode != dns.RcodeRefused {
			t.Fatalf("%s: denied.test AAAA under rules.dns allowed.test = %v, %v; want REFUSED from the proxy", network, resp, err)
		}
	}
}
