package cni

import (
	"encoding/json"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// PhasesEnv names the file to which the plugin appends one JSON line
// (PhaseRecord) per ADD or DEL with the wall-clock time of each phase.
// Unset (the normal case) records nothing. make bench-cni sets it to
// print where an ADD's time goes.
const PhasesEnv = "MEMBRANE_CNI_PHASES"

// ProcessStart is when the plugin's main package started (after the Go
// runtime and every imported package initialised); cmd/membrane-cni sets
// it first thing in main.
var ProcessStart time.Time

// PhaseRecord is one call's phases: Command, ContainerID and IfName
// name the call; Start is ProcessStart and End when the plugin finished,
// both in Unix nanoseconds, so a caller that knows when it exec'd the
// plugin and when the plugin exited can account for the process start
// and exit. Phases are the plugin's steps in order, in microseconds.
type PhaseRecord struct {
	Command     string  `json:"command"`
	ContainerID string  `json:"containerID"`
	IfName      string  `json:"ifName"`
	Start       int64   `json:"start"`
	End         int64   `json:"end"`
	Phases      []Phase `json:"phases"`
	// Agent is the agent's steps of the call, from its answer's
	// Server-Timing header (POST /v1/attach), in microseconds.
	Agent  []Phase `json:"agent,omitempty"`
	Failed bool    `json:"failed,omitempty"`
	// Threads is how many OS threads the plugin had when it finished:
	// each must be scheduled once more to exit before the runtime sees
	// the plugin gone, which a loaded machine makes slow.
	Threads int `json:"threads,omitempty"`
	// MinorFaults is the plugin's page faults when it finished
	// (getrusage). (No peak RSS: getrusage's carries the peak of the
	// memory the exec replaced, the runtime's that forked it.)
	MinorFaults int64 `json:"minorFaults,omitempty"`
}

// Phase is one named step of a call and how long it took.
type Phase struct {
	Name string `json:"name"`
	Us   int64  `json:"us"`
}

// phaseTimer keeps the phases of one call when PhasesEnv is set; a nil
// timer records nothing.
type phaseTimer struct {
	path string
	rec  PhaseRecord
	last time.Time
}

func newPhaseTimer(command, containerID, ifName string) *phaseTimer {
	path := os.Getenv(PhasesEnv)
	if path == "" {
		return nil
	}
	start := ProcessStart
	if start.IsZero() {
		start = time.Now()
	}
	return &phaseTimer{path: path, last: start, rec: PhaseRecord{
		Command: command, ContainerID: containerID, IfName: ifName, Start: start.UnixNano(),
	}}
}

// mark ends the phase called name (it began where the previous one
// ended, or at ProcessStart).
func (t *phaseTimer) mark(name string) {
	if t == nil {
		return
	}
	now := time.Now()
	t.rec.Phases = append(t.rec.Phases, Phase{Name: name, Us: now.Sub(t.last).Microseconds()})
	t.last = now
}

// agent records the agent's steps from a Server-Timing value.
func (t *phaseTimer) agent(timing string) {
	if t == nil {
		return
	}
	t.rec.Agent = parseServerTiming(timing)
}

// parseServerTiming reads the name;dur=<ms> entries of a Server-Timing
// value (W3C Server Timing); entries without a duration, or with one
// that is not a number of milliseconds, are left out.
func parseServerTiming(v string) []Phase {
	var out []Phase
	for _, entry := range strings.Split(v, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(entry), ";")
		if name == "" {
			continue
		}
		for _, p := range strings.Split(params, ";") {
			k, val, _ := strings.Cut(strings.TrimSpace(p), "=")
			if !strings.EqualFold(k, "dur") {
				continue
			}
			if d, err := strconv.ParseFloat(val, 64); err == nil && d >= 0 && d < 1e9 {
				out = append(out, Phase{Name: name, Us: int64(d * 1000)})
			}
			break
		}
	}
	return out
}

// write appends the record; failing to is only reported (timing must
// never fail a call).
func (t *phaseTimer) write(failed bool) {
	if t == nil {
		return
	}
	t.rec.End, t.rec.Failed = time.Now().UnixNano(), failed
	t.rec.Threads = osThreads()
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		t.rec.MinorFaults = ru.Minflt
	}
	line, err := json.Marshal(&t.rec)
	if err != nil {
		return
	}
	f, err := os.OpenFile(t.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		warnf("%s: %v", PhasesEnv, err)
		return
	}
	defer f.Close()
	// One write of the whole line: O_APPEND keeps concurrent calls'
	// lines whole.
	if _, err := f.Write(append(line, '\n')); err != nil {
		warnf("%s: %v", PhasesEnv, err)
	}
}

// osThreads is the process's thread count: the runtime's threadcreate
// profile has one record per OS thread it has (no /proc read: the plugin
// touches no more of /proc than a plugin without phase records; and not
// runtime/metrics, whose package init alone cost every plugin exec
// ~0.2 ms of CPU whether phases are recorded or not).
func osThreads() int {
	n, _ := runtime.ThreadCreateProfile(nil)
	return n
}
