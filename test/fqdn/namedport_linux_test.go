package fqdn

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// dnsNamedPolicy: A may send DNS over UDP to the pods labelled app=dns
// on their port named dns, through the DNS proxy, for names matching
// allow*.test.
const dnsNamedPolicy = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: dns-named, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: a}}
  egress:
  - toEndpoints: [{matchLabels: {app: dns}}]
    toPorts:
    - ports: [{port: dns, protocol: UDP}]
      rules:
        dns: [{matchPattern: "allow*.test"}]
`

// TestDNSNamedPort (root, real traffic): a DNS server pod declares UDP
// 5353 as dns; pod A's rules.dns on port: dns (no number anywhere in the
// policy) redirects A's queries to that pod's 5353 to the DNS proxy,
// which answers allowed.test (the server's answer) and refuses
// denied.test, which the server would answer.
func TestDNSNamedPort(t *testing.T) {
	e := newEnv(t)
	sub := e.node.Agent.System.Events().Subscribe(0)
	defer sub.Close()
	ports, err := policy.NewNamedPorts([]policy.NamedPort{{Name: "dns", Proto: policy.ProtoUDP, Port: 5353}})
	if err != nil {
		t.Fatal(err)
	}
	e.node.Agent.Server.SetLabeler(func(ctx context.Context, spec *endpoint.Endpoint) (labels.Labels, policy.NamedPorts, error) {
		if spec.PodName == "dns" {
			return spec.Labels, ports, nil
		}
		return spec.Labels, spec.NamedPorts, nil
	})
	p := e.node.AddPod("dns")
	ep, err := e.c.EndpointPatchLabels(context.Background(), "container-id:"+p.RT.ContainerID, []string{"k8s:app=dns"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ep.Identity == nil {
		t.Fatalf("dns pod's endpoint %+v: no identity", ep)
	}
	server := netip.AddrPortFrom(p.IPv4, 5353)
	dnsServerAt(t, p.NS, false, server)
	if resp, err := resolveAt(e.pod, "udp", "denied.test", server); err != nil || resp.Rcode != dns.RcodeSuccess {
		t.Fatalf("denied.test without a policy = %v, %v; want the server's answer", resp, err)
	}

	if _, err := e.c.PolicyImport(context.Background(), []byte(dnsNamedPolicy), "application/yaml"); err != nil {
		t.Fatal(err)
	}
	e.settle()
	view, err := e.c.EndpointPolicy(context.Background(), strconv.FormatInt(e.epID, 10))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(view.ComputedDNS, func(d models.DNSPolicyEntry) bool {
		return d.Port == 5353 && d.Protocol == "UDP" && int64(d.Identity) == ep.Identity.ID
	}) {
		t.Errorf("A's computed-dns %+v: no UDP 5353 entry towards the dns pod (identity %d)", view.ComputedDNS, ep.Identity.ID)
	}
	resp, err := resolveAt(e.pod, "udp", "allowed.test", server)
	if ip, ok := answerIP(resp); err != nil || !ok || ip != allowedIP {
		t.Fatalf("allowed.test = %v, %v; want %s", resp, err, allowedIP)
	}
	resp, err = resolveAt(e.pod, "udp", "denied.test", server)
	if err != nil || resp.Rcode != dns.RcodeRefused {
		t.Fatalf("denied.test = %v, %v; want REFUSED by the proxy", resp, err)
	}
	checkEvents(t, sub) // the proxy saw both queries
}

// fqdnNamedPolicy: A may resolve *.test through the DNS proxy and reach
// allowed.test's addresses on the port named ext-web, which only the
// cluster's pods declare (an address outside declares no ports).
const fqdnNamedPolicy = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: fqdn-named, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: a}}
  egress:
  - toEntities: [world]
    toPorts:
    - ports: [{port: "53", protocol: ANY}]
      rules:
        dns: [{matchPattern: "*.test"}]
  - toFQDNs: [{matchName: allowed.test}]
    toPorts: [{ports: [{port: ext-web, protocol: TCP}]}]
`

// TestFQDNNamedPort (root, real traffic): a toFQDNs peer on a named port
// resolves, as in Cilium, to the numbers the cluster's pods give the
// name: pod srv81 names TCP 81 ext-web, so A reaches allowed.test's
// learned address on 81 only; pod srv80 naming 80 adds 80; srv81 going
// leaves 80 only.
func TestFQDNNamedPort(t *testing.T) {
	e := newEnv(t)
	testutil.EchoServer(t, e.world, allowedIP, 81)
	extWeb := map[string]uint16{"srv80": 80, "srv81": 81}
	e.node.Agent.Server.SetLabeler(func(ctx context.Context, spec *endpoint.Endpoint) (labels.Labels, policy.NamedPorts, error) {
		if n, ok := extWeb[spec.PodName]; ok {
			ports, err := policy.NewNamedPorts([]policy.NamedPort{{Name: "ext-web", Proto: policy.ProtoTCP, Port: n}})
			return spec.Labels, ports, err
		}
		return spec.Labels, spec.NamedPorts, nil
	})
	srv81 := e.node.AddPod("srv81")
	if _, err := e.c.PolicyImport(context.Background(), []byte(fqdnNamedPolicy), "application/yaml"); err != nil {
		t.Fatal(err)
	}
	e.settle()
	resp, err := e.resolve("udp", "allowed.test")
	if ip, ok := answerIP(resp); err != nil || !ok || ip != allowedIP {
		t.Fatalf("allowed.test = %v, %v; want %s", resp, err, allowedIP)
	}
	reaches := func(what string, want map[int]bool) {
		t.Helper()
		testutil.EventuallyErr(t, what, func() error {
			for _, port := range []int{80, 81} {
				if got := testutil.Exchange(e.pod, allowedIP, port, 2*time.Second) == nil; got != want[port] {
					return fmt.Errorf("A -> %s:%d reached = %v, want %v", allowedIP, port, got, want[port])
				}
			}
			return nil
		})
	}
	reaches("ext-web is 81", map[int]bool{81: true})
	e.node.AddPod("srv80")
	reaches("ext-web is 80 and 81", map[int]bool{80: true, 81: true})
	if err := e.node.DelRT(context.Background(), srv81.RT); err != nil {
		t.Fatal(err)
	}
	reaches("ext-web is 80", map[int]bool{80: true})
}
