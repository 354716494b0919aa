// Package policyscenario is the three-endpoint policy scenario of issue
// #4, written against pkg/clients/client only so that the same steps run on an
// in-process agent with the fake datapath (scenario_test.go) and, after
// the BPF datapath lands, on a real agent whose pods come from the CNI
// plugin: give Run an Env whose CreatePod makes real pods.
package policyscenario

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// Wait bounds every wait of the scenario.
var Wait = 15 * time.Second

// Namespace is where the scenario's pods live.
const Namespace = "default"

// Env is what the scenario runs against.
type Env struct {
	Client *client.Client
	// CreatePod creates a ready pod endpoint in ns with the given labels
	// ("k8s:app=a"); the scenario deletes nothing, so give it a fresh agent.
	CreatePod func(ctx context.Context, ns, name string, labels []string) (*models.Endpoint, error)
}

// APIPods returns a CreatePod that allocates an address and creates the
// endpoint through the API (sync): pods without interfaces, for the fake
// datapath.
func APIPods(c *client.Client) func(ctx context.Context, ns, name string, labels []string) (*models.Endpoint, error) {
	return func(ctx context.Context, ns, name string, labels []string) (*models.Endpoint, error) {
		ip, err := c.IPAMAllocate(ctx, "ipv4", ns+"/"+name)
		if err != nil {
			return nil, err
		}
		req := &models.EndpointChangeRequest{ContainerID: "ctr-" + name, K8sNamespace: ns, K8sPodName: name,
			Labels: append([]string{"k8s:" + policy.NamespaceLabel + "=" + ns}, labels...), Addressing: &models.AddressPair{IPv4: ip.IPv4.IP}, SyncBuild: true}
		return c.EndpointCreate(ctx, "0", req)
	}
}

