package restore

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

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
	// queued is when it was submitted (unix nanoseconds), seq its
	// journal record's sequence number, err why it failed before its
	// record was appended.
	queued int64
	seq    uint64
	err    error
	// barrier is a Checkpoint waiting for the records before it.
	barrier bool
	// slab holds data and header once the record is durable (arena.go).
	slab *slab
}

// Stats counts the store's work. Durations are sums: divide by the
// matching count for a mean.
type Stats struct {
	// Groups is the number of journal group commits, Requests the
	// requests they carried (Requests/Groups is the mean group size),
	// Syncs the fdatasync calls (a group that crosses into a new segment
	// takes two).
	Groups, Requests, Syncs uint64
	// Waiting is the requests' time in the queue until their group was
	// taken; Appending the groups' record encoding and write; Syncing
	// their fdatasync; Answering the done callbacks.
	Waiting, Appending, Syncing, Answering time.Duration
	// Latency is the requests' time from submit to their answer (queue,
	// append, fdatasync; callbacks excluded), LatencyHist its
	// distribution, SyncHist the fdatasyncs'.
	Latency               time.Duration
	LatencyHist, SyncHist Hist
	// SyncHistOverlap is the part of SyncHist whose fdatasync started or
	// ended while a checkpoint's syncfs ran.
	SyncHistOverlap Hist
	// Stalls counts groups that waited for a checkpoint to free journal
	// space or queue room (back-pressure); Stalled is that time.
	Stalls  uint64
	Stalled time.Duration
	// Checkpoints is the number of checkpoints (directory writes and one
	// syncfs each), Applied the records they carried, Flushes the syncfs
	// calls; Checkpointing their time, Flushing the syncfs part of it.
	Checkpoints, Applied, Flushes uint64
	Checkpointing, Flushing       time.Duration
	// CheckpointFailures counts checkpoints that failed (and were retried).
	CheckpointFailures uint64
	// FlushHist is the syncfs calls' distribution.
	FlushHist Hist
}

// Store reads and writes endpoint state under one directory: a write or
// removal is durable once its journal record is (see doc.go), the
// endpoint directories follow in checkpoints.
type Store struct {
	dir string
	log *slog.Logger
	j   *journal

	// mu guards queue, closed, aborted and stats; cond signals the
	// appender.
	mu      sync.Mutex
	cond    *sync.Cond
	queue   []request
	closed  bool
	aborted bool
	stats   Stats
	appDone chan struct{}
	// jbuf is the appender's record buffer, durable its list of the
	// records a chunk made durable.
	jbuf    []byte
	durable []request
	// arena keeps the bytes of the records waiting for a checkpoint.
	arena arena

	// cpMu guards cpQueue (records durable in the journal, not yet in
	// the directories, in seq order), cpWrites and scannedSpares; cpRoom signals
	// room in cpQueue.
	cpMu    sync.Mutex
	cpRoom  *sync.Cond
	cpQueue []request
	// cpSpare is an emptied queue array for the next swap.
	cpSpare []request
	// cpWrites counts the writes in cpQueue.
	cpWrites int
	cpKick   chan struct{}
	cpStop   chan struct{}
	cpDone   chan struct{}
	// cpReady opens once Scan ran (or the first request came, or Close):
	// the checkpointer must not change directories Scan reads.
	cpReady   chan struct{}
	readyOnce sync.Once
	cpEvery   time.Duration
	// scannedSpares are the <id>_next directories Scan left in place for
	// the checkpointer to reuse (it takes them over before its next group).
	scannedSpares []endpoint.ID
	// replay is what Open found in the journal beyond the last
	// checkpoint, for Scan: the state per endpoint (nil: removed), and
	// the records it could not use.
	replay    map[endpoint.ID]*endpoint.Endpoint
	replayBad []ScanError

	// The checkpointer and its workers use these (a group holds each ID
	// once, so workers never touch the same ID; the words are shared,
	// hence atomics). spare marks IDs whose <id>_next directory exists and
	// holds the previous state after an exchange: the next write reuses
	// it instead of creating and deleting a directory. present marks IDs
	// whose <id> exists, as far as the store knows (a hint: a write
	// renames its state into place rather than trying an exchange first,
	// and falls back to the exchange when <id> is there after all).
	spare, present idSet
	// sizes holds what the store wrote into <id> and <id>_next.
	sizes *sizeTable
	// noExchange is set once renameat2(RENAME_EXCHANGE) is refused by
	// the filesystem: writes then use the rename dance with <id>_stale.
	noExchange atomic.Bool
	// scanned is set once Scan ran: from then on present and spare
	// describe every endpoint directory (the store makes them all).
	scanned atomic.Bool
	// flushing is non-zero while a checkpoint's syncfs runs (for
	// SyncHistOverlap).
	flushing atomic.Int32
	trashSeq atomic.Uint64
	// sd is the state directory's fd, which the checkpointer's paths are
	// relative to and syncfs flushes; closed once the checkpointer and
	// the janitor stopped.
	sd       stateDir
	closeSd  sync.Once
	stopOnce sync.Once
	// freeBatch is a finished batch the checkpointer reuses.
	freeBatch *batch

	// work feeds the workers that write a group's files in parallel
	// (each file is in its own directory: no lock shared with the
	// others; the renames are the checkpointer's, see prepare).
	work chan chunk
	jan  *janitor

	// ro: a store that only scans (OpenDegraded): nothing is written,
	// moved or removed.
	ro bool

	// health is the state directory's health; it probes the directory
	// while it is unhealthy.
	health *health

	// recycleMu guards recycled: directories in the trash kept for reuse.
	recycleMu sync.Mutex
	recycled  []trashEntry
}

