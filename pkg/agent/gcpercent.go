package agent

import (
	"os"
	"runtime/debug"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent/procmem"
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

// DefaultMemoryLimitMiB is --memory-limit-mib's default: the soft limit
// of the Go runtime's memory. The agent's live heap is 5 MiB standalone
// with 110 endpoints and 12-13 MiB in Kubernetes mode with 5,000 remote
// endpoints; at GCPercent 200 alone the heap grew to about three times
// that between collections (RssAnon 22-26 and 38-47 MiB). The limit
// leaves the small heap its 200% and makes the large one collect earlier,
// never more often than at procmem.MinGCPercent (BENCHMARKS.md "Agent
// memory", issue 39).
const DefaultMemoryLimitMiB = 24

// applyMemoryLimit sets the soft memory limit to limit bytes unless limit
// is 0 or GOMEMLIMIT is set in the environment.
func applyMemoryLimit(limit int64) {
	if limit == 0 || os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	procmem.SetSoftLimit(limit)
}

// releaseStartupPages schedules the release of the executable's
// start-up pages (Config.ReleaseStartupPages) once, in the background.
func (a *Agent) releaseStartupPages() {
	if a.cfg.ReleaseStartupPages <= 0 {
		return
	}
	t := time.AfterFunc(a.cfg.ReleaseStartupPages, func() {
		r, err := procmem.ReleaseExecutable()
		if err != nil {
			a.log.Info("start-up pages of the executable not released", "err", err)
			return
		}
		a.log.Debug("start-up pages of the executable released", "mappings", r.Mappings, "bytes", r.Bytes)
	})
	a.stopRelease = func() { t.Stop() }
}
