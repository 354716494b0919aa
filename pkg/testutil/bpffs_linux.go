package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// bpffsRoot is where the machine's bpffs is usually mounted.
const bpffsRoot = "/sys/fs/bpf"

// BPFFSDir returns a fresh directory on a bpffs
// (/sys/fs/bpf/membrane-test-<random>; a bpffs is mounted at /sys/fs/bpf
// first if there is none), removed with everything pinned in it by
// tb.Cleanup. Needs root.
func BPFFSDir(tb testing.TB) string {
	tb.Helper()
	RequireRoot(tb)
	var st unix.Statfs_t
	if err := unix.Statfs(bpffsRoot, &st); err != nil || uint32(st.Type) != unix.BPF_FS_MAGIC {
		if err := os.MkdirAll(bpffsRoot, 0o755); err != nil {
			tb.Fatalf("bpffs: %v", err)
		}
		if err := unix.Mount("bpf", bpffsRoot, "bpf", 0, "mode=0700"); err != nil {
			tb.Fatalf("mount bpffs at %s: %v", bpffsRoot, err)
		}
	}
	dir := filepath.Join(bpffsRoot, "membrane-test-"+RandomSuffix(8))
	if err := os.Mkdir(dir, 0o700); err != nil {
		tb.Fatalf("bpffs dir: %v", err)
	}
	tb.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			tb.Errorf("remove %s: %v", dir, fmt.Errorf("bpffs cleanup: %w", err))
		}
	})
	return dir
}
