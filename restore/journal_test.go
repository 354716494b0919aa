package restore

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// openLagging opens a store whose checkpointer only runs when asked
// (Checkpoint, Close): the directories lag the journal until then, as
// they do between two checkpoints.
func openLagging(tb testing.TB, dir string) *Store {
	tb.Helper()
	s := openTestStore(tb, dir)
	s.cpEvery = time.Hour // before the checkpointer starts (the first request)
	return s
}

// scanAll opens a fresh store on dir, scans and aborts it (a crash: it
// applies nothing), returning what it found.
func scanAll(tb testing.TB, dir string) (map[endpoint.ID]uint64, []ScanError) {
	tb.Helper()
	s, err := Open(dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		tb.Fatal(err)
	}
	defer s.Abort()
	eps, bad := s.Scan()
	out := map[endpoint.ID]uint64{}
	for _, ep := range eps {
		out[ep.ID] = ep.DesiredRevision
	}
	return out, bad
}

func writeRev(tb testing.TB, s *Store, id endpoint.ID, rev uint64) {
	tb.Helper()
	ep := benchEndpoint(tb, id)
	ep.DesiredRevision = rev
	mustWrite(tb, s, ep)
}

// TestJournalKillBeforeCheckpoint: what was acknowledged but never
// checkpointed (the agent killed between the journal's fdatasync and the
// directories' write) comes back from the journal: writes, rewrites and
// removal tombstones, on top of what an earlier checkpoint put in the
// directories. Replaying again (another kill before any checkpoint)
// gives the same; a clean stop then leaves it all in the directories and
// nothing in the journal beyond the checkpoint.
func TestJournalKillBeforeCheckpoint(t *testing.T) {
	dir := t.TempDir()
	s := openLagging(t, dir)
	writeRev(t, s, 1, 1)
	writeRev(t, s, 2, 1)
	writeRev(t, s, 3, 1)
	mustCheckpoint(t, s) // 1, 2, 3 in the directories
	writeRev(t, s, 1, 2)
	mustRemove(t, s, 2)
	writeRev(t, s, 4, 7)
	writeRev(t, s, 4, 8)
	s.Abort() // killed: nothing of that reached the directories
	if got := dirIDs(t, dir); !mapsEqual(got, map[endpoint.ID]uint64{1: 1, 2: 1, 3: 1}) {
		t.Fatalf("directories after the kill hold %v, want the checkpoint's 1:1 2:1 3:1", got)
	}
	want := map[endpoint.ID]uint64{1: 2, 3: 1, 4: 8}
	for range 2 { // replay, killed again before a checkpoint, replay
		got, bad := scanAll(t, dir)
		if len(bad) > 0 || !mapsEqual(got, want) {
			t.Fatalf("scan after the kill: %v %v, want %v", got, bad, want)
		}
	}
	s2 := openTestStore(t, dir)
	s2.Scan()
	s2.Close()
	if got := dirIDs(t, dir); !mapsEqual(got, want) {
		t.Fatalf("directories after replay and a clean stop: %v, want %v", got, want)
	}
	s3 := openTestStore(t, dir)
	if n := len(s3.cpQueue); n != 0 {
		t.Fatalf("%d records replayed after a clean stop, want 0", n)
	}
	// A hand edit of a directory after a clean stop stands (the journal
	// holds nothing newer).
	writeDir(t, dir, "9", benchEndpoint(t, 9))
	if got, _ := scanAll(t, dir); got[9] != 1 {
		t.Fatalf("state written by hand after a clean stop not found: %v", got)
	}
}

// dirIDs reads the endpoint directories alone (no journal).
func dirIDs(t *testing.T, dir string) map[endpoint.ID]uint64 {
	t.Helper()
	out := map[endpoint.ID]uint64{}
	for _, n := range names(t, dir) {
		if strings.Contains(n, "_") {
			continue
		}
		s := &Store{dir: dir}
		ep, err := s.read(n)
		if err != nil {
			t.Fatalf("directory %s: %v", n, err)
		}
		out[ep.ID] = ep.DesiredRevision
	}
	return out
}

