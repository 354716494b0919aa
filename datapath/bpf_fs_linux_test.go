package datapath

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestEnsureBPFFS: a directory on a bpffs (existing or to create) is
// accepted; one elsewhere is refused with ErrNotBPFFS, without mounting
// anything or creating the directory.
func TestEnsureBPFFS(t *testing.T) {
	testutil.RequireRoot(t)
	onBPFFS := testutil.BPFFSDir(t)
	elsewhere := t.TempDir()
	tests := []struct {
		name    string
		dir     string
		wantErr error
	}{
		{"bpffs dir", onBPFFS, nil},
		{"new nested dir on a bpffs", filepath.Join(onBPFFS, "a", "b"), nil},
		{"tmp dir", filepath.Join(elsewhere, "pins"), ErrNotBPFFS},
		{"nested tmp dir", filepath.Join(elsewhere, "x", "y"), ErrNotBPFFS},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := ensureBPFFS(tc.dir)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("ensureBPFFS(%s) = %v, want %v", tc.dir, err, tc.wantErr)
			}
			_, serr := os.Stat(filepath.Join(tc.dir, pinEndpoints))
			if (serr == nil) != (tc.wantErr == nil) {
				t.Fatalf("%s/endpoints exists: %v; want %v", tc.dir, serr == nil, tc.wantErr == nil)
			}
		})
	}
	for _, d := range []string{elsewhere, filepath.Join(elsewhere, "x")} {
		if isBPFFS(d) {
			t.Errorf("a bpffs was mounted at %s", d)
		}
	}
}

// TestLinuxInitRefusesNonBPFFS: Init fails with ErrNotBPFFS for a pin
// directory that is not on a bpffs (and not below /sys/fs/bpf).
func TestLinuxInitRefusesNonBPFFS(t *testing.T) {
	testutil.RequireRoot(t)
	host := testutil.NewNS(t, "mbt-fs")
	dir := filepath.Join(t.TempDir(), "pins")
	l, err := NewLinux(LinuxConfig{HostNetns: host.Path, BPFFS: dir}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	if err := l.Init(context.Background()); !errors.Is(err, ErrNotBPFFS) {
		t.Fatalf("Init = %v, want ErrNotBPFFS", err)
	}
	if isBPFFS(filepath.Dir(dir)) {
		t.Errorf("Init mounted a bpffs at %s", filepath.Dir(dir))
	}
}
