package l7

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/service"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

// flowsRate is the flow log's rate limit on the flows node: far above
// what the cases make, below what TestFlows' last case makes in a second.
const flowsRate = 400

// newFlowsNode is a node with flow reports on (--flows), a small rate
// limit and two follower slots.
func newFlowsNode(t *testing.T) *node {
	t.Helper()
	n := newNode(t, "10.244.79.0/24", nodeOpts{agent: func(cfg *agent.Config) {
		cfg.Linux.Flows = true
		cfg.Flows.Rate, cfg.Flows.MaxFollowers = flowsRate, 2
		cfg.NodeName = "flows-node"
	}})
	httpServer(t, n.pods["b"])
	return n
}

func (n *node) flows(q url.Values) *models.FlowsResponse {
	n.t.Helper()
	r, err := n.c.Flows(context.Background(), q)
	if err != nil {
		n.t.Fatalf("GET /v1/flows?%s: %v", q.Encode(), err)
	}
	return r
}

// waitFlows waits (bounded) until the flows q selects satisfy ok.
func (n *node) waitFlows(what string, q url.Values, ok func([]models.Flow) bool) []models.Flow {
	n.t.Helper()
	var got []models.Flow
	testutil.Eventually(n.t, what, func() bool {
		got = n.flows(q).Flows
		return ok(got)
	})
	return got
}

// sentinel makes a new connection c -> b:80 and waits for its flows: the
// kernel's ring delivers in order, so every flow of an earlier connection
// is in the log once these are.
func (n *node) sentinel() {
	n.t.Helper()
	q := url.Values{"from-pod": {"default/c"}, "to-pod": {"default/b"}}
	before := len(n.flows(q).Flows)
	_, _, _ = n.pods["c"].request(n.pods["b"], "GET", "/sentinel", dropTimeout)
	n.waitFlows("the sentinel's flow", q, func(f []models.Flow) bool { return len(f) > before })
}

func identityOf(p *pod) uint32 {
	if p.ep.Identity == nil {
		return 0
	}
	return uint32(p.ep.Identity.ID)
}

// TestFlows runs a node's flow log through its cases in order (one node:
// its start is the expensive part).
func TestFlows(t *testing.T) {
	n := newFlowsNode(t)
	// The labels the agent patched in after the ADD: refresh the views.
	for _, p := range n.pods {
		ep, err := n.c.EndpointGet(context.Background(), fmt.Sprint(p.ep.ID))
		if err != nil {
			t.Fatal(err)
		}
		p.ep = ep
	}
	t.Run("forwarded", n.flowsForwarded)
	t.Run("denied", n.flowsDenied)
	t.Run("service", n.flowsService)
	t.Run("proxied", n.flowsProxied)
	t.Run("filters", n.flowsFilters)
	t.Run("follow", n.flowsFollow)
	t.Run("observe", n.flowsObserve)
	t.Run("metrics", n.flowsMetrics)
	t.Run("rate-limit", n.flowsRateLimit)
}

// flowsForwarded: one connection a -> b:80 (several packets each way) is
// one flow per endpoint that saw it: a's egress and b's ingress, both for
// its SYN, with both pods, labels and identities.
func (n *node) flowsForwarded(t *testing.T) {
	a, b := n.pods["a"], n.pods["b"]
	n.t = t
	if code, _, err := a.request(b, "GET", "/hello", okTimeout); err != nil || code != 200 {
		t.Fatalf("a -> b: %d %v", code, err)
	}
	n.sentinel()
	got := n.flows(url.Values{"from-pod": {"default/a"}, "to-pod": {"default/b"}, "port": {"80"}}).Flows
	if len(got) != 2 || got[0].Direction == got[1].Direction {
		t.Fatalf("flows of one connection: %+v, want one egress (a) and one ingress (b)", got)
	}
	for _, f := range got {
		if f.Verdict != "forwarded" || f.Type != "l3-l4" || f.Protocol != "TCP" || !slices.Equal(f.TCPFlags, []string{"SYN"}) ||
			f.Node != "flows-node" {
			t.Errorf("flow %+v, want forwarded TCP SYN on flows-node", f)
		}
		if s := f.Source; s.Pod != "a" || s.Namespace != "default" || s.Identity != identityOf(a) || !slices.Contains(s.Labels, "k8s:app=a") ||
			s.IP != a.ip.String() {
			t.Errorf("source %+v, want pod default/a, identity %d, label k8s:app=a", s, identityOf(a))
		}
		if d := f.Destination; d.Pod != "b" || d.Identity != identityOf(b) || !slices.Contains(d.Labels, "k8s:app=b") || d.Port != 80 {
			t.Errorf("destination %+v, want pod default/b:80, identity %d", d, identityOf(b))
		}
	}
}

