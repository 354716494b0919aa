package datapath

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// bpffsT mounts a bpffs on a temporary directory (unmounted at cleanup).
func bpffsT(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, ""); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// TestLinuxGC: one pass only suspects; the second deletes orphan lxc veths
// and pin directories seen orphaned twice and reports endpoints missing
// twice. Live endpoints' veths and pins, other devices, files and a veth
// re-created between passes stay.
func TestLinuxGC(t *testing.T) {
	bpffs := bpffsT(t)
	l, _, nl := newTestLinux(t, LinuxConfig{BPFFS: bpffs})
	keep := addVeth(t, nl, 1, "lxcgc00000001", "10.244.42.1")
	gone := addVeth(t, nl, 2, "lxcgc00000002", "10.244.42.2")
	orphan := addVeth(t, nl, 0, "lxcgc00000003", "10.244.42.3")
	reborn := addVeth(t, nl, 0, "lxcgc00000004", "10.244.42.4")
	other := addVeth(t, nl, 0, "vethgc0000005", "10.244.42.5") // not lxc*: never ours
	pins := filepath.Join(bpffs, "endpoints")
	for _, d := range []string{"1", "2", "77", "junk"} {
		if err := os.MkdirAll(filepath.Join(pins, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	live := []*endpoint.Endpoint{keep, gone}
	del := func(name string) {
		link, err := nl.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := nl.LinkDel(link); err != nil {
			t.Fatal(err)
		}
	}
	del(gone.IfName)
	ctx := context.Background()

	r, err := l.GC(ctx, live)
	if err != nil {
		t.Fatalf("pass 1: %v", err)
	}
	// Suspects: gone (missing), orphan and reborn (veths), 77 and junk (pins).
	if len(r.Links) != 0 || len(r.Pins) != 0 || len(r.Missing) != 0 || r.Suspects != 5 {
		t.Fatalf("pass 1 = %+v, want 5 suspects and nothing removed", r)
	}
	del(reborn.IfName)
	addVeth(t, nl, 0, reborn.IfName, "10.244.42.4") // same name, new index: starts over

	r, err = l.GC(ctx, live)
	if err != nil {
		t.Fatalf("pass 2: %v", err)
	}
	if !slices.Equal(r.Links, []string{orphan.IfName}) {
		t.Errorf("links deleted = %v, want [%s]", r.Links, orphan.IfName)
	}
	slices.Sort(r.Pins)
	if want := []string{filepath.Join(pins, "77"), filepath.Join(pins, "junk")}; !slices.Equal(r.Pins, want) {
		t.Errorf("pins removed = %v, want %v", r.Pins, want)
	}
	if !slices.Equal(r.Missing, []endpoint.ID{2}) {
		t.Errorf("missing = %v, want [2]", r.Missing)
	}
	for _, name := range []string{keep.IfName, reborn.IfName, other.IfName} {
		if _, err := nl.LinkByName(name); err != nil {
			t.Errorf("%s was deleted: %v", name, err)
		}
	}
	if _, err := nl.LinkByName(orphan.IfName); !isLinkNotFound(err) {
		t.Errorf("orphan %s still there: %v", orphan.IfName, err)
	}
	for d, want := range map[string]bool{"1": true, "2": true, "77": false, "junk": false} {
		if _, err := os.Stat(filepath.Join(pins, d)); (err == nil) != want {
			t.Errorf("pin dir %s exists = %v, want %v", d, err == nil, want)
		}
	}

	// Pass 3: the re-created veth is now confirmed; nothing else left.
	r, err = l.GC(ctx, []*endpoint.Endpoint{keep})
	if err != nil {
		t.Fatalf("pass 3: %v", err)
	}
	if !slices.Equal(r.Links, []string{reborn.IfName}) || len(r.Missing) != 0 {
		t.Fatalf("pass 3 = %+v, want only %s deleted", r, reborn.IfName)
	}
}

// TestLinuxGCWithoutPinDir: no <bpffs>/endpoints directory (or an empty
// one) is no error.
func TestLinuxGCWithoutPinDir(t *testing.T) {
	l, _, _ := newTestLinux(t, LinuxConfig{BPFFS: bpffsT(t)})
	for i := 0; i < 2; i++ {
		if r, err := l.GC(context.Background(), nil); err != nil || !r.Empty() {
			t.Fatalf("GC = %+v, %v; want an empty report", r, err)
		}
	}
}
