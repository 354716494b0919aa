package restore

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// Causes of an unhealthy state directory (Health.Cause).
const (
	CauseReadOnly = "read-only" // EROFS: the filesystem is (or went) read-only
	CauseDiskFull = "disk-full" // ENOSPC, EDQUOT
	CauseIOError  = "io-error"  // EIO: the device failed a write or a flush
	CauseFailing  = "failing"   // any other error of a write, flush or checkpoint
)

// Health is the state directory's health as the store last saw it.
type Health struct {
	// OK is false from a write, flush or checkpoint the filesystem
	// failed until a probe (a file written and flushed in the journal's
	// directory, and room for the checkpoint's files) succeeds again.
	OK bool
	// Cause classifies Err (Cause* constants; "" when OK).
	Cause string
	// Err is the last failure ("" when OK).
	Err string
	// Since is when OK last changed (the store's open when it never did).
	Since time.Time
}

// probeEvery is how often an unhealthy state directory is probed: the
// bound on how long the store refuses writes after the fault ended.
const probeEvery = 500 * time.Millisecond

// probeName is the probe's file under the journal's directory (the
// journal reads only its segments and its checkpoint file there).
const probeName = "probe"

// health tracks the state directory's health and probes it while it is
// unhealthy; onChange (if set) hears every change.
type health struct {
	dir  string // the journal's directory
	kick chan struct{}
	stop chan struct{}
	done chan struct{}

	// nmu serialises changes, so onChange hears them one at a time and
	// in order.
	nmu sync.Mutex
	// retry removes the state whose removal failed, before the
	// directory is called healthy again.
	retry func([]endpoint.ID) error
	// always calls retry after each successful probe, with or without
	// failed removals (Degraded reopens the directory there).
	always bool
	// flush (the store's syncfs on its own descriptor) must succeed too
	// before the directory is healthy: a writeback error of the fault is
	// reported once per descriptor, by its next syncfs, so a probe of
	// new files alone would call the directory healthy and the next
	// checkpoint would fail on the old error.
	flush func() error

	// mu guards cur, onChange and failed.
	mu       sync.Mutex
	cur      Health
	onChange func(Health)
	// failed holds the endpoints whose state removal the filesystem
	// failed (Store.Remove).
	failed map[endpoint.ID]bool
}

func newHealth(dir string, retry func([]endpoint.ID) error) *health {
	h := &health{dir: dir, retry: retry, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		cur: Health{OK: true, Since: time.Now()}, failed: map[endpoint.ID]bool{}}
	go h.prober()
	return h
}

// Cause classifies a write's error (Cause* constants).
func Cause(err error) string {
	switch {
	case errors.Is(err, unix.EROFS):
		return CauseReadOnly
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return CauseDiskFull
	case errors.Is(err, unix.EIO):
		return CauseIOError
	}
	return CauseFailing
}

// fail marks the directory unhealthy with err and starts the probes.
func (h *health) fail(err error) {
	h.set(Health{Cause: Cause(err), Err: err.Error()})
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// set records next (Since is set when OK changes) and tells onChange
// about a change of OK or Cause.
func (h *health) set(next Health) {
	h.nmu.Lock()
	defer h.nmu.Unlock()
	h.mu.Lock()
	prev := h.cur
	next.Since = prev.Since
	if next.OK != prev.OK {
		next.Since = time.Now()
	}
	h.cur = next
	fn := h.onChange
	h.mu.Unlock()
	if fn != nil && (next.OK != prev.OK || next.Cause != prev.Cause) {
		fn(next)
	}
}

// remember notes a removal the filesystem failed.
func (h *health) remember(id endpoint.ID) {
	h.mu.Lock()
	h.failed[id] = true
	h.mu.Unlock()
}

// forget drops id's failed removal: a new write for id supersedes it.
func (h *health) forget(id endpoint.ID) {
	h.mu.Lock()
	delete(h.failed, id)
	h.mu.Unlock()
}

// takeFailed returns and clears the failed removals.
func (h *health) takeFailed() []endpoint.ID {
	h.mu.Lock()
	defer h.mu.Unlock()
	ids := make([]endpoint.ID, 0, len(h.failed))
	for id := range h.failed {
		ids = append(ids, id)
	}
	clear(h.failed)
	return ids
}

func (h *health) get() Health {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur
}

// refusal is the error a write gets without touching the disk while the
// directory is read-only or failing I/O (nil otherwise): each attempt
// would fail anyway, and a failed append retires a journal segment. A
// full disk still takes removals and is judged per write (checkRecords).
func (h *health) refusal() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur.OK || (h.cur.Cause != CauseReadOnly && h.cur.Cause != CauseIOError) {
		return nil
	}
	return fmt.Errorf("state directory %s since %s (%s): %w", h.cur.Cause, h.cur.Since.UTC().Format(time.RFC3339), h.cur.Err, causeErrno(h.cur.Cause))
}

