package restore

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// File and directory names inside the state directory.
const (
	stateFile     = "ep.json"
	headerFile    = "ep_config.h"
	nextSuffix    = "_next"
	staleSuffix   = "_stale"
	quarantineDir = "quarantine"
	// trashDir holds removed endpoints' directories, reused for new
	// writes (their files are overwritten) or deleted by the janitor;
	// Scan never reads state from it.
	trashDir = "trash"
)

// request is one queued write (data != nil), removal or quarantine.
type request struct {
	id     endpoint.ID
	data   []byte  // ep.json
	header []byte  // ep_config.h
	buf    *[]byte // the pooled buffer data and header are in
	done   func(error)
	// quarantine moves the state into the quarantine instead of the
	// trash; moved (set before done runs) says whether there was state.
	quarantine bool
	moved      *bool
}

// Stats counts the store's work.
type Stats struct {
	// Groups is the number of group commits, Requests the requests they
	// carried (Requests/Groups is the mean group size).
	Groups, Requests uint64
	// Flushes is the number of syncfs calls.
	Flushes uint64
	// Busy is the writer's time spent committing groups (files, renames
	// and flushes); Flushing the part of it spent in syncfs.
	Busy, Flushing time.Duration
}

// Store reads and writes endpoint state under one directory.
type Store struct {
	dir string
	log *slog.Logger

	// mu guards queue, closed, aborted, stats and scannedSpares; cond signals
	// the writer.
	mu      sync.Mutex
	cond    *sync.Cond
	queue   []request
	closed  bool
	aborted bool
	stats   Stats
	done    chan struct{}
	// scannedSpares are the <id>_next directories Scan left in place for
	// the writer to reuse (it takes them over before its next group).
	scannedSpares []endpoint.ID

	// The writer and its workers use these (a group holds each ID once,
	// so workers never touch the same ID; the words are shared, hence
	// atomics). spare marks IDs whose <id>_next directory exists and
	// holds the previous state after an exchange: the next write reuses
	// it instead of creating and deleting a directory. present marks IDs
	// whose <id> exists, as far as the store knows (a hint: a write
	// renames its state into place rather than trying an exchange first,
	// and falls back to the exchange when <id> is there after all).
	spare, present idSet
	// sizes holds what the store wrote into <id> and <id>_next.
	sizes sizeTable
	// noExchange is set once renameat2(RENAME_EXCHANGE) is refused by
	// the filesystem: writes then use the rename dance with <id>_stale.
	noExchange atomic.Bool
	trashSeq   atomic.Uint64
	// sd is the state directory's fd, which the writer's paths are
	// relative to and syncfs flushes; closed once the writer and the
	// janitor stopped.
	sd      stateDir
	closeSd sync.Once
	// freeBatch is a finished batch the writer reuses, and freeQueue the
	// emptied array of a finished group, the next queue's (writer only).
	freeBatch *batch
	freeQueue []request

	// work feeds the workers that write a group's files in parallel
	// (each file is in its own directory: no lock shared with the
	// others; the renames are the writer's, see prepare).
	work chan chunk
	jan  *janitor

	// recycleMu guards recycled: directories in the trash kept for reuse.
	recycleMu sync.Mutex
	recycled  []trashEntry
}

// workers is the number of goroutines that write a group's files.
const workers = 8

// Open creates dir if needed and starts the writer.
func Open(dir string, log *slog.Logger) (*Store, error) {
	if err := os.MkdirAll(filepath.Join(dir, trashDir), 0o750); err != nil {
		return nil, fmt.Errorf("open state dir: %w", err)
	}
	sd, err := openStateDir(dir)
	if err != nil {
		return nil, fmt.Errorf("open state dir: %w", err)
	}
	s := &Store{dir: dir, log: log.With("component", "state"), done: make(chan struct{}), sd: sd,
		work: make(chan chunk), sizes: newSizeTable()}
	s.trashSeq.Store(uint64(time.Now().UnixNano()))
	s.cond = sync.NewCond(&s.mu)
	s.jan = newJanitor(s.log, sd)
	for range workers {
		go s.worker()
	}
	go s.writer()
	return s, nil
}

// Dir returns the state directory.
func (s *Store) Dir() string { return s.dir }

