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