func causeErrno(cause string) error {
	switch cause {
	case CauseReadOnly:
		return unix.EROFS
	case CauseIOError:
		return unix.EIO
	}
	return unix.ENOSPC
}

// prober probes the directory every probeEvery while it is unhealthy,
// until a probe succeeds.
func (h *health) prober() {
	defer close(h.done)
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-h.kick:
		}
		for !h.get().OK {
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
			err := probe(h.dir)
			if err == nil && h.flush != nil {
				err = h.flush()
			}
			if err == nil {
				err = h.retryFailed()
			}
			if err != nil {
				if cur := h.get(); !cur.OK && Cause(err) != cur.Cause {
					h.set(Health{Cause: Cause(err), Err: err.Error()})
				}
				continue
			}
			h.set(Health{OK: true})
		}
	}
}

// retryFailed removes the state whose removal failed (writes are still
// refused meanwhile, so no new state of those IDs races it); the IDs it
// could not remove are kept.
func (h *health) retryFailed() error {
	ids := h.takeFailed()
	if len(ids) == 0 && !h.always {
		return nil
	}
	err := h.retry(ids)
	if err != nil {
		for _, id := range ids {
			h.remember(id) // removing missing state is success: retrying all is harmless
		}
		return fmt.Errorf("remove the state of deleted endpoints: %w", err)
	}
	return nil
}

// probe writes and flushes a block in dir and checks that the filesystem
// has room for a checkpoint's files.
func probe(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("probe state directory: statfs: %w", err)
	}
	if st.Flags&unix.ST_RDONLY != 0 {
		return fmt.Errorf("probe state directory: mounted read-only: %w", unix.EROFS)
	}
	if st.Bfree < 4*spaceBlocks {
		return fmt.Errorf("probe state directory: %d blocks free: %w", st.Bfree, unix.ENOSPC)
	}
	path := filepath.Join(dir, probeName)
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("probe state directory: %w", err)
	}
	defer unix.Unlink(path) //nolint:errcheck // the next probe truncates it
	defer unix.Close(fd)
	if err := pwriteAll(fd, make([]byte, 512), 0); err != nil {
		return fmt.Errorf("probe state directory: write: %w", err)
	}
	if err := fdatasync(fd); err != nil {
		return fmt.Errorf("probe state directory: fdatasync: %w", err)
	}
	return nil
}

func (h *health) close() {
	select {
	case <-h.stop:
	default:
		close(h.stop)
	}
	<-h.done
}

// Health reports the state directory's health.
func (s *Store) Health() Health { return s.health.get() }

// OnHealth makes fn hear every change of the state directory's health
// (OK or Cause), one at a time and in order, on the store's goroutines:
// fn must not block.
func (s *Store) OnHealth(fn func(Health)) {
	s.health.mu.Lock()
	s.health.onChange = fn
	s.health.mu.Unlock()
}
