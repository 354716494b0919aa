package main

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/sim"
)

// TestMultiFlags: --lease-ttl reaches the multi-node configuration;
// --sweep-nodes takes node counts and --sweep-endpoints; the multi-node
// flags need --nodes or --sweep-nodes, and a sweep refuses --nodes and
// --endpoints.
func TestMultiFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"--nodes", "3", "--lease-ttl", "15s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	mc, cleanup, err := multiConfig(cfg, sim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	if mc.LeaseTTL != 15*time.Second || mc.Nodes != 3 || mc.EndpointsPerNode != 100 {
		t.Errorf("multi config %+v, want 3 nodes, 100 endpoints each, lease 15s", mc)
	}
	cfg, err = parseFlags([]string{"--sweep-nodes", "10 30", "--sweep-endpoints", "600", "--lease-ttl", "5s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.sweepNodes, []int{10, 30}) || cfg.sweepEndpoints != 600 || cfg.leaseTTL != 5*time.Second {
		t.Errorf("sweep flags: %v nodes, %d endpoints, lease %s", cfg.sweepNodes, cfg.sweepEndpoints, cfg.leaseTTL)
	}
	for _, bad := range [][]string{
		{"--lease-ttl", "15s"},
		{"--sweep-nodes", "10 x"},
		{"--sweep-nodes", "1"},
		{"--sweep-nodes", "10", "--nodes", "3"},
		{"--sweep-nodes", "10", "--endpoints", "5"},
	} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("%s: accepted", strings.Join(bad, " "))
		}
	}
}

// TestAgentLogDiscarded: without --agent-log the agents' log is dropped
// before anything is formatted (at 100 nodes, formatting the info lines
// only to discard them cost the run's agents CPU), at every level.
func TestAgentLogDiscarded(t *testing.T) {
	cfg, err := parseFlags([]string{"--nodes", "3"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	opts, closeLog, err := options(cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer closeLog()
	mc, cleanup, err := multiConfig(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	for _, l := range []*slog.Logger{opts.Log, mc.Log} {
		if l != nil && l.Enabled(context.Background(), slog.LevelError) {
			t.Fatal("the discarded agent log is enabled")
		}
	}
}
