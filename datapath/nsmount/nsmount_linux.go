// Package nsmount removes the bind mounts that keep named network
// namespaces alive (`ip netns`, CNI_NETNS paths, the health endpoint's
// netns). It imports nothing of Membrane, so test helpers can use it too.
package nsmount

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Limits of Remove. A path holds one mount per bind, and mount
// propagation from another mount namespace (a peer of a shared mount, as
// container runtimes and `unshare -m` make all the time) can stack more
// copies on it; maxStacked bounds the unmounts per attempt. Attempts are
// retried because the copies can be propagated while we remove (EBUSY
// from unlink means the path is still a mount point here).
const (
	maxStacked = 16
	attempts   = 8
	firstWait  = time.Millisecond
	maxWait    = 100 * time.Millisecond
)

// ErrLeaked is returned by Remove when the path is still there after
// every attempt: something keeps it mounted.
var ErrLeaked = errors.New("network namespace mount still in place")

// Remove lazily unmounts every mount stacked at path and removes the
// file, retrying while it is busy. A missing path is success. Copies of
// the mount held by other mount namespaces do not stop it (they go when
// their namespace does). Returns ErrLeaked (with the last error) if the
// path could not be removed.
func Remove(path string) error {
	var last error
	wait := firstWait
	for i := range attempts {
		if i > 0 {
			time.Sleep(wait)
			wait = min(2*wait, maxWait)
		}
		if err := unmountAll(path); errors.Is(err, errIsDir) {
			return err
		} else if err != nil {
			last = err
			continue
		}
		err := os.Remove(path)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("remove netns %s: %w", path, err)
		}
		last = err
	}
	return fmt.Errorf("remove netns %s after %d attempts: %w: %w", path, attempts, ErrLeaked, last)
}

// unmountAll lazily unmounts path until it is no mount point.
// errIsDir is unmountAll's refusal of a directory.
var errIsDir = errors.New("a directory, not a namespace file")

func unmountAll(path string) error {
	// A directory is never a namespace's file: unmounting it would take
	// a mount point such as /run/netns itself (a path built from an
	// empty name) away from every test and runtime on the machine.
	if fi, err := os.Lstat(path); err == nil && fi.IsDir() {
		return fmt.Errorf("unmount netns %s: %w", path, errIsDir)
	}
	for range maxStacked {
		err := unix.Unmount(path, unix.MNT_DETACH)
		switch {
		case err == nil:
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not (or no longer) a mount point
		default:
			return fmt.Errorf("unmount netns %s: %w", path, err)
		}
	}
	return fmt.Errorf("unmount netns %s: more than %d mounts stacked: %w", path, maxStacked, unix.EBUSY)
}
