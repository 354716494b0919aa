package restore

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// The writer makes tens of thousands of small filesystem calls per second
// under load, so it calls the kernel directly: no fstat, poller
// registration or *os.File per file, and no allocation per call. Paths
// are relative to the state directory's fd (a short lookup), built in the
// caller's stack buffer (pathBuf) and NUL-terminated in place; a full path
// is made only for an error. EINTR is retried as package os does.

// pathBuf holds one relative path: the longest the store makes is
// "trash/65535_next-<13 base-36 digits>/ep_config.h" (a longer one, such
// as an odd name Scan found in the trash, spills to the heap).
type pathBuf [64]byte

// entryPath appends "<id><suffix>" to p.
func entryPath(p []byte, id endpoint.ID, suffix string) []byte {
	return append(strconv.AppendUint(p, uint64(id), 10), suffix...)
}

// filePath appends "<id><suffix>/<name>" to p.
func filePath(p []byte, id endpoint.ID, suffix, name string) []byte {
	return append(append(entryPath(p, id, suffix), '/'), name...)
}

// stateDir is the state directory as an open fd, against which the
// writer's and the janitor's relative paths resolve.
type stateDir struct {
	fd   int
	path string
}

func openStateDir(path string) (stateDir, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return stateDir{fd: -1}, &os.PathError{Op: "open", Path: path, Err: err}
		}
		return stateDir{fd: fd, path: path}, nil
	}
}

func (d stateDir) close() { _ = unix.Close(d.fd) }

// abs is the full path of p, for errors and for os.RemoveAll.
func (d stateDir) abs(p []byte) string { return filepath.Join(d.path, string(p)) }

// call makes a syscall whose first two arguments are the state dir's fd
// and p (NUL-terminated here), retrying EINTR.
func (d stateDir) call(trap uintptr, p []byte, a3, a4, a5 uintptr) (uintptr, error) {
	p = append(p, 0)
	for {
		r, _, e := syscall.Syscall6(trap, uintptr(d.fd), uintptr(unsafe.Pointer(&p[0])), a3, a4, a5, 0)
		switch e {
		case 0:
			return r, nil
		case unix.EINTR:
			continue
		}
		return r, e
	}
}

// call2 makes a rename syscall (renameat or renameat2) from one path to
// another, both relative to the state dir, retrying EINTR.
func (d stateDir) call2(trap uintptr, from, to []byte, flags uintptr) error {
	from, to = append(from, 0), append(to, 0)
	for {
		_, _, e := syscall.Syscall6(trap, uintptr(d.fd), uintptr(unsafe.Pointer(&from[0])),
			uintptr(d.fd), uintptr(unsafe.Pointer(&to[0])), flags, 0)
		switch e {
		case 0:
			return nil
		case unix.EINTR:
			continue
		}
		return e
	}
}

func (d stateDir) mkdir(p []byte) error {
	if _, err := d.call(unix.SYS_MKDIRAT, p, 0o750, 0, 0); err != nil {
		return &os.PathError{Op: "mkdir", Path: d.abs(p), Err: err}
	}
	return nil
}

// rename moves from to to (renameat: renameat2 without flags is not
// implemented by every filesystem on older kernels).
func (d stateDir) rename(from, to []byte) error {
	if err := d.call2(unix.SYS_RENAMEAT, from, to, 0); err != nil {
		return &os.LinkError{Op: "rename", Old: d.abs(from), New: d.abs(to), Err: err}
	}
	return nil
}

// exchange swaps a and b atomically (renameat2 RENAME_EXCHANGE).
func (d stateDir) exchange(a, b []byte) error {
	if err := d.call2(unix.SYS_RENAMEAT2, a, b, unix.RENAME_EXCHANGE); err != nil {
		return &os.LinkError{Op: "exchange", Old: d.abs(a), New: d.abs(b), Err: err}
	}
	return nil
}

// writeFile writes data as the whole content of p (mode 0640 when it
// creates it). An existing file (a reused directory's) of old bytes is
// overwritten in place and cut to length (only if it was longer) rather
// than truncated to zero first: ext4 flushes a file truncated to zero and
// rewritten when it is closed (auto_da_alloc), a synchronous cost per
// file that the group's syncfs pays anyway. Only scratch directories
// (<id>_next) are written.
func (d stateDir) writeFile(p []byte, data []byte, old uint16) error {
	r, err := d.call(unix.SYS_OPENAT, p, unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o640, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: d.abs(p), Err: err}
	}
	fd := int(r)
	for off := 0; off < len(data) && err == nil; {
		var n int
		n, err = unix.Pwrite(fd, data[off:], int64(off))
		switch {
		case errors.Is(err, unix.EINTR):
			n, err = 0, nil
		case err == nil && n == 0:
			err = io.ErrShortWrite
		}
		off += n
	}
	for err == nil && needsTruncate(old, len(data)) {
		if err = unix.Ftruncate(fd, int64(len(data))); !errors.Is(err, unix.EINTR) {
			break
		}
		err = nil
	}
	if cerr := unix.Close(fd); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return &os.PathError{Op: "write", Path: d.abs(p), Err: err}
	}
	return nil
}

// removeStateDir deletes one endpoint state directory p: its two files
// and itself (three calls), or whatever it holds when that is not all.
// Missing is success.
func (d stateDir) removeStateDir(p []byte) error {
	n := len(p)
	for _, name := range []string{stateFile, headerFile} {
		_, _ = d.call(unix.SYS_UNLINKAT, append(append(p[:n], '/'), name...), 0, 0, 0)
	}
	_, err := d.call(unix.SYS_UNLINKAT, p[:n], unix.AT_REMOVEDIR, 0, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return os.RemoveAll(d.abs(p[:n]))
}
