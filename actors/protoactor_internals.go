package actors

import (
	"log/slog"

	"github.com/asynkron/protoactor-go/actor"
	cmap "github.com/orcaman/concurrent-map"
)

// NewSystem creates an actor system whose own logging (protoactor's
// supervision, dead letters, ...) goes to log with component=protoactor,
// instead of the library's default coloured stderr logger.
func NewSystem(log *slog.Logger) *actor.ActorSystem {
	l := log.With("component", "protoactor")
	sys := actor.NewActorSystem(
		actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return l }),
		actor.WithDeadLetterThrottleCount(3),
	)
	compactRegistry(sys.ProcessRegistry)
	return sys
}

// registryBuckets is the number of buckets of the process registry (each
// a concurrent map of 32 shards). protoactor's default of 1,024 buckets
// makes 32,768 Go maps; every PID lands in a random one, so with
// thousands of actors nearly all of them allocate a table that never
// shrinks (heap per endpoint is a target; BENCHMARKS.md). 32 buckets
// (1,024 shards) keep lock contention negligible on a node.
//
// This file is the only place that reaches into protoactor's internals
// (the registry's bucket slice); TestCompactRegistry fails if an upgrade
// changes them.
const registryBuckets = 32

// compactRegistry replaces the process registry's buckets by
// registryBuckets ones, moving what the system registered at creation
// (dead letters, event stream). Call it before anything is spawned.
func compactRegistry(reg *actor.ProcessRegistryValue) {
	next := &actor.SliceMap{LocalPIDs: make([]cmap.ConcurrentMap, registryBuckets)}
	for i := range next.LocalPIDs {
		next.LocalPIDs[i] = cmap.New()
	}
	for _, bucket := range reg.LocalPIDs.LocalPIDs {
		for id, p := range bucket.Items() {
			next.GetBucket(id).Set(id, p)
		}
	}
	reg.LocalPIDs = next
}
