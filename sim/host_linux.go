package sim

import (
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// tmpfsBase returns where a run without --dir keeps its socket and state:
// a tmpfs, like the agent's default state directory (/var/run/membrane,
// and /run is a tmpfs on a node), or "" (the temp dir) when there is none.
func tmpfsBase() string {
	for _, dir := range []string{"/run", "/dev/shm"} {
		if fsType(dir) == "tmpfs" && unix.Access(dir, unix.W_OK) == nil {
			return dir
		}
	}
	return ""
}

// fsType names the filesystem of dir: tmpfs, ext4, xfs, btrfs, overlay
// or its magic number in hex ("" when statfs fails).
func fsType(dir string) string {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return ""
	}
	switch st.Type {
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlay"
	}
	return "0x" + strconv.FormatInt(int64(st.Type), 16)
}

// processCPU returns the CPU time the process (agent and harness) used.
func processCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
