package restore

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

func openTestStore(tb testing.TB, dir string) *Store {
	tb.Helper()
	s, err := Open(dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// wait runs op (Write or Remove with a callback) and returns its outcome.
func wait(tb testing.TB, op func(done func(error))) error {
	tb.Helper()
	ch := make(chan error, 1)
	op(func(err error) { ch <- err })
	select {
	case err := <-ch:
		return err
	case <-time.After(30 * time.Second):
		tb.Fatal("state operation never answered")
		return nil
	}
}

func mustWrite(tb testing.TB, s *Store, ep *endpoint.Endpoint) {
	tb.Helper()
	if err := wait(tb, func(done func(error)) { s.Write(ep, done) }); err != nil {
		tb.Fatal(err)
	}
}

// mustCheckpoint waits until the directories hold everything written.
func mustCheckpoint(tb testing.TB, s *Store) {
	tb.Helper()
	if err := s.Checkpoint(); err != nil {
		tb.Fatal(err)
	}
}

func mustRemove(tb testing.TB, s *Store, id endpoint.ID) {
	tb.Helper()
	if err := wait(tb, func(done func(error)) { s.Remove(id, done) }); err != nil {
		tb.Fatal(err)
	}
}

// names lists the entries of dir (sorted), without the trash and
// quarantine directories.
func names(tb testing.TB, dir string) []string {
	tb.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	for _, e := range es {
		if e.Name() != trashDir && e.Name() != quarantineDir && e.Name() != journalDir {
			out = append(out, e.Name())
		}
	}
	return out
}

// scanIDs returns the endpoints a fresh store finds, with their
// revisions. The fresh store is aborted, not closed: it must not apply
// the journal to the directories under the store the test runs.
func scanIDs(tb testing.TB, dir string) map[endpoint.ID]uint64 {
	tb.Helper()
	out, bad := scanAll(tb, dir)
	if len(bad) > 0 {
		tb.Fatalf("scan: %+v", bad)
	}
	return out
}

// TestStoreWriteRemove: writes replace the state (with and without
// renameat2 exchange), removals leave nothing behind once the janitor ran,
// and a fresh Scan sees exactly the acknowledged state.
func TestStoreWriteRemove(t *testing.T) {
	for _, tc := range []struct {
		name       string
		noExchange bool
	}{{"exchange", false}, {"rename-dance", true}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openTestStore(t, dir)
			s.noExchange.Store(tc.noExchange) // before the first write
			a, b := benchEndpoint(t, 1), benchEndpoint(t, 2)
			for rev := uint64(1); rev <= 3; rev++ {
				a.DesiredRevision = rev
				mustWrite(t, s, a)
			}
			mustWrite(t, s, b)
			mustCheckpoint(t, s) // directories to remove (else the checkpoint coalesces them away)
			if got, want := scanIDs(t, dir), map[endpoint.ID]uint64{1: 3, 2: 1}; !mapsEqual(got, want) {
				t.Fatalf("scan after writes: %v, want %v", got, want)
			}
			if tc.noExchange && slices.Contains(names(t, dir), "1_next") {
				t.Error("the rename dance left 1_next behind")
			}
			mustRemove(t, s, 1)
			mustRemove(t, s, 7) // never written: success
			if got := scanIDs(t, dir); !mapsEqual(got, map[endpoint.ID]uint64{2: 1}) {
				t.Fatalf("scan after remove: %v", got)
			}
			mustRemove(t, s, 2)
			trash := func() int {
				es, _ := os.ReadDir(filepath.Join(dir, trashDir))
				return len(es)
			}
			mustCheckpoint(t, s)
			kept := trash()
			if kept == 0 {
				t.Fatal("removed directories were not kept for reuse")
			}
			// A new endpoint reuses a removed directory; its shorter
			// state must replace the old files entirely.
			small := &endpoint.Endpoint{ID: 3, DesiredRevision: 4}
			mustWrite(t, s, small)
			mustCheckpoint(t, s)
			if got := scanIDs(t, dir); !mapsEqual(got, map[endpoint.ID]uint64{3: 4}) {
				t.Fatalf("scan after reuse: %v", got)
			}
			if trash() != kept-1 {
				t.Errorf("trash holds %d directories after a write, want %d (one reused)", trash(), kept-1)
			}
			mustRemove(t, s, 3)
			s.Close()
			if got := names(t, dir); len(got) != 0 {
				t.Errorf("left behind: %v", got)
			}
		})
	}
}

func mapsEqual(a, b map[endpoint.ID]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestScanLeftovers: what an interrupted write or removal leaves is
// resolved to the last state that was acknowledged, and writes after the
// scan work on top of it.
func TestScanLeftovers(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup turns a directory holding 5 (revision 1) and 5_next
		// (revision 2, complete) into the leftover to test.
		setup func(t *testing.T, dir string)
		want  uint64 // revision Scan must find (0: none)
	}{
		{"next beside the state is a spare", func(*testing.T, string) {}, 1},
		{"next alone is dropped", func(t *testing.T, dir string) { mv(t, dir, "5", "trash/5-x") }, 0},
		{"stale beside the state is dropped", func(t *testing.T, dir string) { mv(t, dir, "5_next", "5_stale") }, 1},
		{"stale alone is the state", func(t *testing.T, dir string) {
			mv(t, dir, "5", "5_stale")
			mv(t, dir, "5_next", "trash/5-y")
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.MkdirAll(filepath.Join(dir, trashDir), 0o750); err != nil {
				t.Fatal(err)
			}
			ep := benchEndpoint(t, 5)
			writeDir(t, dir, "5", ep)
			ep.DesiredRevision = 2
			writeDir(t, dir, "5_next", ep)
			tc.setup(t, dir)
			got := scanIDs(t, dir)
			if tc.want == 0 && len(got) != 0 || tc.want != 0 && got[5] != tc.want {
				t.Fatalf("scan found %v, want revision %d", got, tc.want)
			}
			s := openTestStore(t, dir)
			s.Scan()
			for _, rev := range []uint64{8, 9} {
				ep.DesiredRevision = rev
				mustWrite(t, s, ep)
			}
			if got := scanIDs(t, dir); got[5] != 9 {
				t.Fatalf("after rewriting: %v", got)
			}
			for _, n := range names(t, dir) {
				if n != "5" && n != "5_next" {
					t.Errorf("left behind: %s", n)
				}
			}
		})
	}
}

