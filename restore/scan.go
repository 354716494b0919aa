package restore

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// ScanError describes a state directory Scan could not restore.
type ScanError struct {
	Dir string
	Err error
	// Quarantined is where the directory was moved ("" if it was removed).
	Quarantined string
}

// Scan cleans the leftovers of interrupted writes and reads every
// endpoint's state: its directory, or what the journal holds for it
// beyond the last checkpoint (the newer; its directory, possibly torn by
// the crash, is rewritten by the first checkpoint and not read).
// Unreadable state (corrupt, truncated, unknown version) is moved to
// <dir>/quarantine/ and reported, never fatal, as are journal records
// that could not be used. An <id>_next next to its <id> is kept as the
// spare the next write overwrites; the trash is recycled. Call it before
// the first Write or Remove: the checkpointer waits for it.
func (s *Store) Scan() ([]*endpoint.Endpoint, []ScanError) {
	defer s.ready()
	if !s.ro {
		s.emptyTrash()
	}
	bad := slices.Clone(s.replayBad)
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, append(bad, ScanError{Dir: s.dir, Err: fmt.Errorf("scan state: %w", err)})
	}
	present := make(map[string]bool, len(entries))
	for _, e := range entries {
		present[e.Name()] = true
	}
	var eps []*endpoint.Endpoint
	var spares []endpoint.ID
	defer func() {
		s.cpMu.Lock()
		s.scannedSpares = append(s.scannedSpares, spares...)
		s.cpMu.Unlock()
	}()
	for _, e := range entries {
		name := e.Name()
		if name == quarantineDir || !e.IsDir() {
			continue
		}
		base, suffix := splitName(name)
		id, err := strconv.ParseUint(base, 10, 16)
		if err != nil {
			continue // not ours
		}
		switch suffix {
		case nextSuffix:
			// The previous state after an exchange, or a write interrupted
			// before its swap: either way <id> (if any) stands.
			if present[base] && id > 0 {
				spares = append(spares, endpoint.ID(id))
			} else if !s.ro {
				os.RemoveAll(filepath.Join(s.dir, name))
			}
			continue
		case staleSuffix:
			if present[base] { // the swap finished; drop the backup
				if !s.ro {
					os.RemoveAll(filepath.Join(s.dir, name))
				}
				continue
			}
			// Interrupted between the two renames: the backup is the state
			// (read where it is when nothing may be renamed).
			if s.ro {
				if ep, err := s.readDir(name, base); err == nil {
					eps = append(eps, ep)
				} else {
					bad = append(bad, s.quarantine(name, err))
				}
				continue
			}
			if err := os.Rename(filepath.Join(s.dir, name), filepath.Join(s.dir, base)); err != nil {
				bad = append(bad, s.quarantine(name, err))
				continue
			}
		}
		if _, ok := s.replay[endpoint.ID(id)]; ok && id > 0 {
			s.present.set(endpoint.ID(id), true)
			continue // the journal's state is newer
		}
		ep, err := s.read(base)
		if err != nil {
			bad = append(bad, s.quarantine(base, err))
			continue
		}
		s.present.set(ep.ID, true)
		eps = append(eps, ep)
	}
	for _, ep := range s.replay {
		if ep != nil {
			eps = append(eps, ep)
		}
	}
	// In the order of the directories' names, as they always came.
	slices.SortFunc(eps, func(a, b *endpoint.Endpoint) int {
		return strings.Compare(strconv.Itoa(int(a.ID)), strconv.Itoa(int(b.ID)))
	})
	s.scanned.Store(true)
	return eps, bad
}

// emptyTrash recycles the directories a previous run left in the trash
// and has the janitor delete anything else there.
func (s *Store) emptyTrash() {
	dir := filepath.Join(s.dir, trashDir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	var dirs, other []trashEntry
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, trashEntry{name: e.Name(), sizes: unknownSizes})
		} else {
			other = append(other, trashEntry{name: e.Name(), sizes: unknownSizes})
		}
	}
	s.recycle(dirs)
	s.jan.add(other)
}

func splitName(name string) (base, suffix string) {
	for _, sfx := range []string{nextSuffix, staleSuffix} {
		if b, ok := strings.CutSuffix(name, sfx); ok {
			return b, sfx
		}
	}
	return name, ""
}

func (s *Store) read(base string) (*endpoint.Endpoint, error) { return s.readDir(base, base) }

// readDir reads the state in directory name of endpoint base.
func (s *Store) readDir(name, base string) (*endpoint.Endpoint, error) {
	data, err := os.ReadFile(filepath.Join(s.dir, name, stateFile))
	if err != nil {
		return nil, fmt.Errorf("read state %s: %w", base, err)
	}
	ep, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("read state %s: %w", base, err)
	}
	if strconv.Itoa(int(ep.ID)) != base {
		return nil, fmt.Errorf("read state %s: records endpoint %d: %w", base, ep.ID, ErrCorrupt)
	}
	return ep, nil
}

// quarantine moves an unreadable state directory aside so that the next
// start does not trip over it again.
func (s *Store) quarantine(name string, cause error) ScanError {
	qdir := filepath.Join(s.dir, quarantineDir)
	dst := filepath.Join(qdir, fmt.Sprintf("%s-%d", name, time.Now().UnixNano()))
	se := ScanError{Dir: filepath.Join(s.dir, name), Err: cause}
	if s.ro {
		return se // left where it is for the scan after the directory works again
	}
	if err := os.MkdirAll(qdir, 0o750); err == nil {
		if err := os.Rename(se.Dir, dst); err == nil {
			se.Quarantined = dst
			return se
		}
	}
	if err := os.RemoveAll(se.Dir); err != nil {
		s.log.Error("cannot quarantine or remove unreadable state", "dir", se.Dir, "err", err)
	}
	return se
}
