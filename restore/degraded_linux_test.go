package restore

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestOpenDegraded: a state directory on a filesystem that is read-only
// when the store opens (an agent restarted before the operator repaired
// it). Open fails with EROFS; OpenDegraded reads what the directory
// holds (the checkpointed directories and the journal beyond them)
// without writing, holds no file open there (so the filesystem can be
// unmounted and repaired under it), refuses writes, removals and
// quarantines naming EROFS, and reports the directory unhealthy. Once
// the filesystem is writable again it opens the Store, removes the
// state whose removal it refused, and hands the Store over.
func TestOpenDegraded(t *testing.T) {
	testutil.RequireRoot(t)
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	s := openLagging(t, dir)
	writeRev(t, s, 1, 1)
	writeRev(t, s, 2, 1)
	mustCheckpoint(t, s)
	writeRev(t, s, 3, 1) // only in the journal
	writeRev(t, s, 1, 2)
	s.Abort()

	remount := func(flags uintptr) {
		t.Helper()
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_REMOUNT|flags, "size=64m"); err != nil {
			t.Fatalf("remount %s: %v", dir, err)
		}
	}
	remount(unix.MS_RDONLY)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	_, err := Open(dir, log)
	if !errors.Is(err, unix.EROFS) {
		t.Fatalf("Open on the read-only filesystem = %v, want EROFS", err)
	}
	if _, err := OpenDegraded(dir, log, errors.New("not read-only"), nil); err == nil {
		t.Fatal("OpenDegraded after an error other than EROFS succeeded")
	}
	handed := make(chan *Store, 1)
	d, err := OpenDegraded(dir, log, err, func(st *Store) { handed <- st })
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var heard []Health
	heardc := make(chan Health, 4)
	d.OnHealth(func(h Health) { heardc <- h })

	eps, bad := d.Scan()
	got := map[endpoint.ID]uint64{}
	for _, ep := range eps {
		got[ep.ID] = ep.DesiredRevision
	}
	if want := map[endpoint.ID]uint64{1: 2, 2: 1, 3: 1}; len(bad) > 0 || !mapsEqual(got, want) {
		t.Fatalf("degraded scan = %v %v, want %v", got, bad, want)
	}
	if h := d.Health(); h.OK || h.Cause != CauseReadOnly {
		t.Errorf("health of the degraded store = %+v, want read-only", h)
	}
	if open := openUnder(t, dir); len(open) > 0 {
		t.Errorf("files held open in the read-only state directory: %v", open)
	}
	if err := wait(t, func(done func(error)) { d.Write(benchEndpoint(t, 4), done) }); !errors.Is(err, unix.EROFS) {
		t.Errorf("write on the degraded store = %v, want EROFS", err)
	}
	if err := wait(t, func(done func(error)) { d.Remove(2, done) }); !errors.Is(err, unix.EROFS) {
		t.Errorf("remove on the degraded store = %v, want EROFS", err)
	}
	var qerr error
	d.Quarantine(3, func(_ bool, err error) { qerr = err })
	if !errors.Is(qerr, unix.EROFS) {
		t.Errorf("quarantine on the degraded store = %v, want EROFS", qerr)
	}
	// Still read-only a few probes later: nothing handed over.
	select {
	case <-handed:
		t.Fatal("store handed over while the filesystem is read-only")
	case <-time.After(3 * probeEvery):
	}

	remount(0)
	var st *Store
	select {
	case st = <-handed:
	case <-time.After(30 * time.Second):
		t.Fatal("no store handed over after the filesystem became writable")
	}
	select {
	case h := <-heardc:
		heard = append(heard, h)
	case <-time.After(10 * time.Second):
	}
	if len(heard) != 1 || !heard[0].OK {
		t.Errorf("health changes heard = %+v, want one: healthy", heard)
	}
	mustWrite(t, st, benchEndpoint(t, 4))
	st.Abort()
	got, bad = scanAll(t, dir)
	if want := map[endpoint.ID]uint64{1: 2, 3: 1, 4: 1}; len(bad) > 0 || !mapsEqual(got, want) {
		t.Errorf("state after the handover = %v %v, want %v (2's refused removal done, 4 written)", got, bad, want)
	}
}

// openUnder lists this process's open files under dir.
func openUnder(t *testing.T, dir string) []string {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && (target == dir || strings.HasPrefix(target, dir+"/")) {
			out = append(out, target)
		}
	}
	return out
}
