package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// ext4Magic is EXT4_SUPER_MAGIC (shared by ext2 and ext3).
const ext4Magic = 0xEF53

// IsExt4 reports whether dir is on an ext2/3/4 filesystem.
func IsExt4(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == ext4Magic
}

// Ext4Dir returns a fresh directory on ext4, for measurements of what
// fsync costs on a real disk filesystem: a temporary directory when the
// temp dir is on ext4, otherwise (root only, with mkfs.ext4) the root of
// a 256 MiB ext4 image loop-mounted for tb and unmounted and deleted in
// its cleanup.
func Ext4Dir(tb testing.TB) string {
	tb.Helper()
	if dir := tb.TempDir(); IsExt4(dir) {
		return dir
	}
	RequireRoot(tb)
	work := tb.TempDir()
	img, mnt := filepath.Join(work, "ext4.img"), filepath.Join(work, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		tb.Fatal(err)
	}
	f, err := os.Create(img)
	if err == nil {
		err = f.Truncate(256 << 20)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		tb.Fatalf("ext4 image: %v", err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		tb.Fatalf("mkfs.ext4 %s: %v\n%s", img, err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		tb.Fatalf("mount -o loop %s: %v\n%s", img, err, out)
	}
	tb.Cleanup(func() {
		// The loop device goes with the last unmount (mount -o loop sets
		// autoclear); the image goes with TempDir.
		if err := unix.Unmount(mnt, 0); err != nil {
			tb.Errorf("unmount %s: %v", mnt, err)
		}
	})
	if !IsExt4(mnt) {
		tb.Fatalf("%s is not on ext4 after mounting %s", mnt, img)
	}
	return mnt
}
