// Package policybench measures policy propagation on the Linux datapath
// with real BPF programs: the time from PUT /v1/policy until every
// affected endpoint has realised it. Opt-in (make bench-policy), root.
package policybench

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// policyDoc selects every benchmark endpoint for ingress from any peer on
// one TCP port: a changed port changes every endpoint's policy.
func policyDoc(port int) []byte {
	return fmt.Appendf(nil, `{"apiVersion":"cilium.io/v2","kind":"CiliumNetworkPolicy",
"metadata":{"name":"bench","namespace":"default"},
"spec":{"endpointSelector":{"matchLabels":{"app":"bench"}},
"ingress":[{"toPorts":[{"ports":[{"port":"%d","protocol":"TCP"}]}]}]}}`, port)
}

// TestPolicyBench creates BENCH_ENDPOINTS endpoints (default 200) on
// host veths in a test netns, each with its BPF programs attached, then
// imports BENCH_ROUNDS policy changes affecting all of them and reports
// the time until all have realised each.
func TestPolicyBench(t *testing.T) {
	if os.Getenv("MEMBRANE_BENCH_POLICY") == "" {
		t.Skip("set MEMBRANE_BENCH_POLICY=1 (make bench-policy) to run the policy benchmark")
	}
	testutil.RequireRoot(t)
	n, rounds := envInt("BENCH_ENDPOINTS", 200), envInt("BENCH_ROUNDS", 5)
	node := nodeharness.New(t, nodeharness.Options{Prefix: "mbp-host", IPv4Range: "10.232.0.0/20", Log: logOut()})
	node.StartAgent(benchConfig)
	c := node.Client()
	nl := node.NS.Netlink(t)
	ctx := context.Background()

	create := make([]time.Duration, 0, n)
	for i := range n {
		ep, took := createEndpoint(t, ctx, c, nl, i)
		if ep.State != "ready" {
			t.Fatalf("endpoint %d: state %s", ep.ID, ep.State)
		}
		create = append(create, took)
	}
	report(t, "endpoint create with BPF load+attach (sync PUT)", create)

	prop := make([]time.Duration, 0, rounds)
	for r := range rounds {
		before := regenerations(t, ctx, c)
		start := time.Now()
		if _, err := c.PolicyImport(ctx, policyDoc(8000+r), "application/json"); err != nil {
			t.Fatal(err)
		}
		waitAll(t, ctx, c, before)
		prop = append(prop, time.Since(start))
	}
	report(t, fmt.Sprintf("PUT /v1/policy until %d endpoints realised it", n), prop)
	checkRealized(t, ctx, c, 8000+rounds-1)
}

func createEndpoint(t *testing.T, ctx context.Context, c *client.Client, nl *netlink.Handle, i int) (*models.Endpoint, time.Duration) {
	t.Helper()
	attrs := netlink.NewLinkAttrs()
	attrs.Name = fmt.Sprintf("lxcb%d", i)
	veth := &netlink.Veth{LinkAttrs: attrs, PeerName: fmt.Sprintf("pb%d", i)}
	if err := nl.LinkAdd(veth); err != nil {
		t.Fatalf("veth %s: %v", attrs.Name, err)
	}
	link, err := nl.LinkByName(attrs.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("bench-%d", i)
	ip, err := c.IPAMAllocate(ctx, "ipv4", "default/"+name)
	if err != nil {
		t.Fatal(err)
	}
	req := &models.EndpointChangeRequest{ContainerID: fmt.Sprintf("ctr-bench-%d", i), K8sNamespace: "default", K8sPodName: name,
		Labels:        []string{"k8s:io.kubernetes.pod.namespace=default", "k8s:app=bench"},
		Addressing:    &models.AddressPair{IPv4: ip.IPv4.IP},
		InterfaceName: attrs.Name, InterfaceIndex: int64(link.Attrs().Index), SyncBuild: true}
	start := time.Now()
	ep, err := c.EndpointCreate(ctx, "0", req)
	if err != nil {
		t.Fatalf("create endpoint %s: %v", name, err)
	}
	return ep, time.Since(start)
}

// regenerations returns each endpoint's completed regenerations.
func regenerations(t *testing.T, ctx context.Context, c *client.Client) map[int64]uint64 {
	t.Helper()
	eps, err := c.EndpointList(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := make(map[int64]uint64, len(eps))
	for _, ep := range eps {
		m[ep.ID] = ep.Regenerations
	}
	return m
}

// waitAll waits until every endpoint completed a regeneration after
// before and is ready.
func waitAll(t *testing.T, ctx context.Context, c *client.Client, before map[int64]uint64) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		eps, err := c.EndpointList(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		done := 0
		for _, ep := range eps {
			if ep.Regenerations > before[ep.ID] && ep.State == "ready" {
				done++
			}
		}
		if done == len(before) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d endpoints realised the policy", done, len(before))
		}
		time.Sleep(time.Millisecond)
	}
}

// checkRealized reads every endpoint's policy map back: it must hold the
// last policy's port.
func checkRealized(t *testing.T, ctx context.Context, c *client.Client, port int) {
	t.Helper()
	eps, err := c.EndpointList(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, ep := range eps {
		pol, err := c.EndpointPolicy(ctx, strconv.FormatInt(ep.ID, 10))
		if err != nil {
			t.Fatal(err)
		}
		ok := pol.RealizedIngressEnforced && slices.ContainsFunc(pol.Realized, func(e models.RealizedPolicyEntry) bool {
			return int(e.Port) == port && e.Direction == "ingress"
		})
		if !ok {
			t.Errorf("endpoint %d: realised policy %+v lacks port %d", ep.ID, pol.Realized, port)
		}
	}
}

func report(t *testing.T, what string, d []time.Duration) {
	slices.Sort(d)
	q := func(p float64) time.Duration { return d[min(len(d)-1, int(p*float64(len(d))))] }
	line := fmt.Sprintf("%s: n=%d median %v p90 %v p99 %v max %v", what, len(d),
		q(0.5).Round(10*time.Microsecond), q(0.9).Round(10*time.Microsecond), q(0.99).Round(10*time.Microsecond), d[len(d)-1].Round(10*time.Microsecond))
	t.Log(line)
	fmt.Println(line)
}

// logOut is where the agent logs: stderr with BENCH_LOG=1.
// benchConfig is the agent's configuration for the benchmark: the node
// harness's with the default garbage collection and no delete queue.
func benchConfig(cfg *agent.Config) {
	cfg.GCInterval, cfg.DeleteQueueDir, cfg.DeleteQueueInterval = 0, "", 0
}

func logOut() io.Writer {
	if os.Getenv("BENCH_LOG") != "" {
		return os.Stderr
	}
	return io.Discard
}