// workers is the number of goroutines that write a group's files.
const workers = 8

// checkpointEvery is how long the directories may lag the journal when
// it is not filling up.
const checkpointEvery = time.Second

// Open creates dir if needed, reads the journal (what it holds beyond the
// last checkpoint is applied to the directories by the first checkpoint,
// and is what Scan reports for those endpoints) and starts the appender,
// the checkpointer and the janitor.
func Open(dir string, log *slog.Logger) (*Store, error) {
	if err := os.MkdirAll(filepath.Join(dir, trashDir), 0o750); err != nil {
		return nil, fmt.Errorf("open state dir: %w", err)
	}
	sd, err := openStateDir(dir)
	if err != nil {
		return nil, fmt.Errorf("open state dir: %w", err)
	}
	log = log.With("component", "state")
	j, rp, err := openJournal(dir, log)
	if err != nil {
		sd.close()
		return nil, err
	}
	s := &Store{dir: dir, log: log, j: j, appDone: make(chan struct{}), sd: sd,
		work: make(chan chunk), sizes: newSizeTable(), cpKick: make(chan struct{}, 1), cpStop: make(chan struct{}),
		cpDone: make(chan struct{}), cpReady: make(chan struct{}), cpEvery: checkpointEvery}
	s.trashSeq.Store(uint64(time.Now().UnixNano()))
	s.cond = sync.NewCond(&s.mu)
	s.cpRoom = sync.NewCond(&s.cpMu)
	s.jan = newJanitor(s.log, sd)
	s.health = newHealth(j.dir, s.removeFailed)
	s.health.flush = s.flush
	s.loadReplay(rp)
	for range workers {
		go s.worker()
	}
	go s.appender()
	go s.checkpointer()
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
	s.health.forget(ep.ID) // its new state supersedes a removal that failed
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
//
// A removal the filesystem fails (read-only, I/O error) is answered with
// the error and remembered: once the state directory works again the
// store removes the state itself, before it takes new writes, so a
// deleted endpoint does not come back at the next start.
func (s *Store) Remove(id endpoint.ID, done func(error)) {
	s.submit(request{id: id, done: func(err error) {
		if errno := unix.Errno(0); err != nil && errors.As(err, &errno) {
			s.health.remember(id)
		}
		done(err)
	}})
}

// removeFailed removes the state whose removal failed (see Remove), once
// the state directory works again; it waits for the answers, which may
// take as long as the appender's queue.
func (s *Store) removeFailed(ids []endpoint.ID) error {
	errs := make(chan error, len(ids))
	for _, id := range ids {
		s.enqueue(request{id: id, done: func(err error) { errs <- err }}, false)
	}
	var first error
	for range ids {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Checkpoint waits until every request submitted before it is durable
// and written to the endpoint directories (which are then flushed): for
// tests and tools that read the directories while the store runs.
func (s *Store) Checkpoint() error {
	ch := make(chan error, 1)
	s.submit(request{barrier: true, done: func(err error) { ch <- err }})
	return <-ch
}

// maxQueued bounds the requests waiting for the appender: beyond it a
// request fails at once (the caller retries) rather than queue.
const maxQueued = 1 << 16

func (s *Store) submit(r request) { s.enqueue(r, !r.barrier) }

// enqueue queues r for the appender; with refuse, it fails r at once
// while the state directory is read-only or failing I/O.
func (s *Store) enqueue(r request, refuse bool) {
	r.queued = time.Now().UnixNano()
	s.mu.Lock()
	var err error
	switch {
	case s.closed:
		err = ErrClosed
	case len(s.queue) >= maxQueued:
		err = ErrBusy
	}
	if err != nil {
		s.mu.Unlock()
		r.done(fmt.Errorf("state of endpoint %d: %w", r.id, err))
		return
	}
	if refuse {
		if err := s.health.refusal(); err != nil {
			s.mu.Unlock()
			r.release()
			r.done(fmt.Errorf("state of endpoint %d: %w", r.id, err))
			return
		}
	}
	s.queue = append(s.queue, r)
	s.mu.Unlock()
	s.cond.Signal()
	s.ready()
}

// ready lets the checkpointer start.
func (s *Store) ready() { s.readyOnce.Do(func() { close(s.cpReady) }) }

// Close finishes queued requests, checkpoints everything (the directories
// then hold all state and the journal nothing beyond the checkpoint), and
// stops the appender, the checkpointer and the janitor (which finishes
// deleting what was removed).
func (s *Store) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cond.Signal()
	s.ready()
	s.stopOnce.Do(func() {
		<-s.appDone
		s.stopCheckpointer()
		s.j.stop()
		s.jan.stop(false)
		s.health.close()
		s.closeFiles()
	})
}

// Abort drops queued requests (answering them with ErrClosed) and stops
// the appender after the group in progress and the checkpointer without a
// checkpoint, as a crash would: used by the simulator's in-process crash
// so a dead agent stops writing. The next Open replays the journal; the
// janitor stops without finishing (the next Scan hands it the trash
// again).
func (s *Store) Abort() {
	s.mu.Lock()
	dropped := s.queue
	s.queue, s.closed, s.aborted = nil, true, true
	s.mu.Unlock()
	s.cond.Signal()
	for _, r := range dropped {
		r.done(fmt.Errorf("state of endpoint %d: %w", r.id, ErrClosed))
	}
	s.ready()
	s.stopOnce.Do(func() {
		s.j.stop() // wakes an appender waiting for a segment
		<-s.appDone
		s.stopCheckpointer()
		s.jan.stop(true)
		s.health.close()
		s.closeFiles()
	})
}

func (s *Store) closeFiles() {
	s.closeSd.Do(func() {
		s.j.closeFiles()
		s.sd.close()
	})
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}
