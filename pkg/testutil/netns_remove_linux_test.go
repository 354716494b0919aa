package testutil

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRemoveNSWithCopyInAnotherMountNamespace: another mount namespace
// holds a copy of the namespace's bind mount and binds it again, which
// propagation stacks onto the path here too. One lazy unmount then leaves
// a mount point, so unlink fails with EBUSY; Remove unmounts every
// stacked copy and removes the file, leaving no mount behind.
func TestRemoveNSWithCopyInAnotherMountNamespace(t *testing.T) {
	RequireRoot(t)
	ns, err := CreateNSAt(filepath.Join(SharedDir(t), "mbt-copy-"+RandomSuffix(8)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Remove() }) // if the test fails before its own Remove
	HoldMountCopy(t, ns.Path)
	if n := MountsAt(t, ns.Path); n != 2 {
		t.Fatalf("%d mounts at %s here, want 2 (ours and the propagated copy)", n, ns.Path)
	}
	if err := ns.Remove(); err != nil {
		t.Fatalf("remove with a copy in another mount namespace: %v", err)
	}
	if _, err := os.Lstat(ns.Path); !os.IsNotExist(err) {
		t.Fatalf("%s left: %v", ns.Path, err)
	}
	if n := MountsAt(t, ns.Path); n != 0 {
		t.Fatalf("%d mounts left at %s", n, ns.Path)
	}
	if err := ns.Remove(); err != nil { // removing a removed one is success
		t.Fatalf("second remove: %v", err)
	}
}
