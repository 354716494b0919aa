package testutil

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Cgroup2Dir makes a cgroup2 directory for a test's processes (under the
// cgroup2 mount's root, never the root itself) and removes it at cleanup,
// which also detaches the BPF programs attached to it. It skips where
// there is no cgroup2 mount, and fails instead under CI.
func Cgroup2Dir(tb testing.TB) string {
	tb.Helper()
	root := Cgroup2Mount()
	if root == "" {
		if InCI() {
			tb.Fatal("no cgroup2 mount")
		}
		tb.Skip("no cgroup2 mount")
	}
	dir := filepath.Join(root, "mbt-"+RandomSuffix(8))
	if err := os.Mkdir(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		for range 50 {
			if err := os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			time.Sleep(100 * time.Millisecond) // a process of the test still exiting
		}
		tb.Errorf("remove cgroup %s", dir)
	})
	return dir
}

// Cgroup2Mount is the cgroup2 mount point from /proc/self/mountinfo
// (/sys/fs/cgroup/unified on a hybrid cgroup host), "" when there is
// none.
func Cgroup2Mount() string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if i := slices.Index(fields, "-"); i > 4 && i+1 < len(fields) && fields[i+1] == "cgroup2" {
			return fields[4]
		}
	}
	return ""
}
