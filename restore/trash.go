package restore

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// trashEntry names a directory in the trash: "<id>[_next]-<seq in base
// 36>" for one the store moved there (kept as numbers: no string per
// removal), or name for one Scan found there.
type trashEntry struct {
	name  string
	seq   uint64
	sizes dirSizes // of its files
	id    endpoint.ID
	next  bool
}

// path appends the entry's path relative to the state directory to p.
func (t trashEntry) path(p []byte) []byte {
	p = append(p, trashDir+"/"...)
	if t.name != "" {
		return append(p, t.name...)
	}
	suffix := ""
	if t.next {
		suffix = nextSuffix
	}
	return strconv.AppendUint(append(entryPath(p, t.id, suffix), '-'), t.seq, 36)
}

// remove moves <id> (and its spare <id>_next) into the trash with one
// rename each, recording them in res: once flushed, the endpoint is gone
// for Scan; the janitor deletes them later, off the answer's path.
func (s *Store) remove(id endpoint.ID, res *result) error {
	if s.scanned.Load() && !s.present.has(id) && !s.isSpare(id) {
		// After Scan the store knows every directory it did not make: an
		// endpoint created and removed within one checkpoint has none.
		return nil
	}
	s.present.set(id, false)
	dirs := 1
	if s.isSpare(id) {
		dirs = 2
		s.setSpare(id, false)
	}
	cur, spare := s.sizes.get(id)
	s.sizes.set(id, unknownSizes, unknownSizes)
	for i := range dirs {
		next := i == 1
		var sb, db pathBuf
		suffix, sizes := "", cur
		if next {
			suffix, sizes = nextSuffix, spare
		}
		src := entryPath(sb[:0], id, suffix)
		t := trashEntry{seq: s.trashSeq.Add(1), sizes: sizes, id: id, next: next}
		err := s.sd.rename(src, t.path(db[:0]))
		switch {
		case err == nil:
			res.trash[res.ntrash] = t
			res.ntrash++
		case errors.Is(err, unix.ENOENT):
		default: // no trash (e.g. removed by hand): delete in place
			if err := os.RemoveAll(s.sd.abs(src)); err != nil {
				return fmt.Errorf("remove state of endpoint %d: %w", id, err)
			}
		}
	}
	return nil
}

// recycleMax bounds the trash kept for reuse; beyond it the janitor
// deletes. Every lifecycle takes two directories (create, first
// regeneration) and gives two back (delete), so a small stock suffices.
const recycleMax = 1024

// recycle keeps removed directories for reuse as <id>_next (up to
// recycleMax) and has the janitor delete the rest.
func (s *Store) recycle(dirs []trashEntry) {
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
// or the rename fails (that directory is then deleted), else the sizes of
// the files it holds.
func (s *Store) reuse(next []byte) (dirSizes, bool) {
	s.recycleMu.Lock()
	n := len(s.recycled)
	if n == 0 {
		s.recycleMu.Unlock()
		return 0, false
	}
	t := s.recycled[n-1]
	s.recycled = s.recycled[:n-1]
	s.recycleMu.Unlock()
	var tb pathBuf
	if err := s.sd.rename(t.path(tb[:0]), next); err != nil {
		s.jan.add([]trashEntry{t})
		return 0, false
	}
	return t.sizes, true
}
