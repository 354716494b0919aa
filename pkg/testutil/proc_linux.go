package testutil

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// StartPinned starts cmd from a goroutine locked to its OS thread and
// waits for it there; the returned channel closes once the child has
// exited. A child's Pdeathsig fires when the thread that started it ends,
// not the process, so that thread must outlive the child: the goroutine
// never unlocks it, and the thread ends with the goroutine, after the
// child.
func StartPinned(cmd *exec.Cmd) (<-chan struct{}, error) {
	done := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked (see above)
		defer close(done)
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return done, nil
}

// StartPinned is StartPinned with the child in the namespace: it is
// started, and waited for, from a thread that entered ns (the child
// inherits the thread's netns) and ends with the child.
func (ns *NS) StartPinned(cmd *exec.Cmd) (<-chan struct{}, error) {
	done := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		defer close(done)
		err := ns.Do(func() error {
			if err := cmd.Start(); err != nil {
				return err
			}
			started <- nil
			return cmd.Wait()
		})
		if cmd.Process == nil { // not started: the netns or Start failed
			started <- err
		}
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return done, nil
}

// Stop sends p SIGTERM and waits until exited closes; after grace it
// sends SIGKILL and waits again.
func Stop(p *os.Process, exited <-chan struct{}, grace time.Duration) {
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = p.Kill()
		<-exited
	}
}

// clockTicks is the unit of /proc/<pid>/stat's times (USER_HZ, 100 on
// every Linux architecture Go supports).
const clockTicks = 100

// ProcessCPU is process pid's user and system CPU time so far, all its
// threads (/proc/<pid>/stat; its waited-for children not included), at
// 10 ms resolution: what a benchmark reads of a process it started (an
// etcd, an API server) before and after a run.
func ProcessCPU(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("process cpu: %w", err)
	}
	// The command name, in parentheses, may hold spaces: the fields
	// start after its last ')' with field 3 (state); utime and stime are
	// fields 14 and 15.
	i := bytes.LastIndexByte(raw, ')')
	f := strings.Fields(string(raw[i+1:]))
	if i < 0 || len(f) < 13 {
		return 0, fmt.Errorf("process cpu: /proc/%d/stat: unexpected format", pid)
	}
	var ticks uint64
	for _, s := range f[11:13] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("process cpu: /proc/%d/stat: %w", pid, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}
