package restore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// The journal lives in <state-dir>/journal/: segment files seg-<n> of a
// fixed size, written full of zeros and flushed once when made (by the
// preallocator goroutine, ahead of need), and a checkpoint file saying
// through which sequence number the endpoint directories hold every
// record. Appending a record rewrites blocks the file already has: its
// size and extents never change, so fdatasync writes the data and
// flushes the disk, and ext4 has no journal commit to wait for.

const (
	journalDir     = "journal"
	checkpointFile = "checkpoint"
	segPrefix      = "seg-"
	tmpSuffix      = ".tmp"
	// maxSegments bounds the journal's files: with every segment sealed
	// and waiting for a checkpoint, appends wait (back-pressure).
	maxSegments = 16
	// minSegSize and maxSegSize bound a segment's size, which is 1/64 of
	// the filesystem's (a small tmpfs gets small segments).
	minSegSize = 16 << 10
	maxSegSize = 1 << 20
	// markerSlot is the size of one of the checkpoint file's two slots.
	markerSlot = 512
)

// segment is one journal file.
type segment struct {
	fd   int
	name string
	size int
	// gen is the generation it was last started with, used the bytes
	// written since (0: not started), maxSeq its newest record's seq.
	gen    uint32
	used   int
	maxSeq uint64
}

// journal owns the segment files and says which ones are free. The
// store's appender takes free segments (current), seals full ones; the
// checkpointer frees sealed ones once the directories hold their
// records; the preallocator makes new files.
type journal struct {
	dir string
	// ro reads the journal without writing to it (OpenDegraded): files
	// opened read-only, nothing made or removed.
	ro      bool
	log     *slog.Logger
	segSize int
	marker  int // the checkpoint file's fd

	// mu guards the fields below; cond signals changes to free, need
	// and stopping.
	mu       sync.Mutex
	cond     *sync.Cond
	free     []*segment
	sealed   []*segment
	cur      *segment
	nsegs    int // files made or being made
	nextGen  uint32
	nextSeq  uint64
	through  uint64 // checkpointed through this seq
	slot     int    // the marker slot the next checkpoint writes
	need     bool   // the appender waits for a new file
	preErr   error  // the preallocator's last failure
	stopping bool
	done     chan struct{}
}

// replayed is what Open found in the journal beyond the checkpoint.
type replayed struct {
	recs []jrecord // in seq order
	bad  []ScanError
}

// openJournal opens (or makes) the journal under stateDir, reads what it
// holds beyond the last checkpoint, and starts the preallocator.
func openJournal(stateDir string, log *slog.Logger) (*journal, replayed, error) {
	dir := filepath.Join(stateDir, journalDir)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, replayed{}, fmt.Errorf("open journal: %w", err)
	}
	j := &journal{dir: dir, log: log, segSize: segSizeFor(dir), marker: -1, done: make(chan struct{})}
	j.cond = sync.NewCond(&j.mu)
	rp, err := j.load(stateDir)
	if err != nil {
		j.closeFiles()
		return nil, replayed{}, err
	}
	if len(j.free) == 0 && j.nsegs < maxSegments {
		// The first append should not wait for a file; a failure (a full
		// disk) is left to the preallocator and reported to the writes.
		if seg, err := j.makeSegment(j.nsegs); err == nil {
			j.free = append(j.free, seg)
			j.nsegs++
		} else {
			log.Error("cannot make a journal segment", "err", err)
		}
	}
	go j.preallocate()
	return j, rp, nil
}

// segSizeFor picks the segment size for the filesystem holding dir.
func segSizeFor(dir string) int {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return minSegSize
	}
	size := int(uint64(st.Blocks) * uint64(st.Bsize) / 64)
	return min(max(size, minSegSize), maxSegSize) &^ 4095
}

// maxPayload bounds a record's payload (an ep.json): a quarter segment.
func (j *journal) maxPayload() int { return j.segSize / 4 }

