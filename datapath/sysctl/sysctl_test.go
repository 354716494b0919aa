package sysctl

import (
	"os"
	"path/filepath"
	"testing"
)

// With SetProcFS, parameters are read and written below that root; a
// different value is written, a missing parameter is an error.
func TestEnsureUnderProcFS(t *testing.T) {
	root := t.TempDir()
	t.Cleanup(func() { SetProcFS("/proc") })
	SetProcFS(root)
	dir := filepath.Join(root, "sys", "net", "ipv4", "conf", "all")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	fwd := filepath.Join(dir, "forwarding")
	if got := Path("net/ipv4/conf/all/forwarding"); got != fwd {
		t.Fatalf("Path = %s, want %s", got, fwd)
	}
	if err := os.WriteFile(fwd, []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Ensure("net/ipv4/conf/all/forwarding", "1"); err != nil {
		t.Fatal(err)
	}
	if err := Ensure("net/ipv4/conf/all/forwarding", "0"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(fwd); string(b) != "0" {
		t.Fatalf("forwarding = %q, want 0", b)
	}
	if err := Ensure("net/ipv4/conf/all/missing", "1"); err == nil {
		t.Fatal("Ensure of a missing parameter succeeded")
	}
}
