package testutil

import (
	"os"
	"os/exec"
	"runtime"
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
