package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// install-cni puts the plugin (executable bits kept) and the conflist in
// their directories, replaces what an older version left, and leaves no
// temporary file behind, also when a source is missing.
func TestInstallCNI(t *testing.T) {
	src, bin, conf := t.TempDir(), t.TempDir(), t.TempDir()
	plugin := filepath.Join(src, "membrane-cni")
	conflist := filepath.Join(src, "05-membrane.conflist")
	if err := os.WriteFile(plugin, []byte("new plugin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conflist, []byte(`{"name":"membrane"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "membrane-cni"), []byte("old plugin"), 0o755); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	args := []string{"install-cni", "--plugin", plugin, "--conflist", conflist, "--cni-bin-dir", bin, "--cni-conf-dir", conf}
	if rc := run(args, &stderr); rc != 0 {
		t.Fatalf("install-cni = %d: %s", rc, stderr.String())
	}
	got, err := os.ReadFile(filepath.Join(bin, "membrane-cni"))
	if err != nil || string(got) != "new plugin" {
		t.Fatalf("plugin = %q, %v", got, err)
	}
	if st, err := os.Stat(filepath.Join(bin, "membrane-cni")); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("plugin mode = %v, %v", st.Mode(), err)
	}
	if got, err := os.ReadFile(filepath.Join(conf, "05-membrane.conflist")); err != nil || string(got) != `{"name":"membrane"}` {
		t.Fatalf("conflist = %q, %v", got, err)
	}
	stderr.Reset()
	args[4] = filepath.Join(src, "missing.conflist")
	if rc := run(args, &stderr); rc != 1 {
		t.Fatalf("install-cni with a missing conflist = %d, want 1: %s", rc, stderr.String())
	}
	for _, dir := range []string{bin, conf} {
		ents, _ := os.ReadDir(dir)
		if len(ents) != 1 {
			t.Fatalf("%s holds %d entries after the runs, want 1 (no temporary file left)", dir, len(ents))
		}
	}
	if rc := run([]string{"install-cni", "extra"}, &stderr); rc != 2 {
		t.Fatalf("install-cni with an argument = %d, want 2", rc)
	}
	if rc := run([]string{"mount-bpffs", "x"}, &stderr); rc != 2 {
		t.Fatalf("mount-bpffs with an argument = %d, want 2", rc)
	}
}

// install-cni --host-ports writes the changed conflist only into the
// configuration directory: the image has no /tmp (TMPDIR names a missing
// directory here) and the init container's root file system is
// read-only.
func TestInstallCNIHostPortsNoTmp(t *testing.T) {
	src, bin, conf := t.TempDir(), t.TempDir(), t.TempDir()
	plugin := filepath.Join(src, "membrane-cni")
	if err := os.WriteFile(plugin, []byte("plugin"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", filepath.Join(src, "no-such-dir"))
	var stderr bytes.Buffer
	args := []string{"install-cni", "--plugin", plugin, "--conflist", "../../deploy/05-membrane.conflist",
		"--cni-bin-dir", bin, "--cni-conf-dir", conf, "--host-ports", "bpf"}
	if rc := run(args, &stderr); rc != 0 {
		t.Fatalf("install-cni --host-ports bpf = %d: %s", rc, stderr.String())
	}
	got, err := os.ReadFile(filepath.Join(conf, "05-membrane.conflist"))
	if err != nil || !bytes.Contains(got, []byte(`"portMappings"`)) {
		t.Fatalf("installed conflist without the portMappings capability (%v):\n%s", err, got)
	}
	if ents, _ := os.ReadDir(conf); len(ents) != 1 {
		t.Fatalf("%s holds %d entries, want 1 (no temporary file left)", conf, len(ents))
	}
}
