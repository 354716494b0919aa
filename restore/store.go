package restore

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/endpoint"
)

// File and directory names inside the state directory.
const (
	stateFile     = "ep.json"
	headerFile    = "ep_config.h"
	nextSuffix    = "_next"
	staleSuffix   = "_stale"
	deletedSuffix = "_deleted"
	quarantineDir = "quarantine"
)

// request is one queued write (data != nil) or removal.
type request struct {
	id     endpoint.ID
	data   []byte
	header []byte
	done   func(error)
}

// Stats counts the store's work.
type Stats struct {
	// Groups is the number of group commits, Requests the requests they
	// carried (Requests/Groups is the mean group size).
	Groups, Requests uint64
	// Flushes is the number of syncfs calls.
	Flushes uint64
}

// Store reads and writes endpoint state under one directory.
type Store struct {
	dir string
	log *slog.Logger

	// mu guards queue, closed and stats; cond signals the writer.
	mu     sync.Mutex
	cond   *sync.Cond
	queue  []request
	closed bool
	stats  Stats
	done   chan struct{}
}

// Open creates dir if needed and starts the writer.
func Open(dir string, log *slog.Logger) (*Store, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("open state dir: %w", err)
	}
	s := &Store{dir: dir, log: log.With("component", "state"), done: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	go s.writer()
	return s, nil
}

// Dir returns the state directory.
func (s *Store) Dir() string { return s.dir }

// Write queues ep's state; done is called (from the writer goroutine, so
// it must not block) once it is durable or failed. Never blocks on disk.
func (s *Store) Write(ep *endpoint.Endpoint, done func(error)) {
	data, err := json.MarshalIndent(FromEndpoint(ep), "", "  ")
	if err != nil {
		done(fmt.Errorf("encode state of endpoint %d: %w", ep.ID, err))
		return
	}
	s.submit(request{id: ep.ID, data: append(data, '\n'), header: header(ep), done: done})
}

// Remove queues the removal of an endpoint's state; done is called once
// the removal is durable. Removing missing state is success.
func (s *Store) Remove(id endpoint.ID, done func(error)) {
	s.submit(request{id: id, done: done})
}

func (s *Store) submit(r request) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		r.done(fmt.Errorf("state of endpoint %d: %w", r.id, ErrClosed))
		return
	}
	s.queue = append(s.queue, r)
	s.mu.Unlock()
	s.cond.Signal()
}

// Close finishes queued requests and stops the writer.
func (s *Store) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cond.Signal()
	<-s.done
}

// Abort drops queued requests (answering them with ErrClosed) and stops
// the writer after the group in progress, as a crash would: used by the
// simulator's in-process crash so a dead agent stops writing.
func (s *Store) Abort() {
	s.mu.Lock()
	dropped := s.queue
	s.queue, s.closed = nil, true
	s.mu.Unlock()
	s.cond.Signal()
	for _, r := range dropped {
		r.done(fmt.Errorf("state of endpoint %d: %w", r.id, ErrClosed))
	}
	<-s.done
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

func (s *Store) writer() {
	defer close(s.done)
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.closed {
			s.cond.Wait()
		}
		group := s.queue
		s.queue = nil
		closed := s.closed
		if len(group) > 0 {
			s.stats.Groups++
			s.stats.Requests += uint64(len(group))
		}
		s.mu.Unlock()
		if len(group) > 0 {
			s.commit(group)
		}
		if closed && len(group) == 0 {
			return
		}
	}
}

// commit writes a group: the files of every write into <id>_next, one
// flush, the renames (and removals), one more flush, then the callbacks.
// When an endpoint appears several times, only its last request is
// applied; every request is answered.
func (s *Store) commit(group []request) {
	last := make(map[endpoint.ID]int, len(group))
	for i, r := range group {
		last[r.id] = i
	}
	errs := make([]error, len(group))
	for i, r := range group {
		if last[r.id] == i && r.data != nil {
			errs[i] = s.writeNext(r)
		}
	}
	flushErr := s.flush()
	for i, r := range group {
		switch {
		case last[r.id] != i:
		case errs[i] != nil:
		case flushErr != nil:
			errs[i] = flushErr
		case r.data != nil:
			errs[i] = s.swap(r.id)
		default:
			errs[i] = s.removeDir(r.id)
		}
	}
	if err := s.flush(); err != nil {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
	}
	for i, r := range group {
		err := errs[i]
		if last[r.id] != i {
			err = errs[last[r.id]] // superseded: answered with the outcome of the last
		}
		if err != nil {
			s.log.Error("writing endpoint state failed", "endpoint", r.id, "err", err)
		}
		r.done(err)
	}
}

func (s *Store) path(id endpoint.ID, suffix string) string {
	return filepath.Join(s.dir, strconv.Itoa(int(id))+suffix)
}

func (s *Store) writeNext(r request) error {
	next := s.path(r.id, nextSuffix)
	if err := os.RemoveAll(next); err != nil {
		return fmt.Errorf("write state of endpoint %d: %w", r.id, err)
	}
	if err := os.Mkdir(next, 0o750); err != nil {
		return fmt.Errorf("write state of endpoint %d: %w", r.id, err)
	}
	for name, data := range map[string][]byte{stateFile: r.data, headerFile: r.header} {
		if err := os.WriteFile(filepath.Join(next, name), data, 0o640); err != nil {
			os.RemoveAll(next)
			return fmt.Errorf("write state of endpoint %d: %w", r.id, err)
		}
	}
	return nil
}

