package sim

import (
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
)

// resourceEvery is how many samples apart the resources are read (a
// walk of the state directory per read).
const resourceEvery = 5

// Resources is what a soak watches for growth: the process's heap and
// goroutines (agent and harness share the process), its open file
// descriptors, the state directory's size, the datapath's pinned objects
// (-1 without a kernel datapath) and the kernel's slab (system-wide: other
// load on the machine moves it).
type Resources struct {
	// HeapBytes is the live heap as the last GC marked it (garbage not
	// yet collected would make a saw, not a slope).
	HeapBytes     uint64 `json:"heap_bytes"`
	Goroutines    int    `json:"goroutines"`
	FDs           int    `json:"fds"`
	StateDirBytes int64  `json:"state_dir_bytes"`
	Pins          int    `json:"pins"`
	SlabBytes     uint64 `json:"slab_bytes"`
}

// resourceDirs is a target whose state directory and bpffs can be read.
type resourceDirs interface {
	stateDir() string
	bpffsDir() string // "" without a kernel datapath
}

func (p *inProcess) stateDir() string { return p.cfg.StateDir }
func (p *inProcess) bpffsDir() string { return "" }

func (t *linuxTarget) bpffsDir() string { return t.env.bpffs }

// readResources reads the process's and the target's resources.
func (e *engine) readResources() *Resources {
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(live)
	r := &Resources{HeapBytes: live[0].Value.Uint64(), Goroutines: runtime.NumGoroutine(), FDs: countEntries("/proc/self/fd"), Pins: -1,
		SlabBytes: meminfo("Slab")}
	if d, ok := e.tgt.(resourceDirs); ok {
		r.StateDirBytes = dirBytes(d.stateDir())
		if b := d.bpffsDir(); b != "" {
			r.Pins = countFiles(b)
		}
	}
	return r
}

func countEntries(dir string) int {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return -1
	}
	return len(ents)
}

// dirBytes is the size of the regular files under dir.
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a file removed during the walk
		}
		if d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// countFiles counts the non-directory entries under dir (pins).
func countFiles(dir string) int {
	n := 0
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return nil
	})
	return n
}

// meminfo is a /proc/meminfo field in bytes (0 when absent).
func meminfo(field string) uint64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, field+":"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				if v, err := strconv.ParseUint(f[0], 10, 64); err == nil {
					return v * 1024
				}
			}
		}
	}
	return 0
}

// ResourceSlopes are the churn phase's resources as least-squares slopes
// per minute, with the first and last reading: a soak passes when they
// are flat (the growth over the phase small against the level).
type ResourceSlopes struct {
	Samples int     `json:"samples"`
	Minutes float64 `json:"minutes"`
	// Growing names what grew beyond noise over the fitted span (empty:
	// flat).
	Growing []string  `json:"growing"`
	First   Resources `json:"first"`
	Last    Resources `json:"last"`
	// PerMinute: heap and state directory and slab in bytes, the others
	// in counts.
	HeapPerMinute       float64 `json:"heap_bytes_per_minute"`
	GoroutinesPerMinute float64 `json:"goroutines_per_minute"`
	FDsPerMinute        float64 `json:"fds_per_minute"`
	StateDirPerMinute   float64 `json:"state_dir_bytes_per_minute"`
	PinsPerMinute       float64 `json:"pins_per_minute"`
	SlabPerMinute       float64 `json:"slab_bytes_per_minute"`
}