// flowsDenied: with b admitting only a on port 80, c's connection is a
// drop flow naming the policy whose default deny dropped it; a's is
// forwarded, naming the policy that allowed it.
func (n *node) flowsDenied(t *testing.T) {
	n.t = t
	n.importPolicy(ingressL4)
	t.Cleanup(func() { n.t = t; n.deletePolicy("default/b-http") })
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	testutil.Eventually(t, "c's connection to b dropped", func() bool {
		_, _, err := c.request(b, "GET", "/", dropTimeout)
		return err != nil
	})
	got := n.waitFlows("c's drop flow", url.Values{"from-pod": {"default/c"}, "verdict": {"dropped"}}, func(f []models.Flow) bool { return len(f) > 0 })
	f := got[len(got)-1]
	if f.DropReason != "policy-denied" || f.Direction != "ingress" || !slices.Contains(f.Policies, "default/b-http") ||
		f.PolicyMatch != "default-deny" || f.Source.Identity != identityOf(c) || f.Destination.Pod != "b" {
		t.Errorf("drop flow %+v, want policy-denied at b's ingress by default/b-http (default-deny)", f)
	}
	if code, _, err := a.request(b, "GET", "/", okTimeout); err != nil || code != 200 {
		t.Fatalf("a -> b: %d %v", code, err)
	}
	got = n.waitFlows("a's allowed flow at b", url.Values{"from-pod": {"default/a"}, "to-pod": {"default/b"}}, func(f []models.Flow) bool {
		return slices.ContainsFunc(f, func(f models.Flow) bool { return f.Direction == "ingress" && f.PolicyMatch == "allow" })
	})
	for _, f := range got {
		if f.Direction == "ingress" && f.PolicyMatch == "allow" && !slices.Equal(f.Policies, []string{"default/b-http"}) {
			t.Errorf("allowed flow %+v, want policy default/b-http", f)
		}
	}
}

// flowsService: a's connection to a Service frontend is a flow to the
// backend (b) carrying the frontend and the Service's name.
func (n *node) flowsService(t *testing.T) {
	n.t = t
	fe := service.Frontend{Addr: netip.MustParseAddr("10.96.79.10"), Port: 8080, Proto: service.TCP}
	svc := service.Service{Frontend: fe, Name: "default/web", Kind: "ClusterIP",
		Backends: []service.Backend{{Addr: n.pods["b"].ip, Port: 80}}}
	if _, err := n.node.Agent.System.UpsertService(context.Background(), "test", svc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = n.node.Agent.System.DeleteService(context.Background(), "test", fe) })
	var code int
	testutil.Eventually(t, "a reaches the Service", func() bool {
		req, _ := http.NewRequest("GET", "http://10.96.79.10:8080/svc", nil)
		resp, err := n.pods["a"].client(dropTimeout, false).Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		code = resp.StatusCode
		return true
	})
	if code != 200 {
		t.Fatalf("a -> Service: %d", code)
	}
	got := n.waitFlows("the translated flow", url.Values{"from-pod": {"default/a"}, "verdict": {"translated"}}, func(f []models.Flow) bool { return len(f) > 0 })
	f := got[len(got)-1]
	if f.Service != "10.96.79.10:8080" || f.ServiceName != "default/web" || f.Destination.Pod != "b" || f.Destination.Port != 80 {
		t.Errorf("translated flow %+v, want frontend 10.96.79.10:8080 (default/web) to b:80", f)
	}
}

// flowsProxied: a connection redirected to the L7 proxy is a redirected
// flow carrying the HTTP request the proxy decided, and an l7 flow.
func (n *node) flowsProxied(t *testing.T) {
	n.t = t
	n.importPolicy(ingressPolicy)
	t.Cleanup(func() { n.t = t; n.deletePolicy("default/b-http") })
	n.l7Acked(n.pods["b"])
	n.expect(n.pods["a"], "GET", "/public", 200, "b GET /public")
	got := n.waitFlows("the redirected flow with its HTTP record", url.Values{"from-pod": {"default/a"}, "verdict": {"redirected"}},
		func(f []models.Flow) bool {
			return slices.ContainsFunc(f, func(f models.Flow) bool { return f.L7 != nil && f.L7.Path == "/public" })
		})
	for _, f := range got {
		if f.L7 != nil && f.L7.Path == "/public" && (f.L7.Method != "GET" || f.L7.Verdict != "allowed" || f.ProxyPort == 0 || f.Destination.Pod != "b") {
			t.Errorf("redirected flow %+v (L7 %+v), want GET /public allowed to b through a proxy port", f, f.L7)
		}
	}
	l7 := n.waitFlows("the l7 flow", url.Values{"from-pod": {"default/a"}, "verdict": {"allowed"}}, func(f []models.Flow) bool { return len(f) > 0 })
	if f := l7[len(l7)-1]; f.Type != "l7" || f.L7 == nil || f.L7.Path != "/public" || f.Destination.Pod != "b" {
		t.Errorf("l7 flow %+v", f)
	}
}

