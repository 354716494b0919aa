package netpol

import (
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/test/netpolmodel"
)

// Host32 is pod ns/name's address as a /32.
func (w *world) Host32(ns, name string) string { return w.pod(ns, name).IP.String() + "/32" }

// CIDR is the pods' range.
func (w *world) CIDR() string { return w.node.IPv4Range.String() }

// TestNetworkPolicyConformance runs the table on one world: per case and
// step, the policies go in through PUT /v1/policy (the others are
// deleted), the agent realises them, and the observed matrices of TCP
// and UDP on ports 80 and 81 must equal the model's.
func TestNetworkPolicyConformance(t *testing.T) {
	w := newWorld(t, "10.232.0.0/24")
	start := time.Now()
	for _, tc := range netpolmodel.Cases {
		t.Run(tc.Name, func(t *testing.T) {
			for i, st := range tc.Steps {
				pols := st(w)
				if report := w.check(pols); report != "" {
					t.Errorf("step %d of %d:\n%s", i+1, len(tc.Steps), report)
				}
			}
		})
	}
	t.Logf("%d cases in %v", len(netpolmodel.Cases), time.Since(start).Round(time.Second))
}

// check applies pols and compares every matrix with the model's. A
// mismatch is looked at again twice (after the agent settles again), as
// upstream retries probes, before it is reported.
func (w *world) check(pols []*netpolmodel.Policy) string {
	w.t.Helper()
	w.apply(pols)
	var report string
	for attempt := range 3 {
		if attempt > 0 {
			time.Sleep(500 * time.Millisecond)
		}
		w.settle()
		var b strings.Builder
		for _, k := range netpolmodel.ProbeKeys {
			want := netpolmodel.Expected(pols, w.model, k)
			if got := w.observe(k, want); !got.Equal(want) {
				b.WriteString(netpolmodel.DiffReport(w.model, k, want, got))
			}
		}
		if report = b.String(); report == "" {
			return ""
		}
	}
	return report
}
