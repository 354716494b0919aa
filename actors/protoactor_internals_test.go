package actors

import (
	"log/slog"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
)

// TestCompactRegistry: the process registry has registryBuckets buckets
// and still resolves what the system registered before it was replaced.
func TestCompactRegistry(t *testing.T) {
	sys := NewSystem(slog.New(slog.DiscardHandler))
	reg := sys.ProcessRegistry
	if got := len(reg.LocalPIDs.LocalPIDs); got != registryBuckets {
		t.Fatalf("registry buckets = %d, want %d", got, registryBuckets)
	}
	for _, id := range []string{"deadletter", "eventstream"} {
		if _, ok := reg.GetLocal(id); !ok {
			t.Errorf("%s not registered after compaction", id)
		}
	}
	pid := sys.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	if _, ok := reg.Get(pid); !ok {
		t.Fatalf("spawned actor %s not found", pid.Id)
	}
	sys.Root.Stop(pid)
}
