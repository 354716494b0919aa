package agent_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent"
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
