package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// The agent's pins under LinuxConfig.BPFFS are what a restarted agent
// adopts (the shared maps with the conntrack and ipcache entries, the
// node's programs, each endpoint's policy maps); the kernel objects
// themselves live on while the agent holds them and the cls_bpf filters
// run the programs. An operator's cleanup (rm -rf of the directory) or a
// node agent that mounts a fresh bpffs over it removes the pins under a
// running agent: nothing changes for traffic at once, but the next start
// would make new, empty maps. The pin check finds such pins missing and
// pins the objects it holds again (checkPins), so enforcement and a
// restart's adoption are as before.

// pinnable is a kernel object the agent holds that can be pinned (a
// clone is pinned: the held object keeps its own pin path).
type pinnable interface {
	pinClone(path string) error
}

type pinMap struct{ m *ebpf.Map }

func (p pinMap) pinClone(path string) error {
	c, err := p.m.Clone()
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Pin(path)
}

// pinLink pins a held link again: links have no clone, so the held
// object's own pin path (gone, or it would not be repaired) is dropped
// first.
type pinLink struct{ l link.Link }

func (p pinLink) pinClone(path string) error {
	if err := p.l.Unpin(); err != nil {
		return err
	}
	return p.l.Pin(path)
}

type pinProg struct{ p *ebpf.Program }

func (p pinProg) pinClone(path string) error {
	c, err := p.p.Clone()
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Pin(path)
}

// expectedPins are the pins the agent's objects should have: the shared
// maps, the node's endpoint programs, every realised endpoint's policy
// maps and TCX links, the host endpoint's policy maps, the shared
// devices' and the cgroup's links and the overlay's maps. The caller holds b.mu (an endpoint's
// objects are closed only after it left b.eps, under b.mu).
func (b *bpfState) expectedPinsLocked() map[string]pinnable {
	want := map[string]pinnable{}
	for _, m := range append(b.maps.named(), b.maps.lb.named()...) {
		if *m.dst == nil {
			continue
		}
		pin := m.pin
		if pin == "" {
			pin = m.name
		}
		want[filepath.Join(b.dir, pin)] = pinMap{*m.dst}
	}
	progDir := filepath.Join(b.dir, pinProgramsDir, b.tmpl.digest)
	if b.progs.from != nil && b.progs.to != nil {
		want[filepath.Join(progDir, pinProgFrom)] = pinProg{b.progs.from}
		want[filepath.Join(progDir, pinProgTo)] = pinProg{b.progs.to}
	}
	for path, lk := range b.held {
		want[path] = pinLink{lk}
	}
	for path, m := range b.mapPins {
		want[path] = pinMap{m}
	}
	if b.host != nil {
		dir := filepath.Join(b.dir, pinHostDir)
		want[filepath.Join(dir, pinPolicy)] = pinMap{b.host.policyMap}
		want[filepath.Join(dir, pinCIDR)] = pinMap{b.host.cidrMap}
	}
	for id, e := range b.eps {
		dir := b.endpointDir(id)
		if e.policyMap != nil {
			want[filepath.Join(dir, pinPolicy)] = pinMap{e.policyMap}
		}
		if e.cidrMap != nil {
			want[filepath.Join(dir, pinCIDR)] = pinMap{e.cidrMap}
		}
		for i, lk := range e.links {
			if lk != nil {
				want[filepath.Join(dir, hooks[i].pin)] = pinLink{lk}
			}
		}
	}
	return want
}

// maxExamples bounds PinRepair.Examples.
const maxExamples = 5

// checkPins pins again every object of the agent whose pin is missing,
// making the directories (and, below /sys/fs/bpf, mounting a bpffs, as
// Init does) first. Returns a report with Missing 0 when all were there.
func (b *bpfState) checkPins() PinRepair {
	start := time.Now()
	rep := PinRepair{Dir: b.dir}
	b.mu.Lock()
	defer b.mu.Unlock()
	want := b.expectedPinsLocked()
	var missing []string
	for path := range want {
		if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
			missing = append(missing, path)
		}
	}
	if len(missing) == 0 {
		return rep
	}
	rep.Missing = len(missing)
	if err := ensureBPFFS(b.dir); err != nil {
		rep.Err = err
	}
	var errs []error
	for _, path := range missing {
		if rel, err := filepath.Rel(b.dir, path); err == nil && len(rep.Examples) < maxExamples {
			rep.Examples = append(rep.Examples, rel)
		}
		if rep.Err != nil {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			errs = append(errs, fmt.Errorf("pin again %s: %w", path, err))
			continue
		}
		if err := want[path].pinClone(path); err != nil && !errors.Is(err, os.ErrExist) {
			errs = append(errs, fmt.Errorf("pin again %s: %w", path, err))
			continue
		}
		rep.Repinned++
	}
	if rep.Err == nil {
		rep.Err = errors.Join(errs...)
	}
	rep.Took = time.Since(start)
	return rep
}

// pinCheckLoop runs checkPins every interval until stop closes, and
// reports what each check that found pins missing did.
func (l *Linux) pinCheckLoop(interval time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		var rep PinRepair
		err := l.guardBPF(func(b *bpfState) error {
			rep = b.checkPins()
			return nil
		})
		if errors.Is(err, ErrClosed) {
			return
		}
		if rep.Missing == 0 {
			continue
		}
		l.notePinRepair(rep)
	}
}

// notePinRepair logs and reports a pin check that found pins missing.
func (l *Linux) notePinRepair(rep PinRepair) {
	l.mu.Lock()
	l.pins.checks++
	l.pins.last = rep
	l.pins.lastAt = time.Now()
	l.pins.repinned += rep.Repinned
	hook := l.hooks.OnPinRepair
	l.mu.Unlock()
	if rep.Err != nil {
		l.log.Error("bpf pins removed under the agent; pinning them again failed (retried at the next check)",
			"bpffs", rep.Dir, "missing", rep.Missing, "repinned", rep.Repinned, "examples", rep.Examples, "err", rep.Err)
	} else {
		l.log.Warn("bpf pins removed under the agent; pinned again from the objects the agent holds",
			"bpffs", rep.Dir, "missing", rep.Missing, "repinned", rep.Repinned, "examples", rep.Examples, "took", rep.Took)
	}
	if hook != nil {
		hook(rep)
	}
}

// pinHealth is what the pin checks found (Linux.PinStatus).
type pinHealth struct {
	checks   int // checks that found pins missing
	repinned int // pins made again, in all
	last     PinRepair
	lastAt   time.Time
}

// PinStatus reports the pin checks (PinStatusReader).
func (l *Linux) PinStatus() PinStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	return PinStatus{Dir: l.cfg.BPFFS, Interval: l.cfg.PinCheckInterval, Healthy: l.pins.last.Err == nil,
		Repairs: l.pins.checks, Repinned: l.pins.repinned, Last: l.pins.last, LastAt: l.pins.lastAt}
}

var _ PinStatusReader = (*Linux)(nil)
