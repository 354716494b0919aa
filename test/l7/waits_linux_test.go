package l7

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

// endpointActor is p's endpoint actor row of GET /v1/actors.
func (n *node) endpointActor(p *pod) *models.Actor {
	n.t.Helper()
	a, err := n.c.Actor(context.Background(), fmt.Sprintf("endpoint/%d", p.ep.ID))
	if err != nil {
		n.t.Fatal(err)
	}
	return a
}

// waitingForProxy waits until p's endpoint shows a proxy wait: state
// regenerating, its actor in the proxy-wait operation, and the proxy's
// row counting a pending wait and p's version unacknowledged.
func (n *node) waitingForProxy(p *pod) {
	n.t.Helper()
	testutil.Eventually(n.t, fmt.Sprintf("pod %s waiting for the proxy", p.name), func() bool {
		ep, err := n.c.EndpointGet(context.Background(), fmt.Sprint(p.ep.ID))
		if err != nil || ep.State != "regenerating" || n.endpointActor(p).Operation != "proxy-wait" {
			return false
		}
		row := n.proxyRow()
		for _, e := range row.L7Proxy.Endpoints {
			if e.ID == p.ep.ID && !e.Acked {
				return row.L7Proxy.Pending >= 1
			}
		}
		return false
	})
}

// stateEvent matches p's endpoint-state-changed event to state whose
// message contains msg.
func stateEvent(p *pod, state, msg string) func(events.Event) bool {
	return func(ev events.Event) bool {
		return ev.Type == events.EndpointStateChanged && ev.Endpoint == uint16(p.ep.ID) && ev.State == state &&
			strings.Contains(ev.Message, msg)
	}
}

// TestProxyAckNeverComes: a proxy that never acknowledges (a process
// that never connects to the xDS server): B's regeneration with L7
// rules shows as waiting (state, actor operation, the proxy row's
// pending wait and unacknowledged version), and traffic on the L7 port
// fails closed (no proxy socket: dropped); then the wait times out
// visibly: the endpoint ready with the timeout as its last error, an
// event saying so and the timeout counted in /metrics. A CNI DEL during
// a second wait finishes once the wait ends (bounded by the timeout)
// and leaves no wait behind.
func TestProxyAckNeverComes(t *testing.T) {
	n := newNode(t, "10.244.73.0/24", nodeOpts{proxy: script(t, "exec sleep 3600"), proxyWait: 3 * time.Second})
	a, b := n.pods["a"], n.pods["b"]
	httpServer(t, b)
	n.importPolicy(ingressPolicy)
	n.waitingForProxy(b)
	if _, _, err := a.request(b, "GET", "/public", dropTimeout); err == nil {
		t.Errorf("a reached b:80 with no proxy listening, want L7 traffic dropped")
	}
	n.waitEvent(stateEvent(b, "ready", "proxy acknowledgements timed out"))
	if ep, err := n.c.EndpointGet(context.Background(), fmt.Sprint(b.ep.ID)); err != nil || !strings.Contains(ep.LastError, "timed out") {
		t.Errorf("b after the timeout: %+v %v, want the timeout as last error", ep, err)
	}
	if v := n.metric(`membrane_proxy_wait_failures_total{result="timeout"}`); v < 1 {
		t.Errorf("proxy wait timeouts in /metrics: %v, want at least 1", v)
	}

	n.importPolicy(strings.Replace(ingressPolicy, "/public", "/other", 1))
	n.waitingForProxy(b)
	if err := n.delPod(b); err != nil {
		t.Fatalf("DEL b during a proxy wait: %v", err)
	}
	if _, err := n.c.EndpointGet(context.Background(), fmt.Sprint(b.ep.ID)); err == nil {
		t.Errorf("b still listed after its DEL")
	}
	row := n.proxyRow()
	if row.L7Proxy.Pending != 0 {
		t.Errorf("proxy row after b's DEL: %d pending waits, want 0", row.L7Proxy.Pending)
	}
	for _, e := range row.L7Proxy.Endpoints {
		if e.ID == b.ep.ID {
			t.Errorf("proxy row still lists deleted b: %+v", e)
		}
	}
}

// TestProxyRejects: a proxy that rejects every configuration (NACK):
// B's regeneration fails with the rejection (state, last error, event),
// is retried with backoff (failed regenerations keep counting), and the
// rejections show in /metrics and the proxy's row.
func TestProxyRejects(t *testing.T) {
	proxy := nodeharness.Bin("membrane-proxy")
	n := newNode(t, "10.244.74.0/24", nodeOpts{proxy: script(t, `exec "`+proxy+`" "$@" --reject-config`), proxyWait: time.Minute})
	b := n.pods["b"]
	n.importPolicy(ingressPolicy)
	n.waitEvent(stateEvent(b, "waiting-to-regenerate", "rejected"))
	testutil.Eventually(t, "b's regeneration retried and failed again", func() bool {
		e := n.endpointActor(b).Endpoint
		return e != nil && e.RegenerationsFailed >= 2
	})
	if ep, err := n.c.EndpointGet(context.Background(), fmt.Sprint(b.ep.ID)); err != nil || !strings.Contains(ep.LastError, "rejected") {
		t.Errorf("b: %+v %v, want the rejection as last error", ep, err)
	}
	if v := n.metric(`membrane_proxy_wait_failures_total{result="rejected"}`); v < 2 {
		t.Errorf("proxy rejections in /metrics: %v, want at least 2", v)
	}
	if row := n.proxyRow(); row.L7Proxy.Nacks < 2 || !strings.HasPrefix(row.LastError, "rejected: ") {
		t.Errorf("proxy row %+v (proxy %+v), want the rejections", row, row.L7Proxy)
	}
}

// TestProxyRestartCompletesWait: the proxy's first run never
// acknowledges; B's regeneration waits; SIGKILLed, the proxy is
// restarted (the real one this time), gets the whole configuration
// again and its acknowledgement completes the pending wait: B is ready
// without error and A's traffic is enforced.
func TestProxyRestartCompletesWait(t *testing.T) {
	proxy := nodeharness.Bin("membrane-proxy")
	mark := filepath.Join(t.TempDir(), "first-run")
	n := newNode(t, "10.244.75.0/24", nodeOpts{proxyWait: time.Minute,
		proxy: script(t, fmt.Sprintf(`if [ ! -e %q ]; then touch %q; exec sleep 3600; fi; exec %q "$@"`, mark, mark, proxy))})
	a, b := n.pods["a"], n.pods["b"]
	httpServer(t, b)
	n.importPolicy(ingressPolicy)
	n.waitingForProxy(b)
	pid := n.proxyRow().L7Proxy.PID
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		t.Fatal(err)
	}
	testutil.Eventually(t, "b ready after the restarted proxy's acknowledgement", func() bool {
		ep, err := n.c.EndpointGet(context.Background(), fmt.Sprint(b.ep.ID))
		return err == nil && ep.State == "ready"
	})
	if ep, _ := n.c.EndpointGet(context.Background(), fmt.Sprint(b.ep.ID)); ep.LastError != "" {
		t.Errorf("b's last error %q, want none (acknowledged, not timed out)", ep.LastError)
	}
	n.l7Acked(b)
	n.expect(a, "GET", "/public", 200, "b GET /public")
	n.expect(a, "GET", "/private", 403, "Access denied")
}
