package agent_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

func runGC(t *testing.T, a *agent.Agent) datapath.GCReport {
	t.Helper()
	rep, err := a.System.RunGC(ctx10(t))
	if err != nil {
		t.Fatalf("RunGC: %v", err)
	}
	return rep
}

// TestGCDeletesOrphansAndMissing: through the agent's GC actor, a
// realised endpoint the index does not know is collected on the second
// pass, and an endpoint whose interface vanished is deleted (its IP
// released) after two passes that saw it missing.
func TestGCDeletesOrphansAndMissing(t *testing.T) {
	env := newRestoreEnv(t)
	env.cfg.GCInterval = -1 // passes only on RunGC
	fake := datapath.NewFake(5)
	a, c := env.start(t, fake)
	keep := addPod(t, c, "keep", "web", true)
	lost := addPod(t, c, "lost", "web", true)
	orphan := &endpoint.Endpoint{ID: 999}
	if _, err := fake.Realize(context.Background(), orphan, 1); err != nil {
		t.Fatal(err)
	}
	fake.Forget(endpoint.ID(lost.ID))

	r1 := runGC(t, a)
	if len(r1.Links) != 0 || len(r1.Missing) != 0 || r1.Suspects != 2 {
		t.Fatalf("pass 1 = %+v, want 2 suspects only", r1)
	}
	r2 := runGC(t, a)
	if !slices.Equal(r2.Links, []string{"fake-999"}) || !slices.Equal(r2.Missing, []endpoint.ID{endpoint.ID(lost.ID)}) {
		t.Fatalf("pass 2 = %+v, want fake-999 collected and %d missing", r2, lost.ID)
	}
	if _, ok := fake.Realized(999); ok {
		t.Fatal("orphan still realised")
	}
	testutil.Eventually(t, "the lost endpoint deleted", func() bool {
		_, err := c.EndpointGet(context.Background(), "container-id:lost")
		return client.IsNotFound(err)
	})
	testutil.Eventually(t, "the lost endpoint's IP released", func() bool {
		st, err := c.IPAMStatus(context.Background())
		if err != nil {
			return false
		}
		for _, al := range st.IPv4.Allocations {
			if al.IP == lost.Addressing.IPv4 {
				return false
			}
		}
		return true
	})
	waitReady(t, c, "container-id:keep")
	if _, ok := fake.Realized(endpoint.ID(keep.ID)); !ok {
		t.Fatal("live endpoint collected")
	}
}

// TestGCRunsPeriodically: with an interval the passes run on their own
// (after restore), and an endpoint whose interface vanished goes.
func TestGCRunsPeriodically(t *testing.T) {
	env := newRestoreEnv(t)
	env.cfg.GCInterval = 5 * time.Millisecond
	fake := datapath.NewFake(6)
	_, c := env.start(t, fake)
	lost := addPod(t, c, "lost", "web", true)
	fake.Forget(endpoint.ID(lost.ID))
	testutil.Eventually(t, "the lost endpoint deleted", func() bool {
		_, err := c.EndpointGet(context.Background(), "container-id:lost")
		return client.IsNotFound(err)
	})
	before := fake.GCPasses()
	testutil.Eventually(t, "more passes", func() bool { return fake.GCPasses() >= before+2 })
}
