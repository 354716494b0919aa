package fqdn

import (
	"context"
	"net/url"
	"slices"
	"testing"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestFQDNFlows: a query through the DNS proxy is a redirected flow
// carrying the query and its answer, and a dns flow; the connection to
// the learned address is a forwarded flow with the address's identity.
// (It names no policy: toFQDNs selectors select by learned name, which
// the user-space re-evaluation of the rules does not follow.)
func TestFQDNFlows(t *testing.T) {
	e := newEnvOpts(t, false, nil, func(cfg *agent.Config) { cfg.Linux.Flows = true })
	e.importPolicy(`matchPattern: "*.test"`)
	resp, err := e.resolve("udp", "allowed.test")
	if ip, ok := answerIP(resp); err != nil || !ok || ip != allowedIP {
		t.Fatalf("allowed.test = %v, %v; want %s", resp, err, allowedIP)
	}
	flows := func(q url.Values) []models.Flow {
		t.Helper()
		r, err := e.c.Flows(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		return r.Flows
	}
	var redirected []models.Flow
	testutil.Eventually(t, "the query's redirected flow with its DNS record", func() bool {
		redirected = flows(url.Values{"verdict": {"redirected"}, "port": {"53"}})
		return slices.ContainsFunc(redirected, func(f models.Flow) bool { return f.DNS != nil })
	})
	for _, f := range redirected {
		if f.DNS == nil {
			continue
		}
		if f.DNS.Query != "allowed.test." || f.DNS.Verdict != "allowed" || !slices.Contains(f.DNS.IPs, allowedIP.String()) ||
			f.Destination.IP != dnsAddr.String() || f.Source.Pod != "a" || f.Protocol != "UDP" || f.ProxyPort != 10053 {
			t.Errorf("redirected flow %+v (DNS %+v), want a's UDP query for allowed.test. to %s through port 10053", f, f.DNS, dnsAddr)
		}
	}
	if d := flows(url.Values{"verdict": {"allowed"}, "protocol": {"udp"}}); len(d) == 0 || d[len(d)-1].Type != "dns" {
		t.Errorf("dns flows %+v, want one", d)
	}
	if err := e.connect(allowedIP); err != nil {
		t.Fatalf("connect: %v", err)
	}
	var fwd []models.Flow
	testutil.Eventually(t, "the connection's flow", func() bool {
		fwd = flows(url.Values{"verdict": {"forwarded"}, "port": {"80"}})
		return len(fwd) > 0
	})
	if f := fwd[len(fwd)-1]; f.Destination.IP != allowedIP.String() || f.Destination.Identity == 0 || f.Source.Pod != "a" {
		t.Errorf("forwarded flow %+v, want a's to %s with its identity", f, allowedIP)
	}
	// The toFQDNs rule is what allowed it: the flow names its policy.
	if f := fwd[len(fwd)-1]; !slices.Equal(f.Policies, []string{"default/fqdn"}) || f.PolicyMatch != "allow" {
		t.Errorf("forwarded flow's policies %v (%s), want [default/fqdn] (allow): the toFQDNs rule allowed it", f.Policies, f.PolicyMatch)
	}
}
