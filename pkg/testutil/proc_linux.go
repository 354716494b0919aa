package testutil

import (
	"os/exec"
	"runtime"
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