// load reads the checkpoint and every segment, and sorts the segments
// into free and sealed (holding records beyond the checkpoint).
func (j *journal) load(stateDir string) (replayed, error) {
	if err := j.openMarker(); err != nil {
		return replayed{}, err
	}
	entries, err := os.ReadDir(j.dir)
	if err != nil {
		return replayed{}, fmt.Errorf("open journal: %w", err)
	}
	var rp replayed
	var maxGen uint32
	maxSeq := j.through
	for _, e := range entries {
		name := e.Name()
		switch {
		case strings.HasSuffix(name, tmpSuffix): // a preallocation cut short
			if !j.ro {
				_ = os.Remove(filepath.Join(j.dir, name))
			}
			continue
		case !strings.HasPrefix(name, segPrefix):
			continue
		}
		seg, data, err := j.openSegment(name)
		if err != nil {
			return replayed{}, err
		}
		j.nsegs++
		gen, recs, bad, ok := parseSegment(data, max(seg.size/4, j.maxPayload()))
		if len(bad) > 0 {
			rp.bad = append(rp.bad, j.quarantineSegment(stateDir, name, data, bad))
		}
		if ok {
			maxGen = max(maxGen, gen)
		}
		for _, r := range recs {
			maxSeq = max(maxSeq, r.seq)
			if r.seq > j.through {
				rp.recs = append(rp.recs, r)
				seg.maxSeq = max(seg.maxSeq, r.seq)
			}
		}
		if seg.maxSeq > 0 {
			j.sealed = append(j.sealed, seg)
		} else {
			j.free = append(j.free, seg)
		}
	}
	slices.SortFunc(rp.recs, func(a, b jrecord) int { return cmpUint(a.seq, b.seq) })
	j.nextGen, j.nextSeq = maxGen+1, maxSeq+1
	return rp, nil
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// openSegment opens a segment file and reads it whole.
func (j *journal) openSegment(name string) (*segment, []byte, error) {
	path := filepath.Join(j.dir, name)
	fd, err := unix.Open(path, j.openFlags(), 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open journal segment %s: %w", path, err)
	}
	var st unix.Stat_t
	err = unix.Fstat(fd, &st)
	data := make([]byte, min(max(st.Size, 0), maxSegSize))
	for off := 0; err == nil && off < len(data); {
		var n int
		n, err = unix.Pread(fd, data[off:], int64(off))
		switch {
		case errors.Is(err, unix.EINTR):
			err = nil
		case err == nil && n == 0:
			data = data[:off]
		}
		off += n
	}
	if err != nil {
		_ = unix.Close(fd)
		return nil, nil, fmt.Errorf("read journal segment %s: %w", path, err)
	}
	return &segment{fd: fd, name: name, size: len(data)}, data, nil
}

// quarantineSegment copies a segment with corrupt records in the middle
// into the quarantine (for an operator) and says what was skipped.
func (j *journal) quarantineSegment(stateDir, name string, data []byte, bad []corruptSpan) ScanError {
	var where []string
	for _, b := range bad {
		where = append(where, fmt.Sprintf("bytes %d-%d", b.off, b.end))
	}
	se := ScanError{Dir: filepath.Join(j.dir, name),
		Err: fmt.Errorf("journal segment %s: corrupt records skipped (%s): %w", name, strings.Join(where, ", "), ErrCorrupt)}
	qdir := filepath.Join(stateDir, quarantineDir)
	dst := filepath.Join(qdir, fmt.Sprintf("journal-%s-%d", name, j.nextSeq))
	if err := os.MkdirAll(qdir, 0o750); err == nil {
		if err := os.WriteFile(dst, data, 0o640); err == nil {
			se.Quarantined = dst
		}
	}
	j.log.Error("corrupt records in the middle of the state journal skipped; the records after them are replayed",
		"segment", se.Dir, "spans", strings.Join(where, ", "), "copy", se.Quarantined)
	return se
}

// openMarker opens (or makes) the checkpoint file and reads it: two
// slots, each a seq and its CRC; the valid one with the larger seq wins.
func (j *journal) openMarker() error {
	path := filepath.Join(j.dir, checkpointFile)
	fd, err := unix.Open(path, j.openFlags(), 0)
	if errors.Is(err, unix.ENOENT) && j.ro {
		return nil // never checkpointed: every record is beyond it
	}
	if errors.Is(err, unix.ENOENT) {
		if err = writeZeros(j.dir, checkpointFile, 2*markerSlot); err == nil {
			fd, err = unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
		}
	}
	if err != nil {
		return fmt.Errorf("open journal checkpoint %s: %w", path, err)
	}
	j.marker = fd
	var b [2 * markerSlot]byte
	n, _ := unix.Pread(fd, b[:], 0)
	for s := range 2 {
		if (s+1)*markerSlot > n {
			break
		}
		if seq, ok := decodeMarker(b[s*markerSlot:]); ok && seq >= j.through {
			j.through, j.slot = seq, 1-s
		}
	}
	return nil
}

// openFlags are the flags the journal's files are opened with.
func (j *journal) openFlags() int {
	if j.ro {
		return unix.O_RDONLY | unix.O_CLOEXEC
	}
	return unix.O_RDWR | unix.O_CLOEXEC
}

func encodeMarker(seq uint64) [12]byte {
	var b [12]byte
	binary.LittleEndian.PutUint64(b[:], seq)
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b[:8], castagnoli)^0xffffffff)
	return b
}

