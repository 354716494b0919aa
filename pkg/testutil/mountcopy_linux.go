package testutil

import (
	"bufio"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// SharedDir returns a temporary directory bind-mounted onto itself as a
// shared mount (what iproute2 makes of /run/netns), unmounted at cleanup.
// Namespaces made in it with CreateNSAt can be copied into other mount
// namespaces without touching the machine's /run/netns.
func SharedDir(tb testing.TB) string {
	tb.Helper()
	dir := tb.TempDir()
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		tb.Fatalf("bind %s: %v", dir, err)
	}
	tb.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			tb.Errorf("unmount %s: %v", dir, err)
		}
	})
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		tb.Fatalf("make %s shared: %v", dir, err)
	}
	return dir
}

// HoldMountCopy starts a process in a new mount namespace (`unshare -m`,
// propagation unchanged: a peer of SharedDir's mount) that binds the
// mount at path onto itself and sleeps, as container runtimes' mount
// namespaces hold copies of a node's netns mounts. The new mount
// propagates back, so path holds two stacked mounts here. The process is
// killed at cleanup. Needs util-linux (unshare, mount).
func HoldMountCopy(tb testing.TB, path string) {
	tb.Helper()
	StartMountNSHolder(tb, "unchanged", `mount --bind "$0" "$0" && echo ready && exec sleep 600`, path)
}

// MountsAt counts the mounts of this mount namespace whose mount point is
// path.
func MountsAt(tb testing.TB, path string) int {
	tb.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		tb.Fatal(err)
	}
	n := 0
	for line := range strings.SplitSeq(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			n++
		}
	}
	return n
}

// HoldHostMountNS starts a process in a private copy of this process's
// mount namespace (`unshare -m --propagation private`), as a parallel
// test or a container runtime makes one: it holds a copy of every mount
// there at that moment until it is killed at cleanup.
func HoldHostMountNS(tb testing.TB) {
	tb.Helper()
	StartMountNSHolder(tb, "private", "echo ready && exec sleep 600")
}

// StartMountNSHolder runs script (sh -c, with args as $0...) in a new
// mount namespace (`unshare -m --propagation propagation`), waits until
// it prints "ready", and returns its PID; the process is killed at
// cleanup. The script ends in a sleep that holds the namespace. Needs
// util-linux (unshare, mount).
func StartMountNSHolder(tb testing.TB, propagation, script string, args ...string) int {
	tb.Helper()
	for _, tool := range []string{"unshare", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			tb.Fatalf("%s (util-linux) is needed: %v", tool, err)
		}
	}
	holder := exec.Command("unshare", append([]string{"-m", "--propagation", propagation, "sh", "-c", script}, args...)...)
	out, err := holder.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	holder.Stderr = os.Stderr
	if err := holder.Start(); err != nil {
		tb.Fatalf("unshare -m: %v", err)
	}
	tb.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		tb.Fatalf("mount namespace holder (%s): %q", script, line)
	}
	return holder.Process.Pid
}