// flowsFilters: every filter through the API on the unix socket; bad
// values are JSON errors naming the parameter.
func (n *node) flowsFilters(t *testing.T) {
	n.t = t
	all := n.flows(nil).Flows
	if len(all) == 0 {
		t.Fatal("no flows")
	}
	for _, c := range []struct {
		q    url.Values
		keep func(models.Flow) bool
	}{
		{url.Values{"verdict": {"dropped"}}, func(f models.Flow) bool { return f.Verdict == "dropped" }},
		{url.Values{"protocol": {"tcp"}}, func(f models.Flow) bool { return f.Protocol == "TCP" }},
		{url.Values{"port": {"80"}}, func(f models.Flow) bool { return f.Source.Port == 80 || f.Destination.Port == 80 }},
		{url.Values{"to-label": {"app=b"}}, func(f models.Flow) bool { return slices.Contains(f.Destination.Labels, "k8s:app=b") }},
		{url.Values{"from-label": {"k8s:app=c"}}, func(f models.Flow) bool { return slices.Contains(f.Source.Labels, "k8s:app=c") }},
		{url.Values{"namespace": {"default"}}, func(f models.Flow) bool {
			return f.Source.Namespace == "default" || f.Destination.Namespace == "default"
		}},
		{url.Values{"to-pod": {"default/b"}, "from-pod": {"default/a"}}, func(f models.Flow) bool {
			return f.Source.Pod == "a" && f.Destination.Pod == "b"
		}},
	} {
		// The log may grow between the two reads: compare with a read
		// after the filtered one, filtered here, as a superset.
		got := n.flows(c.q).Flows
		after := n.flows(nil).Flows
		var want int
		for _, f := range after {
			if c.keep(f) {
				want++
			}
		}
		if len(got) == 0 || len(got) > want {
			t.Errorf("?%s: %d flows, want 1..%d", c.q.Encode(), len(got), want)
		}
		for _, f := range got {
			if !c.keep(f) {
				t.Errorf("?%s returned %+v", c.q.Encode(), f)
			}
		}
	}
	if got := n.flows(url.Values{"last": {"3"}}).Flows; len(got) != 3 {
		t.Errorf("last=3: %d flows", len(got))
	}
	if got := n.flows(url.Values{"since": {time.Now().Add(time.Hour).Format(time.RFC3339)}}).Flows; len(got) != 0 {
		t.Errorf("since an hour ahead: %d flows", len(got))
	}
	for _, q := range []string{"verdict=bogus", "port=0", "port=http", "last=-1", "since=yesterday", "protocol=gre",
		"namespace=Not_A_Namespace", "from-pod=a/b/c", "follow=perhaps", "colour=blue"} {
		v, _ := url.ParseQuery(q)
		_, err := n.c.Flows(context.Background(), v)
		key, _, _ := strings.Cut(q, "=")
		var ae *client.APIError
		if !errors.As(err, &ae) || ae.Status != 400 || ae.Code != "invalid-argument" || !strings.Contains(ae.Message, key) {
			t.Errorf("?%s: %v, want a 400 invalid-argument naming %q", q, err, key)
		}
	}
}

// flowsFollow: a follower gets the stored matches, then new flows; the
// third concurrent follower is refused (MaxFollowers 2).
func (n *node) flowsFollow(t *testing.T) {
	n.t = t
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := [2]chan models.Flow{make(chan models.Flow, 64), make(chan models.Flow, 64)}
	done := make(chan error, 2)
	q := url.Values{"from-pod": {"default/c"}, "to-pod": {"default/b"}, "last": {"1"}}
	for i := range 2 {
		go func() {
			done <- n.c.FollowFlows(ctx, q, func(f models.Flow) bool { got[i] <- f; return true })
		}()
	}
	// next waits for follower i's next flow.
	next := func(i int, what string) models.Flow {
		t.Helper()
		select {
		case f := <-got[i]:
			return f
		case err := <-done:
			t.Fatalf("follow ended: %v", err)
		case <-time.After(okTimeout):
			t.Fatalf("follower %d: no %s", i, what)
		}
		return models.Flow{}
	}
	// Both followers get the stored flow first.
	for i := range 2 {
		next(i, "stored flow")
	}
	if err := n.c.FollowFlows(ctx, q, func(models.Flow) bool { return true }); !client.IsCode(err, "too-many-streams") {
		t.Errorf("third follower: %v, want too-many-streams", err)
	}
	_, _, _ = n.pods["c"].request(n.pods["b"], "GET", "/follow", dropTimeout)
	for i := range 2 {
		if f := next(i, "new flow"); f.Source.Pod != "c" || f.Destination.Pod != "b" || !slices.Equal(f.TCPFlags, []string{"SYN"}) {
			t.Errorf("followed flow %+v, want c -> b's SYN", f)
		}
	}
	cancel()
	for range 2 {
		if err := <-done; err != nil {
			t.Errorf("follow after cancel: %v", err)
		}
	}
}