func decodeMarker(b []byte) (uint64, bool) {
	seq := binary.LittleEndian.Uint64(b)
	if binary.LittleEndian.Uint32(b[8:]) != crc32.Checksum(b[:8], castagnoli)^0xffffffff {
		return 0, false
	}
	return seq, true
}

// checkpointed records that the directories hold every record through
// seq (durably: called after the checkpoint's flush) and frees the
// sealed segments whose records are all in.
func (j *journal) checkpointed(seq uint64) error {
	b := encodeMarker(seq)
	if err := pwriteAll(j.marker, b[:], int64(j.slot*markerSlot)); err != nil {
		return fmt.Errorf("write journal checkpoint: %w", err)
	}
	if err := fdatasync(j.marker); err != nil {
		return fmt.Errorf("write journal checkpoint: %w", err)
	}
	j.mu.Lock()
	j.slot = 1 - j.slot
	j.through = seq
	j.freeCheckpointed()
	j.mu.Unlock()
	j.cond.Broadcast()
	return nil
}

// freeCheckpointed frees the sealed segments whose records the
// directories hold. j.mu held.
func (j *journal) freeCheckpointed() {
	kept := j.sealed[:0]
	for _, s := range j.sealed {
		if s.maxSeq <= j.through {
			s.used, s.maxSeq = 0, 0
			j.free = append(j.free, s)
		} else {
			kept = append(kept, s)
		}
	}
	clear(j.sealed[len(kept):])
	j.sealed = kept
}

// preallocate makes a new segment file whenever the appender is about to
// run out of free ones (and the journal is below maxSegments).
func (j *journal) preallocate() {
	defer close(j.done)
	j.mu.Lock()
	defer j.mu.Unlock()
	for {
		for !j.stopping && !(j.nsegs < maxSegments && (j.need || len(j.free) == 0)) {
			j.cond.Wait()
		}
		if j.stopping {
			return
		}
		n := j.nsegs
		j.nsegs++
		j.need = false
		j.mu.Unlock()
		seg, err := j.makeSegment(n)
		j.mu.Lock()
		if err != nil {
			j.nsegs--
			j.preErr = err
			j.log.Error("cannot make a journal segment", "err", err)
		} else {
			j.free = append(j.free, seg)
		}
		j.cond.Broadcast()
		if err != nil {
			// Wait until the appender asks again (need), not in a loop.
			for !j.stopping && !j.need {
				j.cond.Wait()
			}
		}
	}
}

// makeSegment writes a new segment file full of zeros, flushes it and
// its directory entry, and opens it.
func (j *journal) makeSegment(n int) (*segment, error) {
	name := segPrefix + strconv.Itoa(n)
	if err := writeZeros(j.dir, name, j.segSize); err != nil {
		return nil, fmt.Errorf("make journal segment: %w", err)
	}
	fd, err := unix.Open(filepath.Join(j.dir, name), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("make journal segment: %w", err)
	}
	return &segment{fd: fd, name: name, size: j.segSize}, nil
}

