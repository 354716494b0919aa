package sim

import (
	"math"
	"strings"
	"testing"
)

// TestResourceSlopes: the fit over the churn phase's readings gives the
// growth per minute (a leak of 10 goroutines and 1 MiB of heap a minute,
// flat fds), ignoring other phases and samples without readings.
func TestResourceSlopes(t *testing.T) {
	var tl []Sample
	tl = append(tl, Sample{T: 0, Phase: "ramp-up", Resources: &Resources{Goroutines: 9999}})
	for i := range 10 { // the first half, warming up: ignored
		tl = append(tl, Sample{T: float64(i) - 20, Phase: "churn", Resources: &Resources{Goroutines: 5000 * i}})
	}
	for i := range 10 {
		min := float64(i)
		tl = append(tl, Sample{T: min * 60, Phase: "churn", Resources: &Resources{Goroutines: 100 + 10*i, HeapBytes: uint64(50<<20 + i<<20), FDs: 40, Pins: -1}})
		tl = append(tl, Sample{T: min*60 + 1, Phase: "churn"})
	}
	tl = append(tl, Sample{T: 700, Phase: "drain", Resources: &Resources{Goroutines: 0}})
	rs := resourceSlopes(tl)
	if rs == nil || rs.Samples != 10 {
		t.Fatalf("slopes %+v, want 10 readings", rs)
	}
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-6*math.Max(1, math.Abs(want)) }
	if !near(rs.GoroutinesPerMinute, 10) || !near(rs.HeapPerMinute, 1<<20) || !near(rs.FDsPerMinute, 0) || !near(rs.PinsPerMinute, 0) {
		t.Fatalf("slopes %+v", rs)
	}
	if rs.First.Goroutines != 100 || rs.Last.Goroutines != 190 {
		t.Fatalf("first %d last %d", rs.First.Goroutines, rs.Last.Goroutines)
	}
	if len(rs.Growing) != 1 || !strings.HasPrefix(rs.Growing[0], "goroutines +90") {
		t.Fatalf("growing %q, want the goroutines only (+90 over 9 min is over the floor of 50; the heap's +9 MiB is under its floor)", rs.Growing)
	}
	if resourceSlopes(tl[:5]) != nil {
		t.Fatal("a fit from fewer than 3 readings")
	}
}

// TestResourceSlopesNoise: readings that swing with the work in flight
// (fds of the ADDs at the moment of each reading) are not a leak, even
// when their fit happens to slope up.
func TestResourceSlopesNoise(t *testing.T) {
	fds := []int{663, 618, 522, 595, 720, 535, 732, 690, 646, 624, 749, 583, 605, 609, 703, 707, 648, 755}
	var tl []Sample
	for i, fd := range fds {
		tl = append(tl, Sample{T: float64(5 * i), Phase: "churn", Resources: &Resources{FDs: fd, Goroutines: 300, Pins: 230}})
	}
	rs := resourceSlopes(tl)
	if rs == nil || len(rs.Growing) != 0 {
		t.Fatalf("noise judged growing: %+v", rs)
	}
}
