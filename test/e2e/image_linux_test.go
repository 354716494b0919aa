//go:build linux

package e2e

import (
	"fmt"
	"path/filepath"

	"github.com/membrane-cni/membrane/pkg/image"
)

// writeImage writes a docker-archive tarball (what `ctr images import`
// reads) of a one-layer linux/amd64 image tagged ref whose only file is
// the static binary bin, at /<base name>, which is also the entrypoint
// (pkg/image, as make image builds Membrane's). No registry is reachable
// here: the nodes import these tarballs and the pods use
// imagePullPolicy Never.
func writeImage(bin, ref, user, out string) error {
	if err := image.CheckStatic(bin); err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	name := "/" + filepath.Base(bin)
	_, err := image.Write(image.Spec{
		Ref:        ref,
		Files:      []image.File{{Path: name, Mode: 0o755, Source: bin}},
		Entrypoint: []string{name},
		User:       user,
	}, out)
	return err
}