// TestJournalTornDirectoryReplaced: a directory a checkpoint wrote but
// whose flush never happened (torn: its ep.json empty) is not quarantined
// when the journal holds its state: the replay rewrites it.
func TestJournalTornDirectoryReplaced(t *testing.T) {
	dir := t.TempDir()
	s := openLagging(t, dir)
	writeRev(t, s, 5, 1)
	mustCheckpoint(t, s)
	writeRev(t, s, 5, 2)
	s.Abort()
	if err := os.Truncate(filepath.Join(dir, "5", stateFile), 0); err != nil {
		t.Fatal(err)
	}
	if got, bad := scanAll(t, dir); len(bad) > 0 || got[5] != 2 {
		t.Fatalf("scan: %v %v, want revision 2 and nothing quarantined", got, bad)
	}
	s2 := openTestStore(t, dir)
	s2.Scan()
	s2.Close()
	if got := dirIDs(t, dir); got[5] != 2 {
		t.Fatalf("directory after the replay: %v", got)
	}
}

// segmentWithRecords returns the path and bytes of the journal segment
// holding records, and the offsets of its records.
func segmentWithRecords(t *testing.T, dir string) (string, []byte, []int) {
	t.Helper()
	paths, _ := filepath.Glob(filepath.Join(dir, journalDir, segPrefix+"*"))
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		_, recs, _, ok := parseSegment(data, len(data))
		if !ok || len(recs) == 0 {
			continue
		}
		offs := []int{segHeaderSize}
		for _, r := range recs {
			offs = append(offs, offs[len(offs)-1]+recordSize(len(r.payload)))
		}
		return p, data, offs
	}
	t.Fatal("no journal segment holds records")
	return "", nil, nil
}

// TestJournalTornTail: the last record cut short (or its bytes garbled)
// by a crash during its append is ignored, silently: it was never
// acknowledged. The records before it replay.
func TestJournalTornTail(t *testing.T) {
	for _, tc := range []struct {
		name string
		tear func(data []byte, last, end int)
	}{
		{"zeroed", func(data []byte, last, end int) { clear(data[last+(end-last)/2 : end]) }},
		{"garbled", func(data []byte, last, end int) { data[end-3] ^= 0xff }},
		{"header only", func(data []byte, last, end int) { clear(data[last+recHeaderSize : end]) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openLagging(t, dir)
			writeRev(t, s, 1, 1)
			writeRev(t, s, 2, 1)
			writeRev(t, s, 1, 2) // the torn one
			s.Abort()
			p, data, offs := segmentWithRecords(t, dir)
			tc.tear(data, offs[len(offs)-2], offs[len(offs)-1])
			if err := os.WriteFile(p, data, 0o640); err != nil {
				t.Fatal(err)
			}
			got, bad := scanAll(t, dir)
			if len(bad) > 0 || !mapsEqual(got, map[endpoint.ID]uint64{1: 1, 2: 1}) {
				t.Fatalf("scan: %v %v, want 1:1 2:1 and no error", got, bad)
			}
			if q, _ := os.ReadDir(filepath.Join(dir, quarantineDir)); len(q) > 0 {
				t.Fatalf("a torn tail was quarantined: %v", q)
			}
		})
	}
}

// TestJournalCorruptMiddle: a record damaged in the middle of the journal
// (valid records after it) is skipped with an error naming the segment,
// a copy of the segment goes to the quarantine, the records after it
// replay, and the store opens again and again (no crash loop).
func TestJournalCorruptMiddle(t *testing.T) {
	dir := t.TempDir()
	s := openLagging(t, dir)
	writeRev(t, s, 1, 1)
	writeRev(t, s, 2, 1) // damaged
	writeRev(t, s, 3, 1)
	writeRev(t, s, 1, 2)
	s.Abort()
	p, data, offs := segmentWithRecords(t, dir)
	data[offs[1]+recHeaderSize+10] ^= 0x55
	if err := os.WriteFile(p, data, 0o640); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		got, bad := scanAll(t, dir)
		if !mapsEqual(got, map[endpoint.ID]uint64{1: 2, 3: 1}) {
			t.Fatalf("scan: %v, want 1:2 3:1 (the damaged record skipped, the ones after it replayed)", got)
		}
		if len(bad) != 1 || !errors.Is(bad[0].Err, ErrCorrupt) || bad[0].Quarantined == "" {
			t.Fatalf("scan errors %+v, want one ErrCorrupt with a quarantined copy", bad)
		}
		if q, err := os.ReadFile(bad[0].Quarantined); err != nil || !bytes.Equal(q, data) {
			t.Fatalf("quarantined copy of the segment: %v", err)
		}
	}
}

