package nsmount_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/datapath/nsmount"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestRemoveWithCopyInAnotherMountNamespace: the health endpoint's netns
// removal (and the GC's) succeeds while another mount namespace holds a
// copy of the bind mount that propagation stacked onto the path.
func TestRemoveWithCopyInAnotherMountNamespace(t *testing.T) {
	testutil.RequireRoot(t)
	ns, err := testutil.CreateNSAt(filepath.Join(testutil.SharedDir(t), "mbt-nsm-"+testutil.RandomSuffix(8)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nsmount.Remove(ns.Path) })
	testutil.HoldMountCopy(t, ns.Path)
	if err := nsmount.Remove(ns.Path); err != nil {
		t.Fatalf("remove: %v", err)
	}
	if _, err := os.Lstat(ns.Path); !os.IsNotExist(err) {
		t.Fatalf("%s left: %v", ns.Path, err)
	}
	if n := testutil.MountsAt(t, ns.Path); n != 0 {
		t.Fatalf("%d mounts left at %s", n, ns.Path)
	}
	if err := nsmount.Remove(ns.Path); err != nil {
		t.Fatalf("removing a removed one: %v", err)
	}
}

// TestRemoveReportsWhatStays: a path that cannot be removed (a non-empty
// directory stands for anything that stays) is reported, not hidden.
func TestRemoveReportsWhatStays(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	err := nsmount.Remove(dir)
	if err == nil || errors.Is(err, nsmount.ErrLeaked) {
		t.Fatalf("Remove(non-empty dir) = %v, want the unlink error", err)
	}
}

// TestRemoveRefusesMountedDir: a directory that is a mount point (as
// /run/netns is: what a path built from an empty name points at) is
// never unmounted.
func TestRemoveRefusesMountedDir(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind %s: %v", dir, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if err := nsmount.Remove(dir); err == nil {
		t.Fatal("Remove(mounted dir) = nil, want a refusal")
	}
	if err := unix.Unmount(dir, 0); err != nil {
		t.Fatalf("the directory's own mount is gone after Remove: %v", err)
	}
}
