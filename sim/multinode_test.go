package sim_test

import (
	"context"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/sim"
)

// TestMultiNode runs three agents in kvstore mode with churn, an agent
// crash and an etcd restart: every node's ipcache ends with exactly the
// other nodes' endpoints and etcd with exactly each node's.
func TestMultiNode(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node run: seconds of churn")
	}
	rep, err := sim.RunMultiNode(context.Background(), sim.MultiConfig{Nodes: 3, EndpointsPerNode: 10, Duration: 6 * time.Second,
		Crashes: 1, EtcdRestarts: 1, Dir: t.TempDir(), Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Violations {
		t.Error(v)
	}
	if rep.Creates == 0 || rep.Crashes != 1 || rep.EtcdRestarts != 1 {
		t.Errorf("the run did not do what it was asked: %+v", rep)
	}
	for _, n := range rep.PerNode {
		if n.Endpoints == 0 || n.RemoteEntries == 0 {
			t.Errorf("%s: %+v", n.Name, n)
		}
	}
	t.Logf("%d creates, %d deletes, settled in %s", rep.Creates, rep.Deletes, rep.Settle)
}
