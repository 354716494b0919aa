package actors_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestProxyNack: a proxy's rejection of the configuration a revision
// needs fails that regeneration (visible in LastError and the counter)
// and the retry, acknowledged this time, realises it.
func TestProxyNack(t *testing.T) {
	h := startSystem(t, func(c *actors.Config) {
		c.Endpoint.ProxyWaitTimeout = time.Minute
		c.Endpoint.RetryMin = time.Millisecond
	})
	ep := h.mustCreate(t, podSpec(t, "c-nack", "ns", "nack"))
	h.fake.Set(datapath.FakeHooks{ProxyAcks: 1, ProxyAckDropRate: 1})
	regen := h.future(h.sys.PIDForTest("endpoints"), &messages.Regenerate{ID: ep.ID, Reason: "test"})
	var rev1 uint64
	testutil.Eventually(t, "the regeneration's realize", func() bool {
		rev1, _ = h.fake.Realized(ep.ID)
		return rev1 > ep.RealizedRevision
	})
	rejects := h.sys.Counters().ProxyRejects
	h.sys.ProxyNack(ep.ID, rev1+1000, "proxy-0", "stale") // another revision: ignored
	h.sys.ProxyNack(ep.ID, rev1, "proxy-0", "bad path regexp")
	r, err := futureResult(t, regen)
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(r.Err, actors.ErrProxyRejected) || !strings.Contains(r.Err.Error(), "bad path regexp") {
		t.Fatalf("regenerate answered %v, want the proxy's rejection", r.Err)
	}
	if n := h.sys.Counters().ProxyRejects - rejects; n != 1 {
		t.Errorf("ProxyRejects rose by %d, want 1", n)
	}
	cur, err := h.endpointCall(t, &messages.PatchLabels{ID: ep.ID})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(cur.LastError, "rejected") {
		t.Errorf("LastError = %q, want the rejection", cur.LastError)
	}
	// The retry waits again; its acknowledgement realises the endpoint.
	var rev2 uint64
	testutil.Eventually(t, "the retry's realize", func() bool {
		rev2, _ = h.fake.Realized(ep.ID)
		return rev2 > rev1
	})
	h.sys.ProxyAck(ep.ID, rev2, "proxy-0")
	testutil.Eventually(t, "the retry realised", func() bool {
		cur, err := h.endpointCall(t, &messages.PatchLabels{ID: ep.ID})
		return err == nil && cur.RealizedRevision == rev2 && cur.LastError == ""
	})
}