// flowsObserve: membranectl observe prints one line per flow, and -o
// json one JSON flow per line.
func (n *node) flowsObserve(t *testing.T) {
	n.t = t
	ctl := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(nodeharness.Bin("membranectl"), append([]string{"--socket", n.socket, "observe"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("membranectl observe %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	text := ctl("--from-pod", "default/a", "--to-pod", "default/b", "--verdict", "forwarded", "--protocol", "tcp", "--port", "80", "--last", "1")
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], " flows-node: default/a:") || !strings.Contains(lines[0], "-> default/b:80 (") ||
		!strings.Contains(lines[0], " TCP FORWARDED ") || !strings.Contains(lines[0], "SYN") {
		t.Errorf("observe text:\n%s\nwant one line 'flows-node: default/a:<port> (<id>) -> default/b:80 (<id>) TCP FORWARDED ... SYN'", text)
	}
	js := ctl("-o", "json", "--namespace", "default", "--verdict", "dropped", "--last", "2")
	lines = strings.Split(strings.TrimSpace(js), "\n")
	if len(lines) != 2 {
		t.Fatalf("observe -o json: %d lines, want 2:\n%s", len(lines), js)
	}
	for _, l := range lines {
		var f models.Flow
		if err := json.Unmarshal([]byte(l), &f); err != nil || f.Verdict != "dropped" {
			t.Errorf("observe -o json line %q: %v, want a dropped flow", l, err)
		}
	}
	out, err := exec.Command(nodeharness.Bin("membranectl"), "--socket", n.socket, "observe", "--verdict", "bogus").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "verdict") {
		t.Errorf("observe --verdict bogus: %v %s, want an error naming verdict", err, out)
	}
}

// flowsMetrics: the flows are counted per verdict, reason and namespace
// pair.
func (n *node) flowsMetrics(t *testing.T) {
	n.t = t
	for _, s := range []string{`membrane_flows_total{reason="",type="l3-l4",verdict="forwarded"}`,
		`membrane_flows_total{reason="policy-denied",type="l3-l4",verdict="dropped"}`,
		`membrane_flows_total{reason="",type="l7",verdict="allowed"}`,
		`membrane_flows_namespace_pairs_total{destination="default",source="default"}`} {
		if v := n.metric(s); v < 1 {
			t.Errorf("%s = %v, want at least 1", s, v)
		}
	}
}

// flowsRateLimit: more flows in a second than --flows-rate are counted,
// in GET /v1/flows' stats and GET /v1/status.
func (n *node) flowsRateLimit(t *testing.T) {
	n.t = t
	b := n.pods["b"]
	// UDP datagrams to distinct ports: each a new connection, reported
	// by a's egress and b's ingress.
	err := n.pods["a"].ns.Do(func() error {
		c, err := net.ListenUDP("udp4", nil)
		if err != nil {
			return err
		}
		defer c.Close()
		for i := range flowsRate {
			if _, err := c.WriteToUDP([]byte("x"), net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.ip, uint16(30000+i)))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "rate-limited flows counted", func() bool { return n.flows(nil).Stats.RateLimited > 0 })
	st, err := n.c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Flows == nil || st.Flows.RateLimited == 0 || !st.Flows.Enabled || st.Flows.Capacity != 4096 || st.Flows.Seen == 0 {
		t.Errorf("status flows %+v, want enabled, rate-limited counted, 4096 buffer", st.Flows)
	}
	out, _ := exec.Command(nodeharness.Bin("membranectl"), "--socket", n.socket, "status").CombinedOutput()
	if !strings.Contains(string(out), "flows over --flows-rate") {
		t.Errorf("membranectl status does not show the loss:\n%s", out)
	}
	_ = io.Discard
}