// writeZeros makes dir/name, size bytes of zeros, durably: written under
// a temporary name, flushed, renamed into place, the directory flushed.
func writeZeros(dir, name string, size int) error {
	tmp := filepath.Join(dir, name+tmpSuffix)
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	zeros := make([]byte, min(size, 64<<10))
	for off := 0; off < size && err == nil; off += len(zeros) {
		_, err = f.Write(zeros[:min(len(zeros), size-off)])
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// take returns the segment to append n more bytes to: the current one
// if they fit, else a free one (the current one is sealed). With none
// free it waits for a checkpoint or a new file (back-pressure); kick asks
// the checkpointer to run now. It fails when no segment can come (the
// preallocator failed and nothing waits for a checkpoint) or the store
// stops.
func (j *journal) take(n int, kick func()) (*segment, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if c := j.cur; c != nil && c.used+n <= c.size {
		return c, nil
	}
	if c := j.cur; c != nil {
		j.cur = nil
		if c.maxSeq > 0 {
			j.sealed = append(j.sealed, c)
		} else {
			j.free = append(j.free, c)
		}
		if len(j.sealed) >= maxSegments/4 {
			kick() // a quarter of the journal waits: checkpoint before it fills
		}
	}
	for len(j.free) == 0 {
		j.freeCheckpointed()
		if len(j.free) > 0 {
			break
		}
		switch {
		case j.stopping:
			return nil, ErrClosed
		case len(j.sealed) > 0:
			kick()
		case j.preErr != nil:
			err := j.preErr
			j.preErr, j.need = nil, true // the next append tries again
			j.cond.Broadcast()
			return nil, fmt.Errorf("state journal: %w", err)
		default:
			j.need = true
			j.cond.Broadcast()
		}
		j.cond.Wait()
	}
	// Prefer a segment big enough; a smaller one (made for another
	// filesystem size) is taken only for records that fit.
	i := slices.IndexFunc(j.free, func(s *segment) bool { return segHeaderSize+n <= s.size })
	if i < 0 {
		return nil, fmt.Errorf("state journal: a record of %d bytes fits no segment", n)
	}
	s := j.free[i]
	j.free = slices.Delete(j.free, i, i+1)
	s.gen, s.used, s.maxSeq = j.nextGen, 0, 0
	j.nextGen++
	j.cur = s
	if len(j.free) == 0 {
		j.cond.Broadcast() // the preallocator makes the next one now
	}
	return s, nil
}

// seal retires the current segment after a failed write: what it holds
// past its durable records is uncertain, so nothing more is appended to
// it. It is freed once its durable records are checkpointed (at once if
// it has none): reused with a new generation, the failed records are
// never read.
func (j *journal) seal(s *segment) {
	j.mu.Lock()
	if j.cur == s {
		j.cur = nil
		if s.maxSeq > 0 {
			j.sealed = append(j.sealed, s)
		} else {
			j.free = append(j.free, s)
		}
	}
	j.mu.Unlock()
	j.cond.Broadcast()
}

// seqs reserves n sequence numbers and returns the first.
func (j *journal) seqs(n int) uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	first := j.nextSeq
	j.nextSeq += uint64(n)
	return first
}

// stop ends the preallocator and wakes a waiting appender.
func (j *journal) stop() {
	j.mu.Lock()
	j.stopping = true
	j.mu.Unlock()
	j.cond.Broadcast()
	<-j.done
}

// closeFiles closes every segment and the checkpoint file.
func (j *journal) closeFiles() {
	j.mu.Lock()
	defer j.mu.Unlock()
	segs := slices.Concat(j.free, j.sealed)
	if j.cur != nil {
		segs = append(segs, j.cur)
	}
	for _, s := range segs {
		_ = unix.Close(s.fd)
	}
	j.free, j.sealed, j.cur = nil, nil, nil
	if j.marker >= 0 {
		_ = unix.Close(j.marker)
		j.marker = -1
	}
}

// pwriteAll writes b at off, retrying EINTR and short writes.
func pwriteAll(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(fd, b, off)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return err
		case n == 0:
			return io.ErrShortWrite
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

func fdatasync(fd int) error {
	for {
		if err := unix.Fdatasync(fd); !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
