package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// Pinned object names (see LinuxConfig.BPFFS).
const (
	pinIPCache   = "ipcache"
	pinCT        = "ct"
	pinDrops     = "drops"
	pinEvents    = "events"
	pinEndpoints = "endpoints"
	pinPolicy    = "policy"
	pinCIDR      = "cidr"
	pinLinkFrom  = "link_from_container"
	pinLinkTo    = "link_to_container"
	// Per node: the endpoint map by ifindex, the outer policy maps and
	// the endpoint programs (under programs/<object digest>/).
	pinEndpointInfo = "endpoints_by_ifindex"
	pinPolicyMaps   = "policy_maps"
	pinCIDRMaps     = "cidr_maps"
	pinProgramsDir  = "programs"
)

// bpffsRoot is the conventional bpffs mount point, the only place Init
// mounts one itself.
const bpffsRoot = "/sys/fs/bpf"

// ensureBPFFS makes dir and dir/endpoints exist on a bpffs. If the
// nearest existing ancestor of dir is not on a bpffs, it mounts one at
// /sys/fs/bpf when dir is below it (a node whose init system did not),
// and otherwise returns ErrNotBPFFS: a mount elsewhere (at the parent
// of a mistyped --bpffs, or of a test's temporary directory) would be
// surprising and nothing would unmount it.
func ensureBPFFS(dir string) error {
	dir = filepath.Clean(dir)
	if !isBPFFS(existingAncestor(dir)) {
		if dir != bpffsRoot && !strings.HasPrefix(dir, bpffsRoot+"/") {
			return fmt.Errorf("bpffs directory %s: %w (mount one there, or use a directory below %s)", dir, ErrNotBPFFS, bpffsRoot)
		}
		if err := os.MkdirAll(bpffsRoot, 0o755); err != nil {
			return fmt.Errorf("mount bpffs at %s: %w", bpffsRoot, err)
		}
		if err := unix.Mount("bpf", bpffsRoot, "bpf", 0, "mode=0755"); err != nil {
			return fmt.Errorf("mount bpffs at %s: %w", bpffsRoot, err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, pinEndpoints), 0o755); err != nil {
		return fmt.Errorf("create bpffs directory %s: %w", dir, err)
	}
	return nil
}

// existingAncestor returns dir or its nearest ancestor that exists.
func existingAncestor(dir string) string {
	for {
		if _, err := os.Stat(dir); err == nil || dir == "/" {
			return dir
		}
		dir = filepath.Dir(dir)
	}
}

// isBPFFS reports whether path exists on a bpffs.
func isBPFFS(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return uint32(st.Type) == unix.BPF_FS_MAGIC
}

// endpointDir is where endpoint id's objects are pinned.
func (b *bpfState) endpointDir(id endpoint.ID) string {
	return filepath.Join(b.dir, pinEndpoints, strconv.Itoa(int(id)))
}

// unpin removes a pin; a missing one is success.
func unpin(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unpin %s: %w", path, err)
	}
	return nil
}

// MountBPFFS makes sure a bpffs is mounted at /sys/fs/bpf, mounting one
// when the directory is not on a bpffs yet. It is what the DaemonSet's
// privileged init container runs (membrane-agent mount-bpffs), so the
// agent container needs no mount rights: the host's mount reaches it
// through a HostToContainer volume.
func MountBPFFS() error {
	if isBPFFS(bpffsRoot) {
		return nil
	}
	if err := os.MkdirAll(bpffsRoot, 0o755); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w", bpffsRoot, err)
	}
	if err := unix.Mount("bpf", bpffsRoot, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w", bpffsRoot, err)
	}
	return nil
}
