package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsDir is where iproute2 (`ip netns`) keeps named network namespaces,
// so that `ip netns exec NAME` works on the namespaces made here.
const netnsDir = "/var/run/netns"

// NS is a named network namespace made by NewNS.
type NS struct {
	// Name is the namespace's name under /var/run/netns.
	Name string
	// Path is the bind mount that keeps it alive (what CNI_NETNS names).
	Path string
}

// RandomSuffix returns n random hex characters, for names of namespaces,
// links and containers that must not collide with parallel test packages.
func RandomSuffix(n int) string {
	b := make([]byte, (n+1)/2)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)[:n]
}

// NewNS creates a network namespace named prefix-<random>, with its
// loopback up, and registers its removal with tb.Cleanup. Links inside
// it die with it.
func NewNS(tb testing.TB, prefix string) *NS {
	tb.Helper()
	name := prefix + "-" + RandomSuffix(8)
	ns, err := CreateNS(name)
	if err != nil {
		tb.Fatalf("create netns: %v", err)
	}
	tb.Cleanup(func() {
		if err := ns.Remove(); err != nil {
			tb.Errorf("remove netns %s: %v", ns.Name, err)
		}
	})
	return ns
}

// CreateNS creates the named network namespace with its loopback up. The
// caller removes it with Remove.
func CreateNS(name string) (*NS, error) {
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	if err := sharedMountPoint(netnsDir); err != nil {
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	return CreateNSAt(filepath.Join(netnsDir, name))
}

// sharedMountPoint makes dir a shared mount point, as `ip netns add`
// does with /run/netns before its first namespace. Without it, the
// namespaces' mounts sit on the parent filesystem's directory, and the
// first `ip netns` call afterwards (from any tool on the machine) binds
// the directory onto itself recursively: every earlier mount is then
// hidden beneath a copy, and Remove can neither unmount nor unlink it
// (EBUSY), leaking the namespaces. Idempotent.
func sharedMountPoint(dir string) error {
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == nil || !errors.Is(err, unix.EINVAL) {
		return err // EINVAL: dir is no mount point yet
	}
	if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s onto itself: %w", dir, err)
	}
	if err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", dir, err)
	}
	return nil
}

// CreateNSAt creates a network namespace kept alive by a bind mount at
// path (a file it creates; the directory must exist), named after the
// file, with its loopback up. The caller removes it with Remove.
func CreateNSAt(path string) (*NS, error) {
	name := filepath.Base(path)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	f.Close()
	ns := &NS{Name: name, Path: path}
	errc := make(chan error, 1)
	// The thread that unshares is left locked, so Go discards it when the
	// goroutine exits instead of reusing a thread in the wrong namespace.
	go func() {
		runtime.LockOSThread()
		errc <- unshareAndMount(path)
	}()
	if err := <-errc; err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	if err := ns.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}); err != nil {
		_ = ns.Remove()
		return nil, fmt.Errorf("create netns %s: loopback up: %w", name, err)
	}
	return ns, nil
}

func unshareAndMount(path string) error {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
	if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount: %w", err)
	}
	return nil
}

// Remove unmounts and deletes the namespace: every stacked mount,
// lazily, retried while busy, so copies of the mount in other mount
// namespaces do not stop it. Removing a removed one is success; an error
// means the namespace's file is still there. (The same steps as
// datapath/nsmount.Remove, which testutil may not import.)
func (ns *NS) Remove() error {
	var last error
	wait := time.Millisecond
	for i := range removeAttempts {
		if i > 0 {
			time.Sleep(wait)
			wait = min(2*wait, 100*time.Millisecond)
		}
		if err := unmountAll(ns.Path); errors.Is(err, errIsDir) {
			return err
		} else if err != nil {
			last = err
			continue
		}
		err := os.Remove(ns.Path)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("remove netns %s: %w", ns.Path, err)
		}
		last = err
	}
	return fmt.Errorf("remove netns %s: still mounted after %d attempts: %w", ns.Path, removeAttempts, last)
}

// removeAttempts bounds NS.Remove's retries while the path is busy.
const removeAttempts = 8

// unmountAll lazily unmounts path until it is no mount point (at most 16
// stacked mounts).
// errIsDir is unmountAll's refusal of a directory.
var errIsDir = errors.New("a directory, not a namespace file")

func unmountAll(path string) error {
	// A directory is never a namespace's file: unmounting it would take
	// a mount point such as /run/netns itself (a path built from an
	// empty name) away from every test and runtime on the machine.
	if fi, err := os.Lstat(path); err == nil && fi.IsDir() {
		return fmt.Errorf("unmount netns %s: %w", path, errIsDir)
	}
	for range 16 {
		err := unix.Unmount(path, unix.MNT_DETACH)
		switch {
		case err == nil:
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		default:
			return fmt.Errorf("unmount netns %s: %w", path, err)
		}
	}
	return fmt.Errorf("unmount netns %s: more than 16 mounts stacked: %w", path, unix.EBUSY)
}

// Handle opens the namespace; the caller closes it.
func (ns *NS) Handle() (netns.NsHandle, error) {
	h, err := netns.GetFromPath(ns.Path)
	if err != nil {
		return h, fmt.Errorf("open netns %s: %w", ns.Name, err)
	}
	return h, nil
}

// Netlink returns a netlink handle bound to the namespace, closed by
// tb.Cleanup.
func (ns *NS) Netlink(tb testing.TB) *netlink.Handle {
	tb.Helper()
	h, err := ns.Handle()
	if err != nil {
		tb.Fatal(err)
	}
	defer h.Close()
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		tb.Fatalf("netlink handle in %s: %v", ns.Name, err)
	}
	tb.Cleanup(nl.Close)
	return nl
}

// Do runs fn on a locked OS thread inside the namespace. Processes that
// fn starts (exec) start in the namespace too. The thread is discarded
// afterwards rather than switched back.
func (ns *NS) Do(fn func() error) error {
	h, err := ns.Handle()
	if err != nil {
		return err
	}
	defer h.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(h); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", ns.Name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Exec runs a command inside the namespace (like `ip netns exec`) and
// returns its combined output.
func (ns *NS) Exec(name string, args ...string) (string, error) {
	var out []byte
	err := ns.Do(func() error {
		var err error
		out, err = exec.Command(name, args...).CombinedOutput()
		return err
	})
	if err != nil {
		return string(out), fmt.Errorf("%s %s in %s: %w: %s", name, strings.Join(args, " "), ns.Name, err, out)
	}
	return string(out), nil
}
