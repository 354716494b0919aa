package agent_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/test/etcdtest"
)

// TestKvstoreBehindLocalCallsAnswer: agent B's remote-update path stalls
// (its KvstoreObserver, called on the path after the ipcache took a
// batch, is held: a saturated or hung ipcache). While it stalls, B's
// local calls answer: an endpoint is created and deleted, GET /v1/status
// and GET /metrics answer, and both say B is behind (the status's
// kvstore.behind once the oldest change waited 5 s, the pending count and
// the age of the oldest). Released, B catches up and says so. Before the
// mirror queued changes, the stalled path held the mirror's lock, and the
// status and metrics calls waited for it until the caller gave up.
func TestKvstoreBehindLocalCallsAnswer(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	_, ca := kvAgent(t, srv.Endpoint, "behind-a", 1)
	var mu sync.Mutex
	var gate chan struct{} // non-nil: B's remote path is held
	cfg := agentConfig(filepath.Join(t.TempDir(), "behind-b"))
	cfg.IPv4Range = netip.MustParsePrefix("10.204.2.0/24")
	cfg.Kvstore = &kvstore.Config{Endpoints: []string{srv.Endpoint}, NodeName: "behind-b", Prefix: "agent-test/", LeaseTTL: 2 * time.Second}
	cfg.NodeAddrs = []netip.Addr{netip.AddrFrom4([4]byte{192, 168, 90, 2})}
	cfg.KvstoreObserver = func([]endpoint.Remote) {
		mu.Lock()
		g := gate
		mu.Unlock()
		if g != nil {
			<-g
		}
	}
	release := func() {
		mu.Lock()
		if gate != nil {
			close(gate)
			gate = nil
		}
		mu.Unlock()
	}
	b, cb, _ := startAgentT(t, cfg)
	t.Cleanup(release) // registered after the agent's stop: runs first
	waitStatus(t, cb, func(k *models.KvstoreStatus) bool { return k.Synced && k.RemoteNodes == 1 && !k.Behind })

	mu.Lock()
	gate = make(chan struct{})
	mu.Unlock()
	ctx := ctx10(t)
	create := func(c *client.Client, pod string) *models.Endpoint {
		t.Helper()
		ip, err := c.IPAMAllocate(ctx, "ipv4", "default/"+pod)
		if err != nil {
			t.Fatal(err)
		}
		ep, err := c.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{ContainerID: "c-" + pod, K8sNamespace: "default", K8sPodName: pod,
			Labels: []string{"k8s:app=behind"}, Addressing: &models.AddressPair{IPv4: ip.Address.IPv4}, SyncBuild: true})
		if err != nil {
			t.Fatalf("create %s: %v", pod, err)
		}
		return ep
	}
	// A's endpoints reach B's mirror; the first hand-over is held.
	for i := range 3 {
		create(ca, fmt.Sprint("pod-a", i))
	}
	status := func() *models.KvstoreStatus {
		t.Helper()
		sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		st, err := cb.Status(sctx)
		if err != nil {
			t.Fatalf("GET /v1/status while the remote path stalls: %v", err)
		}
		return st.Kvstore
	}
	deadline := time.Now().Add(30 * time.Second)
	for k := status(); k.RemotePending == 0; k = status() {
		if time.Now().After(deadline) {
			t.Fatalf("no remote change pending on B: %+v", k)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// B's own work goes on.
	ep := create(cb, "pod-b")
	if err := cb.EndpointDelete(ctx, fmt.Sprint(ep.ID)); err != nil {
		t.Fatalf("delete while the remote path stalls: %v", err)
	}
	for k := status(); !k.Behind; k = status() {
		if time.Now().After(deadline) {
			t.Fatalf("B never said it is behind: %+v", k)
		}
		time.Sleep(100 * time.Millisecond)
	}
	k := status()
	if k.RemotePending == 0 || k.RemoteBehindSeconds < kvstore.BehindThreshold.Seconds() {
		t.Fatalf("behind, but: %+v", k)
	}
	scraped := make(chan string, 1)
	go func() {
		rec := httptest.NewRecorder()
		b.Metrics().Handler().ServeHTTP(rec, httptest.NewRequestWithContext(context.Background(), "GET", "/metrics", nil))
		scraped <- rec.Body.String()
	}()
	var raw string
	select {
	case raw = <-scraped:
	case <-time.After(3 * time.Second):
		t.Fatal("GET /metrics did not answer within 3 s while the remote path stalls")
	}
	if !metricAtLeast(string(raw), `membrane_remote_updates_behind_seconds{source="kvstore"}`, kvstore.BehindThreshold.Seconds()) ||
		!metricAtLeast(string(raw), `membrane_remote_updates_pending{source="kvstore"}`, 1) {
		t.Fatalf("metrics do not say behind:\n%s", grepLines(string(raw), "membrane_remote_updates"))
	}

	release()
	waitStatus(t, cb, func(k *models.KvstoreStatus) bool {
		return !k.Behind && k.RemotePending == 0 && k.RemoteEndpoints == 3 && k.RemoteMaxBehindSeconds >= kvstore.BehindThreshold.Seconds()
	})
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// metricAtLeast reports whether series (name and labels) is in the
// exposition with a value of at least min.
func metricAtLeast(expo, series string, min float64) bool {
	for _, l := range strings.Split(expo, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil && f >= min {
				return true
			}
		}
	}
	return false
}
