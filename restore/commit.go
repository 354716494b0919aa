package restore

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// batch is a group of requests on its way through the writer. When an
// endpoint appears several times, only its last request is applied;
// every request is answered. The writer reuses a finished batch's maps
// and slices for the next group.
type batch struct {
	group  []request
	last   map[endpoint.ID]int // index of the request applied per ID
	final  []int               // those indexes
	writes []int               // the writes among them
	res    []result            // per request, at the index of the applied one
}

// result is the outcome of one applied request.
type result struct {
	err error
	// old is the sizes of the files in a write's <id>_next before it.
	old dirSizes
	// trash holds the directories a removal moved to the trash.
	trash  [2]trashEntry
	ntrash int
	// quarantined says a quarantine request found state and moved it.
	quarantined bool
}

// newBatch takes the batch kept for reuse (or makes one) for group.
func (s *Store) newBatch(group []request) *batch {
	b := s.freeBatch
	s.freeBatch = nil
	if b == nil {
		b = &batch{last: make(map[endpoint.ID]int, len(group))}
	}
	b.group = group
	b.final, b.writes = b.final[:0], b.writes[:0]
	if cap(b.res) < len(group) {
		b.res = make([]result, len(group))
	}
	b.res = b.res[:len(group)]
	clear(b.res)
	for i, r := range group {
		b.last[r.id] = i
	}
	for i, r := range group {
		if b.last[r.id] == i {
			b.final = append(b.final, i)
			if r.data != nil {
				b.writes = append(b.writes, i)
			}
		}
	}
	return b
}

// recycleBatch keeps a finished batch for reuse; done says its requests
// are finished (their references are dropped), else they are kept by the
// caller for a retry.
func (s *Store) recycleBatch(b *batch, done bool) {
	if done {
		clear(b.group) // the callbacks and buffers
	}
	clear(b.last)
	clear(b.res)
	b.group = nil
	s.freeBatch = b
}

// maxFreeQueue bounds the request arrays the appender keeps for reuse (a
// burst, such as the writes of a restore, is not worth keeping its array
// for).
const maxFreeQueue = 1024

// prepare writes the files of every write of group into <id>_next. The
// directories are taken (renamed or made) by the checkpointer alone: each
// rename or mkdir locks the state directory (a cross-directory rename the
// whole filesystem's rename lock), so workers doing them would only spin
// on the lock. The files, each in its own directory, are written in
// parallel.
func (s *Store) prepare(group []request) *batch {
	s.applyScannedSpares()
	b := s.newBatch(group)
	for _, i := range b.writes {
		b.res[i].old, b.res[i].err = s.takeNext(group[i].id)
	}
	s.parallel(len(b.writes), func(k int) {
		if i := b.writes[k]; b.res[i].err == nil {
			b.res[i].err = s.writeNext(group[i], b.res[i].old)
		}
	})
	return b
}

// apply swaps the written states in and moves removed ones to the trash
// (flushErr, if not nil, fails them instead).
// Renames all, so one goroutine does them (see prepare).
func (s *Store) apply(b *batch, flushErr error) {
	for _, i := range b.final {
		res := &b.res[i]
		switch r := b.group[i]; {
		case res.err != nil:
		case flushErr != nil:
			res.err = flushErr
		case r.data != nil:
			res.err = s.swap(r.id)
		case r.quarantine:
			res.err = s.quarantineState(r.id, res)
		default:
			res.err = s.remove(r.id, res)
		}
	}
}

// minChunk is the fewest file operations worth handing to a worker: a
// handoff (a channel send and a goroutine wake-up) costs about what a few
// syscalls on a fast filesystem cost.
const minChunk = 4

// chunk is a share of a parallel call for one worker.
type chunk struct {
	fn     func(k int)
	lo, hi int
	wg     *sync.WaitGroup
}

// parallel runs fn(0..n-1) in chunks of at least minChunk, up to
// `workers` of them; the calling goroutine runs the first chunk itself
// while the workers run the others, and waits for all of them.
func (s *Store) parallel(n int, fn func(k int)) {
	chunks := min(max(n/minChunk, 1), workers)
	var wg sync.WaitGroup
	wg.Add(chunks - 1)
	for c := 1; c < chunks; c++ {
		s.work <- chunk{fn: fn, lo: c * n / chunks, hi: (c + 1) * n / chunks, wg: &wg}
	}
	for k := range n / chunks {
		fn(k)
	}
	wg.Wait()
}

// worker runs chunks of parallel calls.
func (s *Store) worker() {
	for c := range s.work {
		for k := c.lo; k < c.hi; k++ {
			c.fn(k)
		}
		c.wg.Done()
	}
}

// idSet is a set of endpoint IDs that the writer and its workers update
// concurrently (each ID by one of them at a time).
type idSet [(endpoint.MaxID + 1) / 64]atomic.Uint64

func (m *idSet) has(id endpoint.ID) bool { return m[id/64].Load()&(1<<(id%64)) != 0 }

func (m *idSet) set(id endpoint.ID, on bool) {
	if on {
		m[id/64].Or(1 << (id % 64))
	} else {
		m[id/64].And(^uint64(1 << (id % 64)))
	}
}

func (s *Store) isSpare(id endpoint.ID) bool { return s.spare.has(id) }

func (s *Store) setSpare(id endpoint.ID, on bool) { s.spare.set(id, on) }

// applyScannedSpares takes over the <id>_next directories Scan found.
func (s *Store) applyScannedSpares() {
	s.cpMu.Lock()
	ids := s.scannedSpares
	s.scannedSpares = nil
	s.cpMu.Unlock()
	for _, id := range ids {
		s.setSpare(id, true)
	}
}

