package sim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/client"
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

// TestMultiNodeUnpacedNoTimeouts: churn as fast as the agents answer (no
// pacing) on four nodes. The agents fall behind on remote updates at
// most by queueing them (the report's backlog), never by letting a local
// call run into the client's deadline: no request times out, and the
// backlog the mirrors queued is reported. Counts only, no timing.
func TestMultiNodeUnpacedNoTimeouts(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node run: seconds of churn")
	}
	rep, err := RunMultiNode(context.Background(), MultiConfig{Nodes: 4, EndpointsPerNode: 30, WorkersPerNode: 6,
		Duration: 4 * time.Second, Dir: t.TempDir(), Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Violations {
		t.Error(v)
	}
	if rep.TimedOut != 0 || rep.Refused != 0 || rep.Errors != 0 {
		t.Errorf("%d requests timed out, %d refused, %d failed (first: %s)", rep.TimedOut, rep.Refused, rep.Errors, rep.FirstError)
	}
	if b := rep.Backlog; b == nil || b.Applied == 0 {
		t.Errorf("no remote backlog reported: %+v", rep.Backlog)
	}
	if rep.Creates == 0 || rep.Deletes <= rep.Drained {
		t.Errorf("no churn: %d creates, %d deletes, %d drained", rep.Creates, rep.Deletes, rep.Drained)
	}
	t.Logf("%d creates, %d deletes; backlog %+v", rep.Creates, rep.Deletes, *rep.Backlog)
}

// TestFailureKind: the report tells a request the client gave up on from
// one the agent refused (503/429) and from other failures.
func TestFailureKind(t *testing.T) {
	for _, c := range []struct {
		err  error
		want int
	}{
		{fmt.Errorf("PUT /v1/endpoint/0: %w", context.DeadlineExceeded), failTimedOut},
		{fmt.Errorf("dial: %w", &net.OpError{Op: "dial", Err: os.ErrDeadlineExceeded}), failTimedOut},
		{&client.APIError{Status: http.StatusServiceUnavailable, Code: "starting"}, failRefused},
		{fmt.Errorf("create: %w", &client.APIError{Status: http.StatusTooManyRequests}), failRefused},
		{&client.APIError{Status: http.StatusGatewayTimeout, Code: "timeout"}, failOther},
		{&client.APIError{Status: http.StatusInternalServerError}, failOther},
		{errors.New("connection refused"), failOther},
	} {
		if got := failureKind(c.err); got != c.want {
			t.Errorf("%v: kind %d, want %d", c.err, got, c.want)
		}
	}
}
