package sim

import (
	"context"
	"testing"
	"time"
)

// TestMultiNodeProbeAfterFaults: a run whose churn leaves no endpoint
// timed at every other node (the churn ends before any create is
// answered, and the crash, which overruns it, happens after) still
// measures convergence: one probe endpoint per node, created once every
// fault is over, reaches every other node's ipcache and is timed there
// (issue 38: at load 9-13 every churn endpoint of TestMultiNode had a
// pair given up to the etcd restart, the crash or a delete).
func TestMultiNodeProbeAfterFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node run")
	}
	cfg := MultiConfig{Nodes: 3, EndpointsPerNode: 2, Duration: time.Microsecond, Crashes: 1, Dir: t.TempDir(), Seed: 3}
	rep, err := RunMultiNode(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Violations {
		t.Error(v)
	}
	c := rep.Convergence
	if rep.Crashes != 1 || c == nil || c.Everywhere.Count < uint64(cfg.Nodes) || c.ToNode.Count < uint64(cfg.Nodes*(cfg.Nodes-1)) || c.Pending != 0 {
		t.Fatalf("want every node's probe timed at every other node after the crash: crashes %d, %+v %+v %+v", rep.Crashes, c, c.ToNode, c.Everywhere)
	}
}
