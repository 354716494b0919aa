package cri

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"
)

// writePauseImage writes a docker-archive tarball (what `ctr images
// import` reads) of a one-layer linux/amd64 image tagged ref whose only
// file is /pause, the static binary at bin.
func writePauseImage(tb testing.TB, bin, ref, out string) {
	tb.Helper()
	data, err := os.ReadFile(bin)
	if err != nil {
		tb.Fatal(err)
	}
	var layer bytes.Buffer
	lw := tar.NewWriter(&layer)
	if err := lw.WriteHeader(&tar.Header{Name: "pause", Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		tb.Fatal(err)
	}
	if _, err := lw.Write(data); err != nil {
		tb.Fatal(err)
	}
	if err := lw.Close(); err != nil {
		tb.Fatal(err)
	}
	layerSum := sha256.Sum256(layer.Bytes())
	layerID := hex.EncodeToString(layerSum[:])
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"config":       map[string]any{"Entrypoint": []string{"/pause"}, "User": "65535:65535"},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + layerID}},
	})
	if err != nil {
		tb.Fatal(err)
	}
	configSum := sha256.Sum256(config)
	configName := hex.EncodeToString(configSum[:]) + ".json"
	manifest, err := json.Marshal([]map[string]any{{
		"Config": configName, "RepoTags": []string{ref}, "Layers": []string{layerID + "/layer.tar"},
	}})
	if err != nil {
		tb.Fatal(err)
	}
	var img bytes.Buffer
	w := tar.NewWriter(&img)
	for _, f := range []struct {
		name string
		data []byte
	}{{configName, config}, {layerID + "/layer.tar", layer.Bytes()}, {"manifest.json", manifest}} {
		if err := w.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg}); err != nil {
			tb.Fatal(err)
		}
		if _, err := w.Write(f.data); err != nil {
			tb.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(out, img.Bytes(), 0o644); err != nil {
		tb.Fatal(err)
	}
}
