package agent_test

import (
	"log/slog"
	"math"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/procmem"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestReleaseStartupPages: with Config.ReleaseStartupPages set, the
// agent gives back its executable's start-up pages once, that long
// after Start (pkg/agent/procmem tests what the release does).
func TestReleaseStartupPages(t *testing.T) {
	cfg := agentConfig(t.TempDir())
	cfg.ReleaseStartupPages = 50 * time.Millisecond
	var logs syncBuffer
	a, err := agent.Start(cfg, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop(ctx10(t))
	testutil.Eventually(t, "the release logged", func() bool {
		return strings.Contains(logs.String(), "start-up pages of the executable released")
	})
	if n := strings.Count(logs.String(), "start-up pages of the executable"); n != 1 {
		t.Fatalf("%d release lines, want 1", n)
	}
}

// TestMemoryLimit: Config.MemoryLimit becomes the process's soft memory
// limit at Start, unless GOMEMLIMIT is set (which wins, as GOGC does over
// GCPercent).
func TestMemoryLimit(t *testing.T) {
	t.Cleanup(func() { procmem.SetSoftLimit(0) })
	t.Setenv("GOMEMLIMIT", "")
	cfg := agentConfig(t.TempDir())
	cfg.MemoryLimit = 3 << 30
	a, err := agent.Start(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	a.Stop(ctx10(t))
	if got := debug.SetMemoryLimit(-1); got != 3<<30 {
		t.Fatalf("memory limit %d after Start, want %d", got, 3<<30)
	}
	procmem.SetSoftLimit(0)
	t.Setenv("GOMEMLIMIT", "4GiB")
	cfg = agentConfig(t.TempDir())
	cfg.MemoryLimit = 3 << 30
	a, err = agent.Start(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	a.Stop(ctx10(t))
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("memory limit %d with GOMEMLIMIT set, want the environment's (none applied by the agent)", got)
	}
}
