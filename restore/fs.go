package restore

import (
	"errors"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// The writer makes tens of thousands of small filesystem calls per second
// under load; these wrappers call the kernel directly (no fstat, poller
// registration or *os.File per file) and retry EINTR like package os.

func ignoringEINTR(fn func() error) error {
	for {
		if err := fn(); !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

func openDir(path string) (int, error) {
	var fd int
	err := ignoringEINTR(func() (err error) {
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

func closeFd(fd int) { _ = unix.Close(fd) }

func mkdir(path string) error {
	if err := ignoringEINTR(func() error { return unix.Mkdir(path, 0o750) }); err != nil {
		return &os.PathError{Op: "mkdir", Path: path, Err: err}
	}
	return nil
}

func rename(from, to string) error {
	if err := ignoringEINTR(func() error { return unix.Rename(from, to) }); err != nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
	return nil
}

func renameExchange(a, b string) error {
	err := ignoringEINTR(func() error {
		return unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE)
	})
	if err != nil {
		return &os.LinkError{Op: "exchange", Old: a, New: b, Err: err}
	}
	return nil
}

// writeFile writes data as the whole content of path (mode 0640 when it
// creates it). An existing file (a reused directory's) is overwritten in
// place and cut to length rather than truncated to zero first: ext4
// flushes a file truncated to zero and rewritten when it is closed
// (auto_da_alloc), a synchronous cost per file that the group's syncfs
// pays anyway. Only scratch directories (<id>_next) are written.
func writeFile(path string, data []byte) error {
	var fd int
	err := ignoringEINTR(func() (err error) {
		fd, err = unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o640)
		return err
	})
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	for off := 0; off < len(data) && err == nil; {
		var n int
		err = ignoringEINTR(func() (err error) { n, err = unix.Pwrite(fd, data[off:], int64(off)); return err })
		off += n
	}
	if err == nil {
		err = ignoringEINTR(func() error { return unix.Ftruncate(fd, int64(len(data))) })
	}
	if cerr := unix.Close(fd); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return &os.PathError{Op: "write", Path: path, Err: err}
	}
	return nil
}

// removeStateDir deletes one endpoint state directory: its two files and
// itself (three calls), or whatever it holds when that is not all.
// Missing is success.
func removeStateDir(dir string) error {
	for _, name := range []string{stateFile, headerFile} {
		_ = unix.Unlink(filepath.Join(dir, name))
	}
	err := ignoringEINTR(func() error { return unix.Rmdir(dir) })
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return os.RemoveAll(dir)
}
