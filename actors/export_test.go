package actors

import (
	"context"

	"github.com/asynkron/protoactor-go/actor"
)

// Test hooks for the external tests of this package, which drive single
// actors with messages the front door does not offer.

// PIDForTest returns the PID of child name ("ipam", "endpoints", ...).
func (s *System) PIDForTest(name string) *actor.PID {
	return map[string]*actor.PID{"agent": s.agent, "datapath": s.pool, "ipam": s.ipam, "identity": s.identity,
		"policy": s.policy, "ipcache": s.ipcache, "endpoints": s.endpoints, "gc": s.gc}[name]
}

// AskForTest is System.ask.
func (s *System) AskForTest(ctx context.Context, pid *actor.PID, msg any) (any, error) {
	return s.ask(ctx, pid, msg)
}

// GetActorsForTest is the endpoint manager's children query.
type GetActorsForTest = getActors

// SourceRankForTest is the ipcache's claim source order.
var SourceRankForTest = sourceRank
