package datapath

import (
	"fmt"
	"time"
)

// CTGCConfig configures the conntrack garbage collector of the Linux
// datapath: periodic passes over the shared ct map that delete the
// entries the programs already treat as gone (no traffic for longer than
// their lifetime), so that an LRU map under pressure evicts dead entries'
// slots, not live connections (whose replies would then be dropped).
type CTGCConfig struct {
	// Interval is the first pass's delay (default 1 minute); later
	// intervals adapt to what passes delete (NextCTGCInterval). Negative
	// disables the collector.
	Interval time.Duration
	// MinInterval and MaxInterval bound the adapted interval (defaults 10
	// seconds and 30 minutes).
	MinInterval, MaxInterval time.Duration
	// Budget is how many entries one pass examines at most (default
	// 16384, a quarter of the map); the next pass continues where it
	// stopped, so a pass's work is bounded whatever the map holds.
	Budget int
}

// Defaults of CTGCConfig.
const (
	DefaultCTGCInterval    = time.Minute
	DefaultCTGCMinInterval = 10 * time.Second
	DefaultCTGCMaxInterval = 30 * time.Minute
	DefaultCTGCBudget      = 16384
)

// WithDefaults fills zero fields.
func (c CTGCConfig) WithDefaults() CTGCConfig {
	if c.Interval == 0 {
		c.Interval = DefaultCTGCInterval
	}
	if c.MinInterval == 0 {
		c.MinInterval = DefaultCTGCMinInterval
	}
	if c.MaxInterval == 0 {
		c.MaxInterval = DefaultCTGCMaxInterval
	}
	if c.Budget == 0 {
		c.Budget = DefaultCTGCBudget
	}
	return c
}

// Validate names the bad field.
func (c CTGCConfig) Validate() error {
	switch {
	case c.Interval < 0:
		return nil // disabled
	case c.MinInterval <= 0 || c.MaxInterval < c.MinInterval:
		return fmt.Errorf("linux datapath: CTGC: MinInterval %v, MaxInterval %v: want 0 < min <= max: %w",
			c.MinInterval, c.MaxInterval, ErrInvalidConfig)
	case c.Budget < 1:
		return fmt.Errorf("linux datapath: CTGC: Budget %d: want at least 1: %w", c.Budget, ErrInvalidConfig)
	}
	return nil
}

// CTGCStats counts the conntrack collector's work.
type CTGCStats struct {
	// Passes and Cycles (passes that reached the map's end) run so far.
	Passes, Cycles uint64
	// Examined and Deleted are entries over all passes.
	Examined, Deleted uint64
	// LastDeleted and LastExamined are the last pass's; Interval is the
	// delay chosen after it.
	LastDeleted, LastExamined int
	Interval                  time.Duration
}

// NextCTGCInterval adapts the interval between conntrack passes to the
// share of dead entries the last pass found (deleted/examined), as
// Cilium's conntrack GC adapts to the share of the map a run deleted:
// above 25% the interval shrinks to (1 - ratio) of itself (at most 10x,
// at 90%), below 5% it grows by half, in between it stays; always within
// [min, max]. A pass that examined nothing keeps the interval.
func NextCTGCInterval(prev time.Duration, deleted, examined int, minI, maxI time.Duration) time.Duration {
	next := prev
	if examined > 0 {
		ratio := float64(deleted) / float64(examined)
		switch {
		case ratio > 0.25:
			next = time.Duration(float64(prev) * (1 - min(ratio, 0.9)))
		case ratio < 0.05:
			next = time.Duration(float64(prev) * 1.5)
		}
	}
	return min(max(next.Round(time.Millisecond), minI), maxI)
}
