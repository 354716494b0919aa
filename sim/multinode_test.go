package sim

import (
	"context"
	"testing"
	"time"
)

// TestMultiNode runs three agents in kvstore mode with churn, an agent
// crash and an etcd restart (embedded etcd, stopped gracefully): every
// node's ipcache ends with exactly the other nodes' endpoints, etcd with
// exactly each node's, and, after the drain and the identity GC's grace,
// exactly the identities live endpoints hold.
func TestMultiNode(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node run: seconds of churn")
	}
	runMultiTest(t, MultiConfig{Nodes: 3, EndpointsPerNode: 10, Duration: 6 * time.Second, Crashes: 1, EtcdRestarts: 1,
		Dir: t.TempDir(), Seed: 1})
}

// TestMultiNodeEtcdKilled is TestMultiNode with etcd as its own process
// (etcd-embed from scripts/kube-bin.sh), SIGKILLed twice mid-churn and
// started again on its data directory: nothing is lost.
func TestMultiNodeEtcdKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node run: seconds of churn")
	}
	runMultiTest(t, MultiConfig{Nodes: 3, EndpointsPerNode: 10, Duration: 8 * time.Second, Crashes: 1, EtcdRestarts: 2,
		EtcdBin: etcdBinary(t), Dir: t.TempDir(), Seed: 2})
}

func runMultiTest(t *testing.T, cfg MultiConfig) {
	t.Helper()
	rep, err := RunMultiNode(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Violations {
		t.Error(v)
	}
	if rep.Creates == 0 || rep.Drained == 0 || rep.Crashes != cfg.Crashes || rep.EtcdRestarts != cfg.EtcdRestarts {
		t.Errorf("the run did not do what it was asked: %+v", rep)
	}
	// Each node's probe, created after the faults, is timed at every other
	// node even when every churn endpoint had a pair given up.
	if c := rep.Convergence; c == nil || c.ToNode.Count < uint64(cfg.Nodes*(cfg.Nodes-1)) || c.Everywhere.Count < uint64(cfg.Nodes) {
		t.Errorf("no convergence measured: %+v", rep.Convergence)
	}
	for _, n := range rep.PerNode {
		if n.Endpoints == 0 || n.RemoteEntries == 0 || n.Creates == 0 {
			t.Errorf("%s: %+v", n.Name, n)
		}
	}
	c := rep.Convergence
	t.Logf("%s: %d creates, %d deletes, %d drained, %d identities left, settled in %s; convergence: %d pairs, %d endpoints everywhere (p99 %.1f ms), %d pairs given up, %d pending",
		rep.EtcdMode, rep.Creates, rep.Deletes, rep.Drained, rep.EtcdIdentities, rep.Settle, c.ToNode.Count, c.Everywhere.Count, c.Everywhere.P99, c.Abandoned, c.Pending)
}
