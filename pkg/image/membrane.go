package image

import (
	"fmt"
	"path/filepath"
)

// Programs are the binaries of Membrane's image, at /usr/local/bin:
// the agent (whose install-cni and mount-bpffs subcommands are the
// DaemonSet's init containers), the CNI plugin it installs on the node,
// the operators' CLI and the L7 proxy the agent starts.
var Programs = []string{"membrane-agent", "membrane-cni", "membranectl", "membrane-proxy"}

// ConflistPath is where the image carries the CNI network configuration
// install-cni copies to the node.
const ConflistPath = "/etc/membrane/05-membrane.conflist"

// Membrane is the spec of Membrane's image: the static Programs from
// binDir and the conflist, on an empty base (no shell, no libc: nothing
// to patch but Membrane's own code). version goes into the image's
// labels.
func Membrane(ref, binDir, conflist, version string) (Spec, error) {
	s := Spec{
		Ref:        ref,
		Entrypoint: []string{"/usr/local/bin/membrane-agent"},
		Env:        []string{"PATH=/usr/local/bin"},
		Labels: map[string]string{
			"org.opencontainers.image.title":   "membrane",
			"org.opencontainers.image.version": version,
			"org.opencontainers.image.source":  "https://github.com/membrane-cni/membrane",
		},
	}
	for _, p := range Programs {
		src := filepath.Join(binDir, p)
		if err := CheckStatic(src); err != nil {
			return Spec{}, fmt.Errorf("image %s: %w", ref, err)
		}
		s.Files = append(s.Files, File{Path: "/usr/local/bin/" + p, Mode: 0o755, Source: src})
	}
	s.Files = append(s.Files, File{Path: ConflistPath, Mode: 0o644, Source: conflist})
	return s, nil
}
