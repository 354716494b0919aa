package restore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/endpoint"
)

// batch is a group of requests on its way through the writer. When an
// endpoint appears several times, only its last request is applied;
// every request is answered.
type batch struct {
	group  []request
	last   map[endpoint.ID]int // index of the request applied per ID
	final  []int               // those indexes
	errs   []error
	trash  [][]string // directories each removal moved to the trash
	writes int
}

// prepare writes the files of every write of group into <id>_next.
func (s *Store) prepare(group []request) *batch {
	s.applyScannedSpares()
	b := &batch{group: group, last: make(map[endpoint.ID]int, len(group)), errs: make([]error, len(group))}
	for i, r := range group {
		b.last[r.id] = i
	}
	var writes []int
	for i, r := range group {
		if b.last[r.id] == i {
			b.final = append(b.final, i)
			if r.data != nil {
				writes = append(writes, i)
			}
		}
	}
	b.writes = len(writes)
	s.parallel(len(writes), func(k int) {
		i := writes[k]
		b.errs[i] = s.writeNext(group[i])
	})
	return b
}

// apply swaps the written states in and moves removed ones to the trash,
// once the flush that followed prepare succeeded (else it fails them).
func (s *Store) apply(b *batch, flushErr error) {
	b.trash = make([][]string, len(b.group))
	s.parallel(len(b.final), func(k int) {
		i := b.final[k]
		switch r := b.group[i]; {
		case b.errs[i] != nil:
		case flushErr != nil:
			b.errs[i] = flushErr
		case r.data != nil:
			b.errs[i] = s.swap(r.id)
		default:
			b.trash[i], b.errs[i] = s.remove(r.id)
		}
	})
}

// finish answers a batch after the flush that followed its apply (err is
// that flush's outcome), and recycles its removed directories.
func (s *Store) finish(b *batch, flushErr error) {
	for _, r := range b.group {
		err := b.errs[b.last[r.id]] // a superseded request shares the outcome of the last
		if err == nil {
			err = flushErr
		}
		if err != nil {
			s.log.Error("writing endpoint state failed", "endpoint", r.id, "err", err)
		}
		r.done(err)
		r.release()
	}
	for _, t := range b.trash {
		s.recycle(t)
	}
}

// abandon answers a batch whose changes were not flushed, at Abort.
func (s *Store) abandon(b *batch) {
	for _, r := range b.group {
		r.done(fmt.Errorf("state of endpoint %d: %w", r.id, ErrClosed))
	}
}

// parallel runs fn(0..n-1) on the workers, in up to `workers` chunks, and
// waits for all of them.
func (s *Store) parallel(n int, fn func(k int)) {
	if n <= 1 {
		for k := range n {
			fn(k)
		}
		return
	}
	chunks := min(n, workers)
	var wg sync.WaitGroup
	wg.Add(chunks)
	for c := range chunks {
		lo, hi := c*n/chunks, (c+1)*n/chunks
		s.work <- func() {
			defer wg.Done()
			for k := lo; k < hi; k++ {
				fn(k)
			}
		}
	}
	wg.Wait()
}

func (s *Store) path(id endpoint.ID, suffix string) string {
	return filepath.Join(s.dir, strconv.Itoa(int(id))+suffix)
}

func (s *Store) isSpare(id endpoint.ID) bool { return s.spare[id/64].Load()&(1<<(id%64)) != 0 }

func (s *Store) setSpare(id endpoint.ID, on bool) {
	if on {
		s.spare[id/64].Or(1 << (id % 64))
	} else {
		s.spare[id/64].And(^uint64(1 << (id % 64)))
	}
}

// applyScannedSpares takes over the <id>_next directories Scan found.
func (s *Store) applyScannedSpares() {
	s.mu.Lock()
	ids := s.scannedSpares
	s.scannedSpares = nil
	s.mu.Unlock()
	for _, id := range ids {
		s.setSpare(id, true)
	}
}

// writeNext writes the files of r into <id>_next, reusing the directory
// when it holds a previous state (spare) rather than creating it.
func (s *Store) writeNext(r request) error {
	next := s.path(r.id, nextSuffix)
	if !s.isSpare(r.id) && !s.reuse(next) {
		err := mkdir(next)
		if errors.Is(err, unix.EEXIST) {
			if err = os.RemoveAll(next); err == nil {
				err = mkdir(next)
			}
		}
		if err != nil {
			return fmt.Errorf("write state of endpoint %d: %w", r.id, err)
		}
	}
	s.setSpare(r.id, false) // from here on <id>_next is the new state
	for _, f := range []struct {
		name string
		data []byte
	}{{stateFile, r.data}, {headerFile, r.header}} {
		if err := writeFile(filepath.Join(next, f.name), f.data); err != nil {
			os.RemoveAll(next)
			return fmt.Errorf("write state of endpoint %d: %w", r.id, err)
		}
	}
	return nil
}

