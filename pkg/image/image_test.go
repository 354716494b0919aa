package image_test

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/membrane-cni/membrane/pkg/image"
)

func spec(t *testing.T, dir string) image.Spec {
	t.Helper()
	src := filepath.Join(dir, "prog")
	if err := os.WriteFile(src, []byte("#!program\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return image.Spec{
		Ref:        "localhost/test:v1",
		Entrypoint: []string{"/usr/local/bin/prog"},
		User:       "65535:65535",
		Labels:     map[string]string{"version": "1"},
		Files: []image.File{
			{Path: "/usr/local/bin/prog", Mode: 0o755, Source: src},
			{Path: "/etc/conf/a.conf", Data: []byte("a=1\n")},
			{Path: "/bin/sh", Link: "/usr/local/bin/prog"},
		},
	}
}

// TestReproducible: two builds of the same inputs, at different times
// and file mtimes, give byte-identical tarballs and one digest; a changed
// input changes the digest.
func TestReproducible(t *testing.T) {
	dir := t.TempDir()
	s := spec(t, dir)
	out1, out2 := filepath.Join(dir, "1.tar"), filepath.Join(dir, "2.tar")
	d1, err := image.Write(s, out1)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(filepath.Join(dir, "prog"), image.Epoch, image.Epoch); err != nil {
		t.Fatal(err)
	}
	d2, err := image.Write(s, out2)
	if err != nil {
		t.Fatal(err)
	}
	if d1 != d2 {
		t.Fatalf("digests differ: %s, %s", d1, d2)
	}
	b1, _ := os.ReadFile(out1)
	b2, _ := os.ReadFile(out2)
	if !slices.Equal(b1, b2) {
		t.Fatal("tarballs differ")
	}
	s.Labels = map[string]string{"version": "2"}
	d3, err := image.Write(s, filepath.Join(dir, "3.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if d3 == d1 {
		t.Fatal("a changed label kept the digest")
	}
}

// TestContents reads the tarball back as a runtime would: the tag, the
// config and the layer's entries (parent directories, modes, a link,
// fixed times and owners).
func TestContents(t *testing.T) {
	dir := t.TempDir()
	s := spec(t, dir)
	out := filepath.Join(dir, "img.tar")
	want, err := image.Write(s, out)
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag(s.Ref)
	img, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := img.Digest(); d != want {
		t.Fatalf("digest read back %s, written %s", d, want)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" || !slices.Equal(cf.Config.Entrypoint, s.Entrypoint) || cf.Config.User != s.User || cf.Config.Labels["version"] != "1" {
		t.Fatalf("config: %+v", cf)
	}
	if !cf.Created.Time.Equal(image.Epoch) {
		t.Fatalf("created %v, want the epoch", cf.Created)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var got []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(image.Epoch) || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: mtime %v uid %d gid %d", h.Name, h.ModTime, h.Uid, h.Gid)
		}
		got = append(got, h.Name)
		switch h.Name {
		case "usr/local/bin/prog":
			if h.Mode != 0o755 {
				t.Errorf("prog mode %o", h.Mode)
			}
		case "bin/sh":
			if h.Typeflag != tar.TypeSymlink || h.Linkname != "/usr/local/bin/prog" {
				t.Errorf("bin/sh: %+v", h)
			}
		}
	}
	wantNames := []string{"bin/", "bin/sh", "etc/", "etc/conf/", "etc/conf/a.conf", "usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/prog"}
	if !slices.Equal(got, wantNames) {
		t.Fatalf("entries %q, want %q", got, wantNames)
	}
}

func TestBadSpec(t *testing.T) {
	dir := t.TempDir()
	for name, files := range map[string][]image.File{
		"relative":   {{Path: "etc/x", Data: []byte("x")}},
		"dotdot":     {{Path: "/etc/../x", Data: []byte("x")}},
		"root":       {{Path: "/", Data: []byte("x")}},
		"duplicate":  {{Path: "/x", Data: []byte("x")}, {Path: "/x", Data: []byte("y")}},
		"dir clash":  {{Path: "/x", Data: []byte("x")}, {Path: "/x/y", Data: []byte("y")}},
		"no content": {{Path: "/x"}},
		"no source":  {{Path: "/x", Source: filepath.Join(dir, "missing")}},
	} {
		if _, err := image.Write(image.Spec{Ref: "localhost/x:1", Files: files}, filepath.Join(dir, "x.tar")); err == nil {
			t.Errorf("%s: built", name)
		}
	}
	if _, err := image.Write(image.Spec{Ref: "Not A Ref"}, filepath.Join(dir, "y.tar")); err == nil {
		t.Error("bad reference: built")
	}
}

// TestCheckStatic: the image refuses a dynamically linked program (it
// could not run without a libc); the test binary's own kind depends on
// the build, so a known dynamic program of the machine is the case.
func TestCheckStatic(t *testing.T) {
	dyn := "/bin/ls"
	if _, err := os.Stat(dyn); err != nil {
		t.Skip("no /bin/ls")
	}
	if err := image.CheckStatic(dyn); !errors.Is(err, image.ErrNotStatic) {
		t.Fatalf("CheckStatic(%s) = %v, want ErrNotStatic", dyn, err)
	}
	if err := image.CheckStatic(filepath.Join(t.TempDir(), "nothing")); err == nil {
		t.Fatal("a missing file passed")
	}
}
