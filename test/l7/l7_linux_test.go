package l7

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// ingressPolicy lets app=a GET /public on app=b's port 80 (L7).
const ingressPolicy = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: b-http, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: b}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: a}}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
      rules:
        http: [{method: GET, path: /public}]
`

// ingressL4 is the same rule without L7 rules.
const ingressL4 = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: b-http, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: b}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: a}}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
`

// egressPolicy lets app=a GET /public on app=b's port 80 (L7).
const egressPolicy = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: a-http, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: a}}
  egress:
  - toEndpoints: [{matchLabels: {app: b}}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
      rules:
        http: [{method: GET, path: /public}]
`

// expect checks from's request to B:80 (a 403 with "Access denied"
// comes from the proxy, a 200 from B).
func (n *node) expect(from *pod, method, path string, want int, body string) {
	n.t.Helper()
	code, got, err := from.request(n.pods["b"], method, path, okTimeout)
	if err != nil || code != want || !strings.Contains(got, body) {
		n.t.Errorf("pod %s %s %s to b:80 = %d %q %v, want %d %q", from.name, method, path, code, got, err, want, body)
	}
}

func (n *node) enforced() {
	n.t.Helper()
	a := n.pods["a"]
	n.expect(a, "GET", "/public", 200, "b GET /public")
	n.expect(a, "GET", "/private", 403, "Access denied")
	n.expect(a, "POST", "/public", 403, "Access denied")
}

func (n *node) cGetsNothing() {
	n.t.Helper()
	if code, _, err := n.pods["c"].request(n.pods["b"], "GET", "/public", dropTimeout); err == nil {
		n.t.Errorf("pod c reached b:80 (status %d), want its connection dropped", code)
	}
}

// TestHTTPIngress: B's ingress policy lets A GET /public only; the BPF
// programs redirect A's plain requests to the proxy, which answers 403
// to /private and POST; C gets nothing. Operators see the L7 entries
// and the proxy port in the endpoint's policy view, the acknowledged
// version there and in GET /v1/actors, the denied request as an
// l7-access event with both identities and in /metrics. The proxy
// SIGKILLed is restarted and enforces again; the L7 rule replaced by
// an L4 rule restores plain L4 behaviour.
func TestHTTPIngress(t *testing.T) {
	n := newNode(t, "10.244.71.0/24", nodeOpts{})
	a, b := n.pods["a"], n.pods["b"]
	httpServer(t, b)
	n.expect(a, "GET", "/private", 200, "b GET /private") // no policy yet

	n.importPolicy(ingressPolicy)
	view := n.l7Acked(b)
	if len(view.ComputedL7) != 1 || view.ComputedL7[0].Port != 80 || view.ComputedL7[0].HTTP[0].Path != "/public" {
		t.Errorf("policy view computed-l7 = %+v", view.ComputedL7)
	}
	n.enforced()
	n.cGetsNothing()

	ev, ok := n.waitEvent(func(ev events.Event) bool {
		return ev.Type == events.L7Access && ev.L7 != nil && ev.L7.Path == "/private" && ev.L7.Verdict == "denied"
	})
	if ok && (ev.Endpoint != uint16(b.ep.ID) || ev.L7.SrcIdentity != uint32(a.ep.Identity.ID) || ev.L7.DstIdentity != uint32(b.ep.Identity.ID) ||
		ev.L7.Direction != "ingress" || ev.L7.Method != "GET" || !strings.HasPrefix(ev.L7.Src, a.ip.String()+":")) {
		t.Errorf("l7-access event %+v (l7 %+v), want b's ingress denying a", ev, ev.L7)
	}
	if v := n.metric(`membrane_l7_requests_total{direction="ingress",protocol="http",verdict="denied"}`); v < 2 {
		t.Errorf("denied requests in /metrics: %v, want at least 2", v)
	}
	row := n.proxyRow()
	if row.State != "running" || row.L7Proxy == nil || row.L7Proxy.Port != 15001 || !slicesHasAcked(row, int64(b.ep.ID)) {
		t.Errorf("l7-proxy row %+v (proxy %+v), want running with b's version acknowledged", row, row.L7Proxy)
	}

	pid := row.L7Proxy.PID
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the proxy restarted", func() bool { r := n.proxyRow(); return r.L7Proxy.PID != 0 && r.L7Proxy.PID != pid })
	testutil.Eventually(t, "the restarted proxy serving a's GET /public", func() bool {
		code, _, err := a.request(b, "GET", "/public", dropTimeout)
		return err == nil && code == 200
	})
	n.enforced()
	if r := n.proxyRow(); r.Restarts < 1 {
		t.Errorf("proxy row after SIGKILL %+v, want a restart counted", r)
	}

	n.importPolicy(ingressL4)
	testutil.Eventually(t, "b's L7 entries withdrawn", func() bool {
		v, err := n.c.EndpointPolicy(context.Background(), fmt.Sprint(b.ep.ID))
		if err != nil || len(v.ComputedL7) != 0 || len(v.Realized) == 0 {
			return false
		}
		for _, e := range v.Realized {
			if e.ProxyPort != 0 {
				return false
			}
		}
		return true
	})
	n.expect(a, "GET", "/private", 200, "b GET /private")
	n.expect(a, "POST", "/public", 200, "b POST /public")
	n.cGetsNothing()
}

// TestHTTPEgress: A's egress policy lets it GET /public on B:80 only.
func TestHTTPEgress(t *testing.T) {
	n := newNode(t, "10.244.72.0/24", nodeOpts{})
	a, b := n.pods["a"], n.pods["b"]
	httpServer(t, b)
	n.importPolicy(egressPolicy)
	n.l7Acked(a)
	n.enforced()
	if code, _, err := a.request(n.pods["c"], "GET", "/public", dropTimeout); err == nil {
		t.Errorf("a reached c:80 (status %d) outside its egress policy", code)
	}
	n.expect(n.pods["c"], "GET", "/private", 200, "b GET /private") // C has no policy
	if _, ok := n.waitEvent(func(ev events.Event) bool {
		return ev.Type == events.L7Access && ev.L7 != nil && ev.L7.Direction == "egress" && ev.L7.Verdict == "allowed" &&
			ev.Endpoint == uint16(a.ep.ID)
	}); !ok {
		t.Errorf("no allowed egress l7-access event for a")
	}
	n.deletePolicy("default/a-http")
	testutil.Eventually(t, "a's L7 configuration withdrawn", func() bool {
		v, err := n.c.EndpointPolicy(context.Background(), fmt.Sprint(a.ep.ID))
		return err == nil && len(v.ComputedL7) == 0 && !v.EgressEnforced && len(v.Realized) == 0
	})
	n.expect(a, "POST", "/private", 200, "b POST /private")
}

// waitEvent waits (bounded) for an event match accepts.
func (n *node) waitEvent(match func(events.Event) bool) (events.Event, bool) {
	n.t.Helper()
	var ev events.Event
	ok := false
	testutil.Eventually(n.t, "the event", func() bool { ev, ok = n.event(match); return ok })
	return ev, ok
}

func slicesHasAcked(row *models.Actor, id int64) bool {
	for _, e := range row.L7Proxy.Endpoints {
		if e.ID == id && e.Acked {
			return true
		}
	}
	return false
}

// script writes an executable shell script standing in for the proxy.
func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "proxy.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAgentRestart: an agent restarted on the same state and host netns
// restores B with its L7 policy: the policy maps kept their proxy ports,
// the new agent's proxy gets B's configuration again and acknowledges
// it, and A's requests are enforced as before.
func TestAgentRestart(t *testing.T) {
	n := newNode(t, "10.244.77.0/24", nodeOpts{pods: []string{"a", "b"}, noEvents: true})
	a, b := n.pods["a"], n.pods["b"]
	httpServer(t, b)
	n.importPolicy(ingressPolicy)
	n.l7Acked(b)
	n.enforced()
	old := n.proxyRow().L7Proxy.PID
	n.stop()
	n.start()
	testutil.Eventually(t, "the restarted agent serving", func() bool { _, err := n.c.Status(context.Background()); return err == nil })
	if row := n.proxyRow(); row.L7Proxy.PID == old {
		t.Errorf("the new agent's proxy has the old pid %d", old)
	}
	n.l7Acked(b)
	testutil.Eventually(t, "the new proxy serving a's GET /public", func() bool {
		code, _, err := a.request(b, "GET", "/public", dropTimeout)
		return err == nil && code == 200
	})
	n.enforced()
}
