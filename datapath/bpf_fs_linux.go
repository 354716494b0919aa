package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/endpoint"
)

// Pinned object names (see LinuxConfig.BPFFS).
const (
	pinIPCache   = "ipcache"
	pinCT        = "ct"
	pinDrops     = "drops"
	pinEvents    = "events"
	pinEndpoints = "endpoints"
	pinPolicy    = "policy"
	pinLinkFrom  = "link_from_container"
	pinLinkTo    = "link_to_container"
)

// ensureBPFFS makes dir and dir/endpoints exist on a bpffs, mounting one
// at dir's parent if neither dir nor its parent is on one.
func ensureBPFFS(dir string) error {
	if !isBPFFS(dir) {
		parent := filepath.Dir(dir)
		if !isBPFFS(parent) {
			if err := os.MkdirAll(parent, 0o755); err != nil {
				return fmt.Errorf("mount bpffs at %s: %w", parent, err)
			}
			if err := unix.Mount("bpf", parent, "bpf", 0, "mode=0755"); err != nil {
				return fmt.Errorf("mount bpffs at %s: %w", parent, err)
			}
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, pinEndpoints), 0o755); err != nil {
		return fmt.Errorf("create bpffs directory %s: %w", dir, err)
	}
	return nil
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
