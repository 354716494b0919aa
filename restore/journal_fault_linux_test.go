package restore

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// TestJournalFailedAppend: an append the kernel refuses (here EBADF: the
// current segment's descriptor is made read-only for one write) fails
// that write, and only that write. The segment it went to is sealed (it
// held an acknowledged record, so it waits for the checkpoint, then is
// freed), the next write goes to another segment or to that one only
// after a checkpoint freed it (a new generation), and a kill then
// replays exactly the acknowledged records.
func TestJournalFailedAppend(t *testing.T) {
	dir := t.TempDir()
	s := openLagging(t, dir)
	writeRev(t, s, 1, 1)
	s.j.mu.Lock()
	seg := s.j.cur
	s.j.mu.Unlock()
	if seg == nil {
		t.Fatal("no current segment after a write")
	}
	// Swap a read-only description of the same file in under the
	// segment's descriptor, for one write.
	orig, err := unix.Dup(seg.fd)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(orig)
	ro, err := unix.Open(filepath.Join(s.j.dir, seg.name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Dup3(ro, seg.fd, unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	unix.Close(ro)
	err = wait(t, func(done func(error)) { s.Write(benchEndpoint(t, 2), done) })
	if !errors.Is(err, unix.EBADF) {
		t.Fatalf("write while the segment refuses writes = %v, want EBADF", err)
	}
	if err := unix.Dup3(orig, seg.fd, unix.O_CLOEXEC); err != nil { // writable again
		t.Fatal(err)
	}
	s.j.mu.Lock()
	cur, sealed := s.j.cur, slices.Contains(s.j.sealed, seg)
	s.j.mu.Unlock()
	if cur == seg || !sealed {
		t.Fatalf("after the failed append: segment still current (%v) or not sealed (%v)", cur == seg, !sealed)
	}
	s.j.mu.Lock()
	gen := seg.gen
	s.j.mu.Unlock()
	// The next write takes another segment; with none free (the
	// preallocator may not have made one yet) it has the checkpointer
	// free the sealed one, which then starts over with a new generation.
	writeRev(t, s, 3, 1)
	mustCheckpoint(t, s)
	s.j.mu.Lock()
	cur = s.j.cur
	sealed, free, newGen := slices.Contains(s.j.sealed, seg), slices.Contains(s.j.free, seg), seg.gen != gen
	s.j.mu.Unlock()
	switch {
	case cur == seg && !newGen:
		t.Fatal("the write after the failure went to the sealed segment, same generation")
	case cur != seg && (sealed || !free):
		t.Fatalf("after the checkpoint the sealed segment is sealed %v, free %v; want freed", sealed, free)
	}
	writeRev(t, s, 1, 2) // after the checkpoint: only in the journal
	s.Abort()
	got, bad := scanAll(t, dir)
	if want := map[endpoint.ID]uint64{1: 2, 3: 1}; len(bad) > 0 || !mapsEqual(got, want) {
		t.Fatalf("scan after the kill: %v %v, want %v (the failed write absent)", got, bad, want)
	}
}
