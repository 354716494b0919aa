package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestNewNS(t *testing.T) {
	RequireRoot(t)
	var path string
	t.Run("create", func(t *testing.T) {
		ns := NewNS(t, "mbt-util")
		path = ns.Path
		out, err := ns.Exec("ip", "-o", "link", "show", "lo")
		if err != nil || !strings.Contains(out, "UP") {
			t.Fatalf("lo in the new netns: %q, %v", out, err)
		}
		h, err := ns.Handle()
		if err != nil {
			t.Fatal(err)
		}
		h.Close()
	})
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("netns %s left after the test: %v", path, err)
	}
}

// TestNetnsDirSharedMountPoint: after NewNS, /var/run/netns is a shared
// mount point (as iproute2 leaves it), so a later `ip netns add` stacks
// nothing on it and the test's namespace can still be removed.
func TestNetnsDirSharedMountPoint(t *testing.T) {
	RequireRoot(t)
	ns := NewNS(t, "mbt-shared")
	dir, err := filepath.EvalSymlinks(netnsDir)
	if err != nil {
		t.Fatal(err)
	}
	if shared, ok := mountPropagation(t, dir); !ok || !shared {
		t.Fatalf("%s: mount point %v, shared %v; want a shared mount point", dir, ok, shared)
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		t.Fatalf("ip (iproute2) is needed: %v", err)
	}
	other := "mbt-ipns-" + RandomSuffix(8)
	if out, err := exec.Command(ip, "netns", "add", other).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	if out, err := exec.Command(ip, "netns", "del", other).CombinedOutput(); err != nil {
		t.Fatalf("ip netns del: %v: %s", err, out)
	}
	if err := ns.Remove(); err != nil {
		t.Fatalf("remove after ip netns: %v", err)
	}
}

// mountPropagation reports whether dir is a mount point and whether its
// top mount is shared (/proc/self/mountinfo).
func mountPropagation(t *testing.T, dir string) (shared, ok bool) {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 6 && f[4] == dir {
			ok = true
			shared = strings.Contains(line[:strings.Index(line, " - ")], "shared:")
		}
	}
	return shared, ok
}