// swap puts <id>_next in place of <id>. With renameat2(RENAME_EXCHANGE)
// the two directories trade places atomically: <id> is never missing, and
// the previous state left in <id>_next is the spare the next write
// overwrites. Filesystems without it get the rename dance: <id> becomes
// <id>_stale, <id>_next becomes <id>, <id>_stale goes; a crash at any
// point leaves either the old or the new state readable (Scan).
func (s *Store) swap(id endpoint.ID) error {
	cur, next := s.path(id, ""), s.path(id, nextSuffix)
	if !s.noExchange.Load() {
		err := renameExchange(next, cur)
		switch {
		case err == nil:
			s.setSpare(id, true)
			return nil
		case errors.Is(err, unix.ENOENT): // the first write: nothing to exchange with
			if err := rename(next, cur); err != nil {
				return fmt.Errorf("write state of endpoint %d: %w", id, err)
			}
			return nil
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EOPNOTSUPP):
			if s.noExchange.CompareAndSwap(false, true) {
				s.log.Info("the state directory's filesystem cannot exchange directories; using rename with a backup", "err", err)
			}
		default:
			return fmt.Errorf("write state of endpoint %d: %w", id, err)
		}
	}
	return s.renameDance(id)
}

func (s *Store) renameDance(id endpoint.ID) error {
	cur, next, stale := s.path(id, ""), s.path(id, nextSuffix), s.path(id, staleSuffix)
	if err := os.RemoveAll(stale); err != nil {
		return fmt.Errorf("write state of endpoint %d: %w", id, err)
	}
	if err := rename(cur, stale); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("write state of endpoint %d: %w", id, err)
	}
	if err := rename(next, cur); err != nil {
		return fmt.Errorf("write state of endpoint %d: %w", id, err)
	}
	if err := removeStateDir(stale); err != nil {
		return fmt.Errorf("write state of endpoint %d: %w", id, err)
	}
	return nil
}

// remove moves <id> (and its spare <id>_next) into the trash with one
// rename each: once flushed, the endpoint is gone for Scan; the janitor
// deletes the returned directories later, off the answer's path.
func (s *Store) remove(id endpoint.ID) (trash []string, err error) {
	suffixes := []string{""}
	if s.isSpare(id) {
		suffixes = append(suffixes, nextSuffix)
		s.setSpare(id, false)
	}
	for _, suffix := range suffixes {
		src := s.path(id, suffix)
		seq := s.trashSeq.Add(1)
		dst := filepath.Join(s.dir, trashDir, strconv.Itoa(int(id))+suffix+"-"+strconv.FormatUint(seq, 36))
		err := rename(src, dst)
		switch {
		case err == nil:
			trash = append(trash, dst)
		case errors.Is(err, unix.ENOENT):
		default: // no trash (e.g. removed by hand): delete in place
			if err := os.RemoveAll(src); err != nil {
				return trash, fmt.Errorf("remove state of endpoint %d: %w", id, err)
			}
		}
	}
	return trash, nil
}

// recycleMax bounds the trash kept for reuse; beyond it the janitor
// deletes. Every lifecycle takes two directories (create, first
// regeneration) and gives two back (delete), so a small stock suffices.
const recycleMax = 1024

// recycle keeps removed directories for reuse as <id>_next (up to
// recycleMax) and has the janitor delete the rest.
func (s *Store) recycle(dirs []string) {
	if len(dirs) == 0 {
		return
	}
	s.recycleMu.Lock()
	n := min(len(dirs), recycleMax-len(s.recycled))
	s.recycled = append(s.recycled, dirs[:n]...)
	s.recycleMu.Unlock()
	s.jan.add(dirs[n:])
}

// reuse moves a recycled directory to next: its files are overwritten
// next, which costs the filesystem less than creating a directory and its
// files (and deleting the old ones). It reports false when there is none
// or the rename fails (that directory is then deleted).
func (s *Store) reuse(next string) bool {
	s.recycleMu.Lock()
	n := len(s.recycled)
	if n == 0 {
		s.recycleMu.Unlock()
		return false
	}
	dir := s.recycled[n-1]
	s.recycled = s.recycled[:n-1]
	s.recycleMu.Unlock()
	if err := rename(dir, next); err != nil {
		s.jan.add([]string{dir})
		return false
	}
	return true
}

// flush makes everything written under the state directory durable with
// one syncfs(2).
func (s *Store) flush() error {
	start := time.Now()
	err := ignoringEINTR(func() error { return unix.Syncfs(s.dirFd) })
	took := time.Since(start)
	s.mu.Lock()
	s.stats.Flushes++
	s.stats.Flushing += took
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("flush state: syncfs: %w", err)
	}
	return nil
}
