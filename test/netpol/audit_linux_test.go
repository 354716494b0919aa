package netpol

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// Issue #36: per-endpoint policy audit mode through a real API server
// and the real datapath. x/a admits only x/b and denies x/c outright;
// with its pod annotated policy.membrane.io/audit-mode: enabled, y/b's
// connection (no allow) and x/c's (a deny rule) pass and are reported
// as policy-verdict events with the verdict audit and counted under
// policy-audit; without the annotation they are dropped again.
func TestAuditMode(t *testing.T) {
	env := kubetest.Require(t)
	w := newWorldWith(t, "10.232.6.0/24", env)
	w.createMNP(t, env, `apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata: {name: audited, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: a}}
  ingress:
  - fromEndpoints: [{matchLabels: {pod: b}}]
  ingressDeny:
  - fromEndpoints: [{matchLabels: {pod: c}}]
`)
	xa, xb, xc, yb := w.pod("x", "a"), w.pod("x", "b"), w.pod("x", "c"), w.pod("y", "b")
	probes := map[string]func() bool{
		"x/b": func() bool { return testutil.Exchange(xb.ns, xa.IP, 80, probeTimeout) == nil },
		"x/c": func() bool { return testutil.Exchange(xc.ns, xa.IP, 80, probeTimeout) == nil },
		"y/b": func() bool { return testutil.Exchange(yb.ns, xa.IP, 80, probeTimeout) == nil },
	}
	expect := func(what string, want map[string]bool) {
		t.Helper()
		testutil.EventuallyErr(t, what, func() error {
			for name, p := range probes {
				if got := p(); got != want[name] {
					return fmt.Errorf("%s -> x/a reached = %v, want %v", name, got, want[name])
				}
			}
			return nil
		})
	}
	expect("enforced", map[string]bool{"x/b": true})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	annotate := func(v string) {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%s}}}`, k8s.AuditAnnotation, v)
		if _, err := w.kube.CoreV1().Pods("x").Patch(ctx, "a", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The verdicts reach GET /v1/events as policy-verdict events.
	verdicts := make(chan events.Event, 64)
	evCtx, evCancel := context.WithCancel(ctx)
	defer evCancel()
	go func() {
		_ = w.c.Events(evCtx, url.Values{"type": {string(events.PolicyVerdict)}}, func(ev events.Event) bool {
			select {
			case verdicts <- ev:
			default:
			}
			return true
		})
	}()
	annotate(`"enabled"`)
	expect("audit mode", map[string]bool{"x/b": true, "x/c": true, "y/b": true})
	testutil.EventuallyErr(t, "audit verdicts reported", func() error {
		p, err := w.c.EndpointPolicy(ctx, strconv.FormatInt(xa.ep.ID, 10))
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(p.Drops, func(d models.DropCounter) bool {
			return d.Reason == "policy-audit" && d.Direction == "ingress" && d.Packets > 0
		}) {
			return fmt.Errorf("x/a drop counters %+v: no policy-audit", p.Drops)
		}
		return nil
	})
	seen := map[string]bool{}
	testutil.EventuallyErr(t, "policy-verdict events from y/b and x/c", func() error {
		for {
			select {
			case ev := <-verdicts:
				if ev.Drop != nil && ev.Drop.Verdict == "audit" && ev.Endpoint == uint16(xa.ep.ID) {
					seen[ev.Drop.Src] = true
				}
				continue
			default:
			}
			break
		}
		if !seen[yb.IP.String()] || !seen[xc.IP.String()] {
			return fmt.Errorf("audit verdicts from %v", seen)
		}
		return nil
	})
	// Audit off: enforced again.
	annotate("null")
	expect("audit mode off", map[string]bool{"x/b": true})
}
