package testutil

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRemoveNSWithCopyInAnotherMountNamespace: another mount namespace (a
// peer of a shared mount, as container runtimes and `unshare -m` make)
// holds a copy of the namespace's bind mount and binds it again, which
// propagation stacks onto the path here too. One lazy unmount then leaves
// a mount point, so unlink fails with EBUSY; Remove unmounts every
// stacked copy and removes the file, leaving no mount behind.
func TestRemoveNSWithCopyInAnotherMountNamespace(t *testing.T) {
	RequireRoot(t)
	for _, tool := range []string{"unshare", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s (util-linux) is needed: %v", tool, err)
		}
	}
	dir := sharedDir(t)
	ns, err := CreateNSAt(filepath.Join(dir, "mbt-copy-"+RandomSuffix(8)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Remove() }) // if the test fails before its own Remove

	// The other mount namespace copies every mount (ns's included, as a
	// peer) and binds ns's path onto itself: the new mount propagates here.
	holder := exec.Command("unshare", "-m", "--propagation", "unchanged", "sh", "-c",
		`mount --bind "$0" "$0" && echo mounted && exec sleep 600`, ns.Path)
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	holder.Stderr = os.Stderr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "mounted\n" {
		t.Fatalf("holder did not mount: %q", line)
	}
	if n := mountsAt(t, ns.Path); n != 2 {
		t.Fatalf("%d mounts at %s here, want 2 (ours and the propagated copy)", n, ns.Path)
	}

	if err := ns.Remove(); err != nil {
		t.Fatalf("remove with a copy in another mount namespace: %v", err)
	}
	if _, err := os.Lstat(ns.Path); !os.IsNotExist(err) {
		t.Fatalf("%s left: %v", ns.Path, err)
	}
	if n := mountsAt(t, ns.Path); n != 0 {
		t.Fatalf("%d mounts left at %s", n, ns.Path)
	}
	if err := ns.Remove(); err != nil { // removing a removed one is success
		t.Fatalf("second remove: %v", err)
	}
}

// sharedDir returns a temporary directory bind-mounted onto itself as a
// shared mount (what iproute2 makes of /run/netns), unmounted at cleanup.
func sharedDir(tb testing.TB) string {
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

// mountsAt counts the mounts of this mount namespace whose mount point is path.
func mountsAt(tb testing.TB, path string) int {
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
