package actors

import (
	"log/slog"

	"github.com/asynkron/protoactor-go/actor"
)

// NewSystem creates an actor system whose own logging (protoactor's
// supervision, dead letters, ...) goes to log with component=protoactor,
// instead of the library's default coloured stderr logger.
func NewSystem(log *slog.Logger) *actor.ActorSystem {
	l := log.With("component", "protoactor")
	return actor.NewActorSystem(
		actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return l }),
		actor.WithDeadLetterThrottleCount(3),
	)
}
