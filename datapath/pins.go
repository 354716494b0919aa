package datapath

import (
	"fmt"
	"strconv"
	"time"
)

// DefaultPinCheckInterval is LinuxConfig.PinCheckInterval's default: a
// removed pin matters at the agent's next start, so a check every few
// seconds (a stat per pin) is ample.
const DefaultPinCheckInterval = 10 * time.Second

// PinRepair is what one check of the BPF pins found missing and did
// (LinuxHooks.OnPinRepair).
type PinRepair struct {
	// Dir is the pin directory (LinuxConfig.BPFFS).
	Dir string
	// Missing counts the pins found missing, Repinned those pinned again.
	Missing, Repinned int
	// Examples names a few of the missing pins (relative to Dir).
	Examples []string
	// Err is why some could not be pinned again (nil: all were).
	Err error
	// Took is how long the check and repair took.
	Took time.Duration
}

// Summary is the repair in a sentence (events, logs).
func (rep PinRepair) Summary() string {
	s := strconv.Itoa(rep.Missing) + " pins missing under " + rep.Dir + ", " + strconv.Itoa(rep.Repinned) + " pinned again"
	if len(rep.Examples) > 0 {
		s += fmt.Sprintf(" (e.g. %v)", rep.Examples)
	}
	if rep.Err != nil {
		s += ": " + rep.Err.Error()
	}
	return s
}

// PinStatus reports the pin checks: the pin directory, whether the last
// check that found pins missing pinned them all again, how many such
// repairs there were and the last one.
type PinStatus struct {
	Dir      string
	Interval time.Duration
	// Healthy is false while the last repair left pins missing.
	Healthy bool
	// Repairs counts the checks that found pins missing; Repinned the
	// pins made again in all.
	Repairs, Repinned int
	// Last is the last repair (zero: none), LastAt when.
	Last   PinRepair
	LastAt time.Time
}

// PinStatusReader is a datapath that checks its BPF pins (GET /v1/status).
type PinStatusReader interface{ PinStatus() PinStatus }