// The policies of the scenario: A may reach B on TCP 8080.
const (
	CNPAllowAToB = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: a-to-b
  namespace: default
  labels:
    scenario: policy
spec:
  endpointSelector:
    matchLabels:
      app: b
  ingress:
  - fromEndpoints:
    - matchLabels:
        k8s:app: a
    toPorts:
    - ports:
      - port: "8080"
        protocol: TCP
`
	KNPAllowAToB = `{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
 "metadata": {"name": "knp-a-to-b", "namespace": "default", "labels": {"scenario": "policy"}},
 "spec": {"podSelector": {"matchLabels": {"app": "b"}},
  "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "a"}}}], "ports": [{"port": 8080}]}]}}`
	CNPEgressCIDR = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: a-egress
spec:
  endpointSelector:
    matchLabels:
      app: a
  egress:
  - toCIDRSet:
    - cidr: 192.0.2.0/24
      except: [192.0.2.128/25]
  - toEntities: [host]
`
)

// Pods are the scenario's three endpoints.
type Pods struct{ A, B, C *models.Endpoint }

// Realized returns an endpoint's realised policy as a MapState (from the
// datapath's policy map, through GET /v1/endpoint/{id}/policy).
func Realized(ctx context.Context, c *client.Client, id int64) (*policy.MapState, error) {
	ep, err := c.EndpointPolicy(ctx, fmt.Sprint(id))
	if err != nil {
		return nil, err
	}
	if ep.RealizedError != "" {
		return nil, fmt.Errorf("endpoint %d: realized policy: %s", id, ep.RealizedError)
	}
	keys := make([]policy.Key, 0, len(ep.Realized))
	for _, e := range ep.Realized {
		k, err := keyOf(e.PolicyEntry)
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	m := policy.NewMapState(0, ep.RealizedIngressEnforced, ep.RealizedEgressEnforced, keys)
	for _, e := range ep.RealizedCIDR {
		k, err := keyOf(models.PolicyEntry{Port: e.Port, Protocol: e.Protocol, Direction: e.Direction})
		if err != nil {
			return nil, err
		}
		p, err := netip.ParsePrefix(e.CIDR)
		if err != nil {
			return nil, fmt.Errorf("endpoint %d: realized cidr entry: %w", id, err)
		}
		m.CIDR = append(m.CIDR, policy.CIDREntry{Dir: k.Dir, Proto: k.Proto, Port: k.Port, Prefix: p, Allow: e.Allow})
	}
	return m, nil
}

func keyOf(e models.PolicyEntry) (policy.Key, error) {
	k := policy.Key{Identity: identity.NumericIdentity(e.Identity), Port: e.Port}
	switch e.Protocol {
	case "ANY":
	case "TCP":
		k.Proto = policy.ProtoTCP
	case "UDP":
		k.Proto = policy.ProtoUDP
	case "SCTP":
		k.Proto = policy.ProtoSCTP
	case "ICMP", "ICMPv6":
		k.Proto = policy.ProtoICMP
		if e.Protocol == "ICMPv6" {
			k.Proto = policy.ProtoICMPv6
		}
		if e.ICMPType != "" {
			t, err := strconv.ParseUint(e.ICMPType, 10, 8)
			if err != nil {
				return k, fmt.Errorf("icmp-type %q: %w", e.ICMPType, err)
			}
			k.Port = policy.ICMPTypePort(uint8(t))
		}
	default:
		return k, fmt.Errorf("unexpected protocol %q", e.Protocol)
	}
	if e.Direction == "egress" {
		k.Dir = policy.Egress
	}
	return k, nil
}

// WaitRealized waits until the endpoint's realised policy satisfies cond.
func WaitRealized(tb testing.TB, c *client.Client, id int64, what string, cond func(*policy.MapState) bool) *policy.MapState {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Wait)
	defer cancel()
	var last *policy.MapState
	var lastErr error
	for {
		m, err := Realized(ctx, c, id)
		if err == nil && cond(m) {
			return m
		}
		last, lastErr = m, err
		select {
		case <-ctx.Done():
			tb.Fatalf("endpoint %d: timed out waiting for %s; last realised %+v, err %v", id, what, last, lastErr)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func identityOf(tb testing.TB, c *client.Client, id int64) identity.NumericIdentity {
	tb.Helper()
	ep, err := c.EndpointGet(context.Background(), fmt.Sprint(id))
	if err != nil || ep.Identity == nil {
		tb.Fatalf("endpoint %d: %v (identity %v)", id, err, ep)
	}
	return identity.NumericIdentity(ep.Identity.ID)
}

func regenerations(tb testing.TB, c *client.Client, id int64) uint64 {
	tb.Helper()
	ep, err := c.EndpointGet(context.Background(), fmt.Sprint(id))
	if err != nil {
		tb.Fatal(err)
	}
	return ep.Regenerations
}

func allowAll(m *policy.MapState) bool {
	return !m.Enforced(policy.Ingress) && !m.Enforced(policy.Egress)
}

// Setup creates the pods A (app=a), B (app=b), C (app=c); each also
// carries instance=<x>, so that C relabelled to app=a still has an
// identity of its own (a new one, which B's policy must learn).
func Setup(tb testing.TB, env Env) Pods {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Wait)
	defer cancel()
	var p Pods
	for _, x := range []struct {
		dst  **models.Endpoint
		name string
	}{{&p.A, "a"}, {&p.B, "b"}, {&p.C, "c"}} {
		ep, err := env.CreatePod(ctx, Namespace, "pod-"+x.name, []string{"k8s:app=" + x.name, "k8s:instance=" + x.name})
		if err != nil {
			tb.Fatalf("create pod %s: %v", x.name, err)
		}
		*x.dst = ep
	}
	return p
}

// ipOf returns the endpoint's IPv4 /32.
func ipOf(tb testing.TB, ep *models.Endpoint) netip.Prefix {
	tb.Helper()
	if ep.Addressing == nil {
		tb.Fatalf("endpoint %d has no address", ep.ID)
	}
	a, err := netip.ParseAddr(ep.Addressing.IPv4)
	if err != nil {
		tb.Fatal(err)
	}
	return netip.PrefixFrom(a, 32)
}
