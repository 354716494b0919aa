package multinode

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestHealthEndpointAcrossNodes is cross-node health of the nodes'
// health endpoints (issue 37), in kvstore mode on a real etcd: each agent
// publishes its health endpoint's addresses in its node record, the
// other agent enters them into its ipcache with the identity health and
// probes them (ICMP echo, HTTP to the endpoint's responder on 4240)
// beside the node's addresses; GET /v1/health shows both with latencies.
// A pod whose only egress rule is `toEntities: [health]` reaches the
// other node's health endpoint and not its pod. The remote health
// endpoint made unreachable (a blackhole rule on its node) shows the node
// degraded, its health endpoint failing and its addresses still ok, in
// the matrix, the status, an event and the metrics within seconds, and
// ok again once the rule is gone.
func TestHealthEndpointAcrossNodes(t *testing.T) {
	for i, mode := range []string{"native", "tunnel"} {
		t.Run(mode, func(t *testing.T) {
			c := newKvClusterOpts(t, mode, 2, 73+i, false, func(c *cluster) {
				c.args = []string{"--enable-health=true", "--health-node-interval", "300ms"}
			})
			testHealthEndpointAcrossNodes(t, c, true)
		})
	}
}

// TestHealthEndpointAcrossNodesKubernetes is TestHealthEndpointAcrossNodes
// in Kubernetes mode on a real kube-apiserver (tunnel mode): each agent
// publishes its health endpoint's addresses in its own Node's
// annotations (network.membrane.io/ipv4-health-ip, ipv6-health-ip), the
// other reads them from the Node; the matrix, the unreachable health
// endpoint and the recovery as in kvstore mode (the health entity's
// policy case runs in kvstore mode only).
func TestHealthEndpointAcrossNodesKubernetes(t *testing.T) {
	c, cs := newKubeCluster(t, "tunnel", 2, 75, []string{"--enable-health=true", "--health-node-interval", "300ms"})
	testHealthEndpointAcrossNodes(t, c, false)
	for _, nd := range c.nodes {
		n, err := cs.CoreV1().Nodes().Get(context.Background(), nd.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s's annotations: %v", nd.name, n.Annotations)
	}
}

func testHealthEndpointAcrossNodes(t *testing.T, c *cluster, entity bool) {
	a, b := c.nodes[0], c.nodes[1]
	healthIPs := map[string][]netip.Addr{}
	for _, nd := range c.nodes {
		testutil.EventuallyErr(t, nd.name+"'s health endpoint ok", func() error {
			st, err := nd.api.Status(context.Background())
			if err != nil || st.Health == nil || st.Health.State != "ok" || st.Health.IP == "" || st.Health.IPv6 == "" {
				return fmt.Errorf("health %+v, %v", st.Health, err)
			}
			healthIPs[nd.name] = []netip.Addr{netip.MustParseAddr(st.Health.IP), netip.MustParseAddr(st.Health.IPv6)}
			return nil
		})
	}
	matrix := func(nd *node) map[string]models.NodeHealth {
		h, err := nd.api.Health(context.Background())
		if err != nil {
			t.Fatalf("%s: GET /v1/health: %v", nd.name, err)
		}
		out := map[string]models.NodeHealth{}
		for _, n := range h.Nodes {
			out[n.Name] = n
		}
		return out
	}
	for _, nd := range c.nodes {
		other := a
		if nd == a {
			other = b
		}
		testutil.EventuallyErr(t, nd.name+" seeing "+other.name+"'s published health endpoint, as health, answering", func() error {
			ns, err := nd.api.Nodes(context.Background())
			if err != nil {
				return err
			}
			want := []string{healthIPs[other.name][0].String(), healthIPs[other.name][1].String()}
			if !slices.ContainsFunc(ns, func(n models.Node) bool { return n.Name == other.name && slices.Equal(n.HealthIPs, want) }) {
				return fmt.Errorf("GET /v1/nodes: %s", jsonString(ns))
			}
			ipc, err := nd.api.IPCache(context.Background())
			if err != nil {
				return err
			}
			for _, ip := range healthIPs[other.name] {
				cidr := netip.PrefixFrom(ip, ip.BitLen()).String()
				if !slices.ContainsFunc(ipc, func(e models.IPCacheEntry) bool { return e.CIDR == cidr && e.Identity == 4 }) {
					return fmt.Errorf("ipcache has no %s with identity health", cidr)
				}
			}
			n := matrix(nd)[other.name]
			if n.State != "ok" || len(n.Addresses) != 2 || len(n.HealthEndpoint) != 2 {
				return fmt.Errorf("%+v", n)
			}
			for _, ad := range append(slices.Clone(n.Addresses), n.HealthEndpoint...) {
				if !ad.ICMP.OK || !ad.HTTP.OK || ad.ICMP.LatencyMS <= 0 || ad.HTTP.LatencyMS <= 0 {
					return fmt.Errorf("%s %s: %+v", other.name, ad.IP, ad)
				}
			}
			return nil
		})
	}
	h, _ := a.api.Health(context.Background())
	t.Logf("%s's view: %s", a.name, jsonString(h.Nodes))

	if entity {
		t.Run("health-entity", func(t *testing.T) { healthEntityEgress(t, a, b, healthIPs[b.name]) })
	}

	// b's health endpoint made unreachable: a blackhole rule for its
	// addresses in b's host netns (the probes reach b, not the endpoint).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	evs := make(chan events.Event, 16)
	go func() {
		_ = a.api.Events(ctx, url.Values{"type": {string(events.NodeHealth)}}, func(e events.Event) bool {
			select {
			case evs <- e:
			default:
			}
			return true
		})
	}()
	time.Sleep(200 * time.Millisecond) // the stream is subscribed
	rules := [][]string{
		{"ip", "-4", "rule", "add", "to", healthIPs[b.name][0].String() + "/32", "blackhole", "pref", "7"},
		{"ip", "-6", "rule", "add", "to", healthIPs[b.name][1].String() + "/128", "blackhole", "pref", "7"},
	}
	for _, r := range rules {
		if out, err := b.ns.Exec(r[0], r[1:]...); err != nil {
			t.Fatalf("%v: %v\n%s", r, err, out)
		}
	}
	removeRules := func() {
		for _, r := range rules {
			del := slices.Clone(r)
			del[3] = "del"
			_, _ = b.ns.Exec(del[0], del[1:]...)
		}
	}
	defer removeRules()
	down := time.Now()
	testutil.EventuallyErr(t, a.name+" seeing "+b.name+"'s health endpoint unreachable", func() error {
		n := matrix(a)[b.name]
		if n.State != "degraded" || len(n.HealthEndpoint) != 2 {
			return fmt.Errorf("%+v", n)
		}
		for _, ad := range n.HealthEndpoint {
			if ad.ICMP.OK || ad.HTTP.OK {
				return fmt.Errorf("health endpoint %s still answers: %+v", ad.IP, ad)
			}
		}
		for _, ad := range n.Addresses {
			if !ad.ICMP.OK || !ad.HTTP.OK {
				return fmt.Errorf("node address %s fails: %+v", ad.IP, ad)
			}
		}
		return nil
	})
	t.Logf("%s's health endpoint unreachable in %s's view %s after the rule", b.name, a.name, time.Since(down).Round(time.Millisecond))
	st, err := a.api.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Health == nil || !slices.Equal(st.Health.FailingNodes, []string{b.name}) {
		t.Errorf("status health %+v: want %s failing", st.Health, b.name)
	}
	for _, probe := range []string{"health-icmp", "health-http"} {
		series := fmt.Sprintf(`membrane_node_health_reachable{node=%q,probe=%q}`, b.name, probe)
		if v := agentMetric(t, a, series); v != "0" {
			t.Errorf("%s = %q, want 0", series, v)
		}
	}
	if v := agentMetric(t, a, fmt.Sprintf(`membrane_node_health_reachable{node=%q,probe="http"}`, b.name)); v != "1" {
		t.Errorf("node address probe metric %q, want 1", v)
	}
	var ev *events.Event
	wait := time.After(10 * time.Second)
	for ev == nil {
		select {
		case e := <-evs:
			if e.Node == b.name && e.State == "degraded" && strings.Contains(e.Message, "health endpoint") {
				ev = &e
			}
		case <-wait:
			t.Fatalf("no node-health event for %s's health endpoint", b.name)
		}
	}
	t.Logf("event: %s", ev.Message)

	removeRules()
	testutil.EventuallyErr(t, a.name+" seeing "+b.name+" ok again", func() error {
		if n := matrix(a)[b.name]; n.State != "ok" {
			return fmt.Errorf("%+v", n)
		}
		if v := agentMetric(t, a, fmt.Sprintf(`membrane_node_health_reachable{node=%q,probe="health-http"}`, b.name)); v != "1" {
			return fmt.Errorf("health-http metric %q", v)
		}
		return nil
	})
}

// healthEntityDoc lets app=hprobe send only to the health entity.
const healthEntityDoc = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: to-health
  namespace: default
spec:
  endpointSelector:
    matchLabels:
      app: hprobe
  egress:
  - toEntities:
    - health
`

// healthEntityEgress: a pod on a whose only egress rule is toEntities
// health gets an answer from b's health endpoint (both families) and
// cannot reach a pod on b: the remote health endpoint is the health
// entity in a's ipcache.
func healthEntityEgress(t *testing.T, a, b *node, bHealth []netip.Addr) {
	pa, pb := a.addPod("hprobe"), b.addPod("htarget")
	labelPod(t, pa, "k8s:app=hprobe")
	if _, err := a.api.PolicyImport(context.Background(), []byte(healthEntityDoc), ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = a.api.PolicyDelete(context.Background(), "to-health") })
	for _, ip := range bHealth {
		testutil.EventuallyErr(t, "hprobe to "+b.name+"'s health endpoint "+ip.String(), func() error { return httpHello(pa, ip) })
	}
	port := int(nextPort.Add(1))
	testutil.EchoServer(t, pb.ns, pb.ip4, port)
	if err := testutil.Exchange(pa.ns, pb.ip4, port, 2*time.Second); err == nil {
		t.Fatalf("hprobe reached %s's pod %s with only toEntities: health", b.name, pb.ip4)
	}
}

// httpHello GETs /hello of the health responder at ip from p's netns.
func httpHello(p *pod, ip netip.Addr) error {
	return p.ns.Do(func() error {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip.String(), "4240"), 2*time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.WriteString(conn, "GET /hello HTTP/1.1\r\nHost: health\r\nConnection: close\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
}

// agentMetric is the value of the sample named exactly series in nd's
// /metrics ("" if absent).
func agentMetric(t *testing.T, nd *node, series string) string {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", nd.hn.Socket)
	}}}
	resp, err := hc.Get("http://agent/metrics")
	if err != nil {
		t.Fatalf("%s: GET /metrics: %v", nd.name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
