package agent

import (
	"os"
	"runtime/debug"
)

// DefaultGCPercent is --gc-percent's default. The agent's heap is mostly
// long-lived (index rows, actors, one record per endpoint) while each API
// call allocates short-lived garbage; collecting when the heap has grown
// by 200% of the live heap rather than Go's 100% cut the garbage
// collector's share of membrane-sim's CPU (10,000 live endpoints, 1%
// faults; agent and clients in one process) from 14-16% to 9-11% and its
// CPU per lifecycle by 2-22% in four back-to-back pairs, for about a
// quarter more resident memory and the same live heap per endpoint
// (BENCHMARKS.md, issue 22).
const DefaultGCPercent = 200

// applyGCPercent sets the garbage collector's target to pct unless pct
// is 0 or GOGC is set in the environment.
func applyGCPercent(pct int) {
	if pct == 0 || os.Getenv("GOGC") != "" {
		return
	}
	debug.SetGCPercent(pct)
}
