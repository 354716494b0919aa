//go:build linux

package e2e

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// writeImage writes a docker-archive tarball (what `ctr images import`
// reads) of a one-layer linux/amd64 image tagged ref whose only file is
// the static binary bin, at /<base name>, which is also the entrypoint.
// No registry is reachable here: the nodes import these tarballs and the
// pods use imagePullPolicy Never.
func writeImage(bin, ref, user, out string) error {
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	name := filepath.Base(bin)
	var layer bytes.Buffer
	lw := tar.NewWriter(&layer)
	if err := lw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := lw.Write(data); err != nil {
		return err
	}
	if err := lw.Close(); err != nil {
		return err
	}
	layerSum := sha256.Sum256(layer.Bytes())
	layerID := hex.EncodeToString(layerSum[:])
	cfg := map[string]any{"Entrypoint": []string{"/" + name}}
	if user != "" {
		cfg["User"] = user
	}
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"config":       cfg,
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + layerID}},
	})
	if err != nil {
		return err
	}
	configSum := sha256.Sum256(config)
	configName := hex.EncodeToString(configSum[:]) + ".json"
	manifest, err := json.Marshal([]map[string]any{{
		"Config": configName, "RepoTags": []string{ref}, "Layers": []string{layerID + "/layer.tar"},
	}})
	if err != nil {
		return err
	}
	var img bytes.Buffer
	w := tar.NewWriter(&img)
	for _, f := range []struct {
		name string
		data []byte
	}{{configName, config}, {layerID + "/layer.tar", layer.Bytes()}, {"manifest.json", manifest}} {
		if err := w.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := w.Write(f.data); err != nil {
			return err
		}
	}
	if err := w.Close(); err != nil {
		return err
	}
	if err := os.WriteFile(out, img.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write image %s: %w", ref, err)
	}
	return nil
}