// TestJournalRecordUndecodable: a record whose CRC checks but whose state
// does not decode is set aside (its bytes in the quarantine) and the
// endpoint keeps its directory's state.
func TestJournalRecordUndecodable(t *testing.T) {
	dir := t.TempDir()
	s := openLagging(t, dir)
	writeRev(t, s, 6, 1)
	mustCheckpoint(t, s)
	writeRev(t, s, 6, 2)
	s.Abort()
	p, data, offs := segmentWithRecords(t, dir)
	last := offs[len(offs)-2]
	r, _, err := decodeRecord(data[last:], len(data))
	if err != nil {
		t.Fatal(err)
	}
	r.payload = []byte(`{"version": 99}`)
	rec := appendRecord(nil, r)
	copy(data[last:], rec)
	clear(data[last+len(rec) : offs[len(offs)-1]])
	if err := os.WriteFile(p, data, 0o640); err != nil {
		t.Fatal(err)
	}
	got, bad := scanAll(t, dir)
	if got[6] != 1 || len(bad) != 1 || !errors.Is(bad[0].Err, ErrUnknownVersion) || bad[0].Quarantined == "" {
		t.Fatalf("scan: %v %+v, want revision 1 from the directory and the record quarantined", got, bad)
	}
}

// TestJournalSegmentsRecycled: far more records than the journal holds
// (each checkpoint frees the segments whose records the directories
// hold): the journal's files stay bounded and every state survives a
// kill.
func TestJournalSegmentsRecycled(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir)
	ep := benchEndpoint(t, 1)
	var rec []byte
	if r, err := s.encode(ep); err == nil {
		rec = r.data
		r.release()
	}
	per := s.j.segSize / recordSize(len(rec))
	const clients = 64
	rounds := 3 * maxSegments * per / 2 / clients // one and a half journals
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ep := benchEndpoint(t, endpoint.ID(1+c))
			for i := range rounds {
				ep.DesiredRevision = uint64(i)
				if err := wait(t, func(done func(error)) { s.Write(ep, done) }); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	paths, _ := filepath.Glob(filepath.Join(dir, journalDir, segPrefix+"*"))
	if len(paths) > maxSegments {
		t.Fatalf("%d journal segments, at most %d", len(paths), maxSegments)
	}
	if st := s.Stats(); st.Checkpoints < 2 {
		t.Fatalf("%d checkpoints for %d records", st.Checkpoints, clients*rounds)
	}
	s.Abort()
	got, bad := scanAll(t, dir)
	if len(bad) > 0 || len(got) != clients {
		t.Fatalf("scan after the kill: %d endpoints, %v", len(got), bad)
	}
	for id, rev := range got {
		if rev != uint64(rounds-1) {
			t.Errorf("endpoint %d at revision %d, want %d", id, rev, rounds-1)
		}
	}
}

// TestJournalQuarantine: Quarantine goes through the journal and its
// checkpoint: it says whether state was there, the state lands in the
// quarantine, and a kill after it does not bring the endpoint back.
func TestJournalQuarantine(t *testing.T) {
	dir := t.TempDir()
	s := openLagging(t, dir)
	writeRev(t, s, 8, 1)
	mustCheckpoint(t, s)
	for _, want := range []bool{true, false} {
		ch := make(chan bool, 1)
		s.Quarantine(8, func(moved bool, err error) {
			if err != nil {
				t.Error(err)
			}
			ch <- moved
		})
		if got := <-ch; got != want {
			t.Fatalf("quarantine moved=%v, want %v", got, want)
		}
	}
	s.Abort()
	if got, bad := scanAll(t, dir); len(got) != 0 || len(bad) != 0 {
		t.Fatalf("scan after quarantine: %v %v", got, bad)
	}
	if q, _ := os.ReadDir(filepath.Join(dir, quarantineDir)); len(q) != 1 {
		t.Fatalf("quarantine holds %d entries, want 1", len(q))
	}
}