// Write queues ep's state; done is called (from the writer goroutine, so
// it must not block) once it is durable or failed. Never blocks on disk.
func (s *Store) Write(ep *endpoint.Endpoint, done func(error)) {
	r, err := s.encode(ep)
	if err != nil {
		done(err)
		return
	}
	r.done = done
	s.submit(r)
}

// encode renders ep's files into a write request, in a pooled buffer
// (release returns it).
func (s *Store) encode(ep *endpoint.Endpoint) (request, error) {
	bp := encodeBufs.Get().(*[]byte)
	b, err := encodeState((*bp)[:0], ep)
	if err != nil {
		encodeBufs.Put(bp)
		return request{}, err
	}
	n := len(b)
	b = appendHeader(b, ep)
	*bp = b
	return request{id: ep.ID, data: b[:n:n], header: b[n:], buf: bp}, nil
}

// maxPooled bounds the buffers kept for reuse (a record with thousands of
// labels is not worth keeping around).
const maxPooled = 64 << 10

// release returns a request's buffer once its files are written and it
// was answered.
func (r *request) release() {
	if r.buf != nil && cap(*r.buf) <= maxPooled {
		encodeBufs.Put(r.buf)
	}
	r.buf, r.data, r.header = nil, nil, nil
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

// Close finishes queued requests and stops the writer and the janitor
// (which finishes deleting what was removed).
func (s *Store) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cond.Signal()
	<-s.done
	s.jan.stop(false)
	s.closeSd.Do(s.sd.close)
}

// Abort drops queued requests (answering them with ErrClosed) and stops
// the writer after the group in progress, as a crash would: used by the
// simulator's in-process crash so a dead agent stops writing. The janitor
// stops without finishing (the next Scan hands it the trash again).
func (s *Store) Abort() {
	s.mu.Lock()
	dropped := s.queue
	s.queue, s.closed, s.aborted = nil, true, true
	s.mu.Unlock()
	s.cond.Signal()
	for _, r := range dropped {
		r.done(fmt.Errorf("state of endpoint %d: %w", r.id, ErrClosed))
	}
	<-s.done
	s.jan.stop(true)
	s.closeSd.Do(s.sd.close)
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// writer commits groups, pipelined: one flush makes the files of the new
// group durable and, with them, the swaps of the previous group, which is
// then answered. So under load each group costs one syncfs, while every
// request still sees its files flushed before its swap, and its swap
// flushed before its answer. A new group never holds an ID of the group
// awaiting its flush (those requests wait one round).
func (s *Store) writer() {
	defer close(s.done)
	defer close(s.work)
	var pending *batch // applied, not yet flushed
	for {
		// Let the goroutines whose answers finish just sent (and others
		// about to submit) run first: on a busy machine the next group is
		// then bigger, and each group costs a flush and a round of
		// handoffs. (The writer otherwise blocks on nothing while it
		// renames, and takes groups of two or three.)
		runtime.Gosched()
		s.mu.Lock()
		for len(s.queue) == 0 && !s.closed && pending == nil {
			s.cond.Wait()
		}
		if s.aborted {
			s.mu.Unlock()
			if pending != nil {
				s.abandon(pending)
			}
			return
		}
		group := s.queue
		s.queue, s.freeQueue = s.freeQueue, nil
		if pending != nil {
			group, s.queue = splitBusy(group, pending.last, s.queue)
		}
		closed := s.closed
		if len(group) > 0 {
			s.stats.Groups++
			s.stats.Requests += uint64(len(group))
		}
		s.mu.Unlock()
		start := time.Now()
		var next *batch
		if len(group) > 0 {
			next = s.prepare(group)
		}
		flushErr := s.flush()
		if pending != nil {
			s.finish(pending, flushErr)
			pending = nil
		}
		if next != nil {
			s.apply(next, flushErr)
			pending = next
		}
		s.mu.Lock()
		s.stats.Busy += time.Since(start)
		s.mu.Unlock()
		if closed && pending == nil && len(group) == 0 {
			return
		}
	}
}

// splitBusy keeps the requests whose ID is not in busy, in order and in
// place, and appends the others to later, to wait for the next round.
func splitBusy(group []request, busy map[endpoint.ID]int, later []request) (now, _ []request) {
	now = group[:0]
	for _, r := range group {
		if _, ok := busy[r.id]; ok {
			later = append(later, r)
		} else {
			now = append(now, r)
		}
	}
	clear(group[len(now):])
	return now, later
}
