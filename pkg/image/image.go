// Package image builds container images from files on this machine,
// without Docker or a registry, the way ko does: one layer of the given
// files on an empty base, written as a docker-archive tarball that
// `ctr images import` (and `docker load`) reads. Builds are reproducible:
// the same files give the same image digest (fixed modification times,
// owners and order, no build timestamp), so two builds can be compared
// by digest.
package image

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Epoch is every file's modification time and the image's creation time
// unless Spec.Created says otherwise: a fixed time keeps builds
// reproducible (SOURCE_DATE_EPOCH's idea).
var Epoch = time.Unix(0, 0).UTC()

// File is one file of the image's layer.
type File struct {
	// Path is the absolute path in the image (clean, no "..").
	Path string
	// Mode is the permission bits (0o755 for a program).
	Mode int64
	// Data is the content; when nil, Source is read.
	Data []byte
	// Source is a path on this machine to read the content from.
	Source string
	// Link, when set, makes the entry a symbolic link to Link.
	Link string
}

// Spec describes an image.
type Spec struct {
	// Ref names the image in the tarball (e.g. "localhost/membrane:dev").
	Ref string
	// Files are the layer's files; parent directories are added.
	Files []File
	// Entrypoint, Cmd, Env, User, WorkingDir and Labels go into the
	// image's config.
	Entrypoint []string
	Cmd        []string
	Env        []string
	User       string
	WorkingDir string
	Labels     map[string]string
	// Created is the image's creation time (Epoch when zero).
	Created time.Time
}

// Build returns the image Spec describes.
func Build(s Spec) (v1.Image, error) {
	layerTar, err := layerTarball(s.Files, s.created())
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.DockerLayer))
	if err != nil {
		return nil, fmt.Errorf("image %s: layer: %w", s.Ref, err)
	}
	img, err := mutate.Append(empty.Image, mutate.Addendum{
		Layer:     layer,
		History:   v1.History{CreatedBy: "membrane pkg/image", Created: v1.Time{Time: s.created()}},
		MediaType: types.DockerLayer,
	})
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", s.Ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: s.created()}
	cf.Config.Entrypoint = s.Entrypoint
	cf.Config.Cmd = s.Cmd
	cf.Config.Env = s.Env
	cf.Config.User = s.User
	cf.Config.WorkingDir = s.WorkingDir
	cf.Config.Labels = s.Labels
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image %s: config: %w", s.Ref, err)
	}
	return img, nil
}

func (s Spec) created() time.Time {
	if s.Created.IsZero() {
		return Epoch
	}
	return s.Created.UTC()
}

// Write builds the image and writes it to out as a docker-archive
// tarball tagged s.Ref; it returns the image's digest.
func Write(s Spec, out string) (v1.Hash, error) {
	ref, err := name.NewTag(s.Ref, name.WeakValidation)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image reference %q: %w", s.Ref, err)
	}
	img, err := Build(s)
	if err != nil {
		return v1.Hash{}, err
	}
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	tmp := out + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		_ = os.Remove(tmp)
		return v1.Hash{}, fmt.Errorf("write image %s: %w", s.Ref, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return v1.Hash{}, err
	}
	return digest, nil
}

// layerTarball writes the files, and their parent directories, as one
// tar stream in path order with fixed times and owners.
func layerTarball(files []File, mtime time.Time) ([]byte, error) {
	entries := map[string]File{}
	dirs := map[string]bool{}
	for _, f := range files {
		p := path.Clean(f.Path)
		if !path.IsAbs(f.Path) || p != f.Path || p == "/" {
			return nil, fmt.Errorf("image file %q: want a clean absolute path", f.Path)
		}
		if _, dup := entries[p]; dup {
			return nil, fmt.Errorf("image file %q: given twice", p)
		}
		entries[p] = f
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	for d := range dirs {
		if f, ok := entries[d]; ok {
			return nil, fmt.Errorf("image file %q: also a directory", f.Path)
		}
	}
	names := slices.Sorted(maps.Keys(entries))
	for d := range dirs {
		names = append(names, d)
	}
	slices.Sort(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range names {
		rel := strings.TrimPrefix(p, "/")
		hdr := &tar.Header{Name: rel, ModTime: mtime, Format: tar.FormatPAX, Uname: "root", Gname: "root"}
		f, isFile := entries[p]
		switch {
		case !isFile:
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, rel+"/", 0o755
		case f.Link != "":
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, f.Link, 0o777
		default:
			data := f.Data
			if data == nil {
				if f.Source == "" {
					return nil, fmt.Errorf("image file %q: no content and no source", p)
				}
				var err error
				if data, err = os.ReadFile(f.Source); err != nil {
					return nil, fmt.Errorf("image file %q: %w", p, err)
				}
			}
			mode := f.Mode
			if mode == 0 {
				mode = 0o644
			}
			hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeReg, mode, int64(len(data))
			f.Data = data
		}
		// PAX records would carry access and change times: keep only
		// the fields set above.
		hdr.PAXRecords = nil
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// ErrNotStatic is returned by CheckStatic for a dynamically linked program.
var ErrNotStatic = errors.New("not a static binary")

// CheckStatic fails unless the ELF program at p is statically linked (no
// program interpreter): an image without a libc runs only those.
func CheckStatic(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s: %w (it names a program interpreter; build it with CGO_ENABLED=0)", p, ErrNotStatic)
		}
	}
	return nil
}