func mv(t *testing.T, dir, from, to string) {
	t.Helper()
	if err := os.Rename(filepath.Join(dir, from), filepath.Join(dir, to)); err != nil {
		t.Fatal(err)
	}
}

// writeDir writes ep's state into dir/name as the store would.
func writeDir(t *testing.T, dir, name string, ep *endpoint.Endpoint) {
	t.Helper()
	data, err := json.MarshalIndent(FromEndpoint(ep), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	d := filepath.Join(dir, name)
	if err := os.Mkdir(d, 0o750); err != nil {
		t.Fatal(err)
	}
	for file, b := range map[string][]byte{stateFile: data, headerFile: headerReflect(ep)} {
		if err := os.WriteFile(filepath.Join(d, file), b, 0o640); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFileOpsDoNotAllocate: a lifecycle's file operations (write into a
// reused directory, exchange, removal into the trash and its reuse) make
// no garbage: paths are built on the stack and the syscalls take them as
// they are.
func TestFileOpsDoNotAllocate(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir)
	ep := benchEndpoint(t, 9)
	mustWrite(t, s, ep)
	mustCheckpoint(t, s)
	r, err := s.encode(ep)
	if err != nil {
		t.Fatal(err)
	}
	defer r.release()
	allocs := testing.AllocsPerRun(50, func() {
		for range 2 { // create (rename into place), regenerate (exchange)
			old, err := s.takeNext(r.id)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.writeNext(r, old); err != nil {
				t.Fatal(err)
			}
			if err := s.swap(r.id); err != nil {
				t.Fatal(err)
			}
		}
		var res result
		if err := s.remove(r.id, &res); err != nil || res.ntrash != 2 {
			t.Fatalf("remove: %v, %d directories to the trash, want 2", err, res.ntrash)
		}
		s.recycle(res.trash[:res.ntrash])
	})
	if allocs > 0 {
		t.Errorf("a lifecycle's file operations allocate %.1f times, want 0", allocs)
	}
	if got := scanIDs(t, dir); len(got) != 0 {
		t.Errorf("scan after the removal found %v", got)
	}
}

// TestWriteOverUnknownState: a store that did not scan (so does not know
// that <id> exists) still replaces it, whether the filesystem exchanges or
// not; the next write then has a spare to overwrite.
func TestWriteOverUnknownState(t *testing.T) {
	for _, noExchange := range []bool{false, true} {
		t.Run(fmt.Sprintf("noExchange=%v", noExchange), func(t *testing.T) {
			dir := t.TempDir()
			ep := benchEndpoint(t, 5)
			writeDir(t, dir, "5", ep)
			s := openTestStore(t, dir)
			s.noExchange.Store(noExchange)
			for _, rev := range []uint64{2, 3} {
				ep.DesiredRevision = rev
				mustWrite(t, s, ep)
				mustCheckpoint(t, s)
				if got := scanIDs(t, dir); got[5] != rev {
					t.Fatalf("after writing revision %d: %v", rev, got)
				}
			}
			if want := !noExchange; s.isSpare(5) != want {
				t.Errorf("spare after two writes: %v, want %v", s.isSpare(5), want)
			}
		})
	}
}

// TestRewritesKeepFilesExact: writes of growing and shrinking state
// through spares and recycled directories (of other endpoints) leave in
// <id> exactly the files of the last write: a file is cut when what it
// held was longer, whatever the directory held before.
func TestRewritesKeepFilesExact(t *testing.T) {
	for _, noExchange := range []bool{false, true} {
		t.Run(fmt.Sprintf("noExchange=%v", noExchange), func(t *testing.T) {
			dir := t.TempDir()
			s := openTestStore(t, dir)
			s.noExchange.Store(noExchange)
			sizes := []int{0, 40, 3, 40, 1, 0, 25, 2}
			for step := range 40 {
				id := endpoint.ID(1 + step%3)
				ep := benchEndpoint(t, id)
				ep.ContainerID = strings.Repeat("c", sizes[step%len(sizes)]*7%41)
				ep.DesiredRevision = uint64(step * step * 997 % 100003)
				if step%7 == 6 {
					mustRemove(t, s, id)
					mustCheckpoint(t, s)
					continue
				}
				mustWrite(t, s, ep)
				mustCheckpoint(t, s)
				want, err := encodeState(nil, ep)
				if err != nil {
					t.Fatal(err)
				}
				for file, want := range map[string][]byte{stateFile: want, headerFile: appendHeader(nil, ep)} {
					got, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(int(id)), file))
					if err != nil || !bytes.Equal(got, want) {
						t.Fatalf("step %d: %s of endpoint %d (%v):\n%s\nwant:\n%s", step, file, id, err, got, want)
					}
				}
			}
		})
	}
}
