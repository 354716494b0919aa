package sim

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/client"
	"github.com/membrane-cni/membrane/pkg/models"
)

// RestoreAvailable reports whether the agent brings endpoints back after a
// crash: it starts an agent in dir, creates one endpoint, crashes the
// agent, starts it again on the same state and looks for the endpoint.
// It depends on behaviour, not on build tags or packages, so a crash
// scenario can tell "restore is not there yet" (issue 5) from "restore
// lost endpoints". The error is for agents that fail to start or answer.
func RestoreAvailable(ctx context.Context, dir string) (bool, error) {
	cfg := agent.Config{Socket: filepath.Join(dir, "probe.sock"), StateDir: filepath.Join(dir, "probe-state"),
		IPv4Range: netip.MustParsePrefix("10.201.0.0/24"), Datapath: "fake", Fake: datapath.NewFake(1)}
	log := slog.New(slog.DiscardHandler)
	a, err := agent.Start(cfg, log)
	if err != nil {
		return false, fmt.Errorf("probe restore: %w", err)
	}
	c := client.New(cfg.Socket)
	defer c.Close()
	ipr, err := c.IPAMAllocate(ctx, "ipv4", "probe/p")
	if err == nil && ipr.Address == nil {
		err = errBadAnswer
	}
	if err == nil {
		_, err = c.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{ContainerID: "probe", K8sNamespace: "probe",
			K8sPodName: "p", Labels: []string{"k8s:app=probe"}, Addressing: &models.AddressPair{IPv4: ipr.Address.IPv4}, SyncBuild: true})
	}
	a.Crash()
	if err != nil {
		return false, fmt.Errorf("probe restore: %w", err)
	}
	b, err := agent.Start(cfg, log)
	if err != nil {
		return false, fmt.Errorf("probe restore: restart: %w", err)
	}
	defer func() { _ = b.Stop(ctx) }()
	_, ok := b.Index.EndpointByContainerID("probe")
	return ok, nil
}
