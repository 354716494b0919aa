package k8s_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// An API server that never answers does not keep the agent from serving:
// the bounded sync wait ends, the status says so, and an ADD gets the
// init identity once its bounded pod wait ends.
func TestSyncTimeoutServesAnyway(t *testing.T) {
	// A listener that accepts and never answers: the informers' lists hang.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	dir := t.TempDir()
	cfg := agent.Config{
		Socket:    filepath.Join(dir, "run", "a.sock"),
		StateDir:  filepath.Join(dir, "state"),
		IPv4Range: netip.MustParsePrefix("10.204.0.0/24"),
		Datapath:  "fake",
		Fake:      datapath.NewFake(1),
		K8s: &k8s.Config{REST: &rest.Config{Host: "https://" + lis.Addr().String(), Timeout: time.Second},
			NodeName: nodeName, SyncTimeout: 200 * time.Millisecond, PodWait: 100 * time.Millisecond},
	}
	a, err := agent.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("agent.Start: %v", err)
	}
	c := client.New(cfg.Socket)
	t.Cleanup(func() {
		c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := a.Stop(ctx); err != nil {
			t.Errorf("agent stop: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.K8s == nil || st.K8s.State != "sync-timeout" || st.K8s.Synced["pods"] {
		t.Fatalf("status k8s = %+v, want sync-timeout with pods not synced", st.K8s)
	}
	ep, err := c.EndpointCreate(ctx, "container-id:early", &models.EndpointChangeRequest{
		K8sNamespace: "default", K8sPodName: "early", Labels: []string{"cni:network=test"}, SyncBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	if ep.Identity == nil || ep.Identity.ID != 5 || !slices.Equal(ep.Labels, []string{"reserved:init"}) {
		t.Fatalf("endpoint = labels %v identity %+v, want reserved:init", ep.Labels, ep.Identity)
	}
}