// FuzzJournalSegment: any bytes as a segment never panic the parser; what
// it returns are records of the segment's generation in increasing seq
// order with valid kinds and IDs, each of which encodes back to the
// bytes it was read from; corrupt spans lie within the segment.
func FuzzJournalSegment(f *testing.F) {
	seg := appendSegHeader(nil, 7)
	for i, p := range [][]byte{[]byte(`{"version":1}`), nil, []byte("x")} {
		kind := kindWrite
		if p == nil {
			kind = kindRemove
		}
		seg = appendRecord(seg, jrecord{gen: 7, seq: uint64(10 + i), id: endpoint.ID(1 + i), kind: kind, payload: p})
	}
	f.Add(seg)
	f.Add(seg[:len(seg)-2])
	bad := bytes.Clone(seg)
	bad[segHeaderSize+recHeaderSize+3] ^= 1
	f.Add(bad)
	f.Add(make([]byte, 200))
	f.Fuzz(func(t *testing.T, data []byte) {
		gen, recs, spans, ok := parseSegment(data, 1<<16)
		if !ok && (len(recs) > 0 || len(spans) > 0) {
			t.Fatal("records from a segment without a valid header")
		}
		var last uint64
		for _, r := range recs {
			if r.gen != gen || r.seq <= last || r.id == 0 {
				t.Fatalf("record %+v (segment gen %d, previous seq %d)", r, gen, last)
			}
			last = r.seq
			enc := appendRecord(nil, r)
			if !bytes.Contains(data, enc) {
				t.Fatalf("record %+v does not encode back to bytes of the segment", r)
			}
			if r2, n, err := decodeRecord(enc, 1<<16); err != nil || n != len(enc) || r2.seq != r.seq || !bytes.Equal(r2.payload, r.payload) {
				t.Fatalf("round trip of %+v: %+v %d %v", r, r2, n, err)
			}
		}
		for _, s := range spans {
			if s.off < segHeaderSize || s.end <= s.off || s.end > len(data) {
				t.Fatalf("corrupt span %+v outside the segment of %d bytes", s, len(data))
			}
		}
	})
}

// TestJournalBackPressure: with every segment sealed (all waiting for a
// checkpoint) an append waits: it asks for a checkpoint and gets a
// segment once the checkpoint frees one, the one whose records are all
// in the directories.
func TestJournalBackPressure(t *testing.T) {
	dir := t.TempDir()
	j, _, err := openJournal(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		j.stop()
		j.closeFiles()
	}()
	j.mu.Lock()
	for j.nsegs < maxSegments || len(j.free) < maxSegments { // let the preallocator make them all
		j.need = true
		j.cond.Broadcast()
		j.cond.Wait()
	}
	for i, s := range j.free {
		s.maxSeq = uint64(10 + i)
	}
	j.sealed, j.free = j.free, nil
	j.mu.Unlock()

	kicked := make(chan struct{}, 1)
	got := make(chan *segment, 1)
	go func() {
		s, err := j.take(100, func() {
			select {
			case kicked <- struct{}{}:
			default:
			}
		})
		if err != nil {
			t.Error(err)
		}
		got <- s
	}()
	<-kicked // it waits for a checkpoint, and asked for one
	if err := j.checkpointed(10); err != nil {
		t.Fatal(err)
	}
	s := <-got
	if s == nil || s.used != 0 || s.gen == 0 {
		t.Fatalf("took %+v, want the freed segment started with a new generation", s)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.sealed) != maxSegments-1 {
		t.Fatalf("%d segments sealed, want %d (only the checkpointed one freed)", len(j.sealed), maxSegments-1)
	}
}