// resourceSlopes fits the second half of the churn phase's readings
// (the first half warms up: the index's trees, the journal and the
// runtime's pools grow to their working size) — nil with fewer than 3.
func resourceSlopes(tl []Sample) *ResourceSlopes {
	var all []Sample
	for _, s := range tl {
		if s.Phase == phaseNames[phaseChurn] && s.Resources != nil {
			all = append(all, s)
		}
	}
	pts := all[len(all)/2:]
	if len(pts) < 3 {
		return nil
	}
	se := map[string]float64{}
	fitNamed := func(name string, v func(*Resources) float64) float64 {
		slope, stderr := fitLine(pts, v)
		se[name] = stderr
		return slope
	}
	fit := func(v func(*Resources) float64) float64 { s, _ := fitLine(pts, v); return s }
	rs := &ResourceSlopes{Samples: len(pts), First: *pts[0].Resources, Last: *pts[len(pts)-1].Resources,
		Minutes:             (pts[len(pts)-1].T - pts[0].T) / 60,
		HeapPerMinute:       fitNamed("heap bytes", func(r *Resources) float64 { return float64(r.HeapBytes) }),
		GoroutinesPerMinute: fitNamed("goroutines", func(r *Resources) float64 { return float64(r.Goroutines) }),
		FDsPerMinute:        fitNamed("fds", func(r *Resources) float64 { return float64(r.FDs) }),
		StateDirPerMinute:   fitNamed("state dir bytes", func(r *Resources) float64 { return float64(r.StateDirBytes) }),
		PinsPerMinute:       fitNamed("pins", func(r *Resources) float64 { return float64(r.Pins) }),
		SlabPerMinute:       fit(func(r *Resources) float64 { return float64(r.SlabBytes) }),
	}
	rs.Growing = rs.growing(se)
	return rs
}

// fitLine is the least-squares slope of v over the readings, per
// minute, and its standard error (0 with a perfect fit).
func fitLine(pts []Sample, v func(*Resources) float64) (slope, stderr float64) {
	xs, ys := make([]float64, len(pts)), make([]float64, len(pts))
	for i, p := range pts {
		xs[i], ys[i] = p.T/60, v(p.Resources)
	}
	f := fitXY(xs, ys)
	return f.Slope, f.Stderr
}

// Fit is a least-squares line y = Intercept + Slope*x over Points
// readings; Stderr is the slope's standard error (0 with a perfect fit
// or fewer than three points).
type Fit struct {
	Slope     float64 `json:"slope"`
	Intercept float64 `json:"intercept"`
	Stderr    float64 `json:"stderr"`
	Points    int     `json:"points"`
}

// fitXY fits a line to the points (xs[i], ys[i]); all zero with fewer
// than two points or when every x is the same.
func fitXY(xs, ys []float64) Fit {
	n := float64(len(xs))
	if len(xs) < 2 || len(ys) != len(xs) {
		return Fit{Points: len(xs)}
	}
	var sx, sy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
	}
	mx, my := sx/n, sy/n
	var sxx, sxy float64
	for i := range xs {
		dx := xs[i] - mx
		sxx += dx * dx
		sxy += dx * (ys[i] - my)
	}
	if sxx == 0 {
		return Fit{Points: len(xs)}
	}
	f := Fit{Slope: sxy / sxx, Points: len(xs)}
	f.Intercept = my - f.Slope*mx
	var ss float64
	for i := range xs {
		r := ys[i] - (f.Intercept + f.Slope*xs[i])
		ss += r * r
	}
	if n > 2 {
		f.Stderr = math.Sqrt(ss / (n - 2) / sxx)
	}
	if math.IsNaN(f.Slope) || math.IsNaN(f.Stderr) {
		return Fit{Points: len(xs)}
	}
	return f
}

// growing names the resources whose fitted growth over the fitted span
// exceeds the larger of 10% of their first reading and a floor (what
// caches move without a leak) and whose slope is beyond three standard
// errors (a trend, not the noise of ADDs in flight at the readings). The
// system-wide slab is reported, not judged: other load on the machine
// moves it.
func (rs *ResourceSlopes) growing(se map[string]float64) []string {
	var out []string
	check := func(name string, perMin, first, floor float64) {
		if growth := perMin * rs.Minutes; growth > math.Max(0.1*first, floor) && perMin > 3*se[name] {
			out = append(out, fmt.Sprintf("%s %+.0f over %.1f min (from %.0f)", name, growth, rs.Minutes, first))
		}
	}
	check("heap bytes", rs.HeapPerMinute, float64(rs.First.HeapBytes), 16<<20)
	check("goroutines", rs.GoroutinesPerMinute, float64(rs.First.Goroutines), 50)
	check("fds", rs.FDsPerMinute, float64(rs.First.FDs), 20)
	check("state dir bytes", rs.StateDirPerMinute, float64(rs.First.StateDirBytes), 4<<20)
	if rs.First.Pins >= 0 {
		check("pins", rs.PinsPerMinute, float64(rs.First.Pins), 10)
	}
	return out
}