// swap moves <id>_next into place, keeping the old state as <id>_stale
// until the new one is there, so that a crash at any point leaves either
// the old or the new state readable.
func (s *Store) swap(id endpoint.ID) error {
	cur, next, stale := s.path(id, ""), s.path(id, nextSuffix), s.path(id, staleSuffix)
	if err := os.RemoveAll(stale); err != nil {
		return fmt.Errorf("write state of endpoint %d: %w", id, err)
	}
	if err := os.Rename(cur, stale); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("write state of endpoint %d: %w", id, err)
	}
	if err := os.Rename(next, cur); err != nil {
		return fmt.Errorf("write state of endpoint %d: %w", id, err)
	}
	if err := os.RemoveAll(stale); err != nil {
		return fmt.Errorf("write state of endpoint %d: %w", id, err)
	}
	return nil
}

// removeDir removes an endpoint's state so that a crash at any point
// leaves either the whole state (the removal did not happen) or none: the
// directory holding the state is renamed to <id>_deleted in one step, and
// only then removed file by file (Scan drops <id>_deleted leftovers).
func (s *Store) removeDir(id endpoint.ID) error {
	cur, stale, deleted := s.path(id, ""), s.path(id, staleSuffix), s.path(id, deletedSuffix)
	for _, p := range []string{s.path(id, nextSuffix), deleted} {
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("remove state of endpoint %d: %w", id, err)
		}
	}
	// The state is <id>, or <id>_stale when a swap was interrupted between
	// its renames. While <id> exists, <id>_stale is a mere backup that
	// Scan drops, so it may go first, in any number of steps.
	src := cur
	if _, err := os.Lstat(cur); errors.Is(err, os.ErrNotExist) {
		src = stale
	} else if err := os.RemoveAll(stale); err != nil {
		return fmt.Errorf("remove state of endpoint %d: %w", id, err)
	}
	if err := os.Rename(src, deleted); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove state of endpoint %d: %w", id, err)
	}
	if err := os.RemoveAll(deleted); err != nil {
		return fmt.Errorf("remove state of endpoint %d: %w", id, err)
	}
	return nil
}

// flush makes everything written under the state directory durable with
// one syncfs(2).
func (s *Store) flush() error {
	f, err := os.Open(s.dir)
	if err != nil {
		return fmt.Errorf("flush state: %w", err)
	}
	defer f.Close()
	s.mu.Lock()
	s.stats.Flushes++
	s.mu.Unlock()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("flush state: syncfs: %w", err)
	}
	return nil
}

// ScanError describes a state directory Scan could not restore.
type ScanError struct {
	Dir string
	Err error
	// Quarantined is where the directory was moved ("" if it was removed).
	Quarantined string
}

// Scan cleans the leftovers of interrupted writes and reads every
// endpoint's state. Unreadable state (corrupt, truncated, unknown
// version) is moved to <dir>/quarantine/ and reported, never fatal.
func (s *Store) Scan() ([]*endpoint.Endpoint, []ScanError) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, []ScanError{{Dir: s.dir, Err: fmt.Errorf("scan state: %w", err)}}
	}
	present := make(map[string]bool, len(entries))
	for _, e := range entries {
		present[e.Name()] = true
	}
	var eps []*endpoint.Endpoint
	var bad []ScanError
	for _, e := range entries {
		name := e.Name()
		if name == quarantineDir || !e.IsDir() {
			continue
		}
		base, suffix := splitName(name)
		if _, err := strconv.ParseUint(base, 10, 16); err != nil {
			continue // not ours
		}
		switch suffix {
		case deletedSuffix: // a removal renamed it away: it is gone
			os.RemoveAll(filepath.Join(s.dir, name))
			continue
		case nextSuffix: // interrupted before the swap: the old state stands
			os.RemoveAll(filepath.Join(s.dir, name))
			continue
		case staleSuffix:
			if present[base] { // the swap finished; drop the backup
				os.RemoveAll(filepath.Join(s.dir, name))
				continue
			}
			// Interrupted between the two renames: the backup is the state.
			if err := os.Rename(filepath.Join(s.dir, name), filepath.Join(s.dir, base)); err != nil {
				bad = append(bad, s.quarantine(name, err))
				continue
			}
		}
		ep, err := s.read(base)
		if err != nil {
			bad = append(bad, s.quarantine(base, err))
			continue
		}
		eps = append(eps, ep)
	}
	return eps, bad
}

func splitName(name string) (base, suffix string) {
	for _, sfx := range []string{nextSuffix, staleSuffix, deletedSuffix} {
		if b, ok := strings.CutSuffix(name, sfx); ok {
			return b, sfx
		}
	}
	return name, ""
}

func (s *Store) read(base string) (*endpoint.Endpoint, error) {
	data, err := os.ReadFile(filepath.Join(s.dir, base, stateFile))
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