// takeNext makes sure <id>_next exists for a write: the spare (the
// previous state), a recycled directory moved there, or a new one. It
// returns the sizes of the files the directory holds.
func (s *Store) takeNext(id endpoint.ID) (dirSizes, error) {
	var nb pathBuf
	old, err := s.nextDir(id, entryPath(nb[:0], id, nextSuffix))
	if err != nil {
		return 0, fmt.Errorf("write state of endpoint %d: %w", id, err)
	}
	s.setSpare(id, false) // from here on <id>_next is the new state
	cur, _ := s.sizes.get(id)
	s.sizes.set(id, cur, unknownSizes)
	return old, nil
}

// writeNext writes the files of r into <id>_next, whose files held old.
func (s *Store) writeNext(r request, old dirSizes) error {
	var fb pathBuf
	err := s.sd.writeFile(filePath(fb[:0], r.id, nextSuffix, stateFile), r.data, old.state())
	if err == nil {
		err = s.sd.writeFile(filePath(fb[:0], r.id, nextSuffix, headerFile), r.header, old.header())
	}
	if err != nil {
		os.RemoveAll(s.sd.abs(entryPath(fb[:0], r.id, nextSuffix)))
		return fmt.Errorf("write state of endpoint %d: %w", r.id, err)
	}
	cur, _ := s.sizes.get(r.id)
	s.sizes.set(r.id, cur, sizesOf(r.data, r.header))
	return nil
}

// nextDir is takeNext's directory work.
func (s *Store) nextDir(id endpoint.ID, next []byte) (dirSizes, error) {
	if s.isSpare(id) {
		_, sizes := s.sizes.get(id)
		return sizes, nil
	}
	if sizes, ok := s.reuse(next); ok {
		return sizes, nil
	}
	err := s.sd.mkdir(next)
	if errors.Is(err, unix.EEXIST) {
		if err = os.RemoveAll(s.sd.abs(next)); err == nil {
			err = s.sd.mkdir(next)
		}
	}
	return emptyDir, err
}

// swap puts <id>_next in place of <id>. With renameat2(RENAME_EXCHANGE)
// the two directories trade places atomically: <id> is never missing, and
// the previous state left in <id>_next is the spare the next write
// overwrites. Filesystems without it get the rename dance: <id> becomes
// <id>_stale, <id>_next becomes <id>, <id>_stale goes; a crash at any
// point leaves either the old or the new state readable (Scan).
func (s *Store) swap(id endpoint.ID) error {
	if s.noExchange.Load() {
		return s.renameDance(id)
	}
	var cb, nb pathBuf
	cur, next := entryPath(cb[:0], id, ""), entryPath(nb[:0], id, nextSuffix)
	if !s.present.has(id) {
		// The first write as far as the store knows: a rename (which
		// cannot replace a state directory) instead of an exchange that
		// finds nothing to exchange with.
		err := s.sd.rename(next, cur)
		switch {
		case err == nil:
			s.swapped(id, false)
			return nil
		case !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST):
			return fmt.Errorf("write state of endpoint %d: %w", id, err)
		} // <id> is there after all
	}
	err := s.sd.exchange(next, cur)
	switch {
	case err == nil:
		s.swapped(id, true)
		return nil
	case errors.Is(err, unix.ENOENT): // nothing to exchange with
		if err := s.sd.rename(next, cur); err != nil {
			return fmt.Errorf("write state of endpoint %d: %w", id, err)
		}
		s.swapped(id, false)
		return nil
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EOPNOTSUPP):
		if s.noExchange.CompareAndSwap(false, true) {
			s.log.Info("the state directory's filesystem cannot exchange directories; using rename with a backup", "err", err)
		}
		return s.renameDance(id)
	default:
		return fmt.Errorf("write state of endpoint %d: %w", id, err)
	}
}

// swapped records that <id>_next became <id>, and (exchanged) that the
// previous <id> is now the spare <id>_next.
func (s *Store) swapped(id endpoint.ID, exchanged bool) {
	cur, next := s.sizes.get(id)
	if exchanged {
		s.sizes.set(id, next, cur)
	} else {
		s.sizes.set(id, next, unknownSizes)
	}
	s.setSpare(id, exchanged)
	s.present.set(id, true)
}

func (s *Store) renameDance(id endpoint.ID) error {
	var cb, nb, sb pathBuf
	cur, next, stale := entryPath(cb[:0], id, ""), entryPath(nb[:0], id, nextSuffix), entryPath(sb[:0], id, staleSuffix)
	if err := os.RemoveAll(s.sd.abs(stale)); err != nil {
		return fmt.Errorf("write state of endpoint %d: %w", id, err)
	}
	if err := s.sd.rename(cur, stale); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("write state of endpoint %d: %w", id, err)
	}
	if err := s.sd.rename(next, cur); err != nil {
		return fmt.Errorf("write state of endpoint %d: %w", id, err)
	}
	s.swapped(id, false)
	if err := s.sd.removeStateDir(stale); err != nil {
		return fmt.Errorf("write state of endpoint %d: %w", id, err)
	}
	return nil
}

// flush makes everything written under the state directory durable with
// one syncfs(2).
func (s *Store) flush() error {
	start := time.Now()
	s.flushing.Add(1)
	err := unix.Syncfs(s.sd.fd)
	for errors.Is(err, unix.EINTR) {
		err = unix.Syncfs(s.sd.fd)
	}
	s.flushing.Add(-1)
	took := time.Since(start)
	s.mu.Lock()
	s.stats.Flushes++
	s.stats.Flushing += took
	s.stats.FlushHist.Add(took)
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("flush state: syncfs: %w", err)
	}
	return nil
}
