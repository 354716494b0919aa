package restore

import (
	"log/slog"
	"sync"
)

// janitor deletes removed endpoints' directories from the trash on its
// own goroutine, after their removal was made durable and answered: the
// deletion itself needs no flush (Scan empties the trash at start).
type janitor struct {
	log *slog.Logger
	sd  stateDir

	// mu guards queue and stopping; cond signals the goroutine.
	mu       sync.Mutex
	cond     *sync.Cond
	queue    []trashEntry
	stopping bool
	done     chan struct{}
}

func newJanitor(log *slog.Logger, sd stateDir) *janitor {
	j := &janitor{log: log, sd: sd, done: make(chan struct{})}
	j.cond = sync.NewCond(&j.mu)
	go j.run()
	return j
}

// add queues directories for deletion.
func (j *janitor) add(dirs []trashEntry) {
	if len(dirs) == 0 {
		return
	}
	j.mu.Lock()
	if !j.stopping {
		j.queue = append(j.queue, dirs...)
	}
	j.mu.Unlock()
	j.cond.Signal()
}

// stop finishes the queue (or drops it) and waits for the goroutine.
func (j *janitor) stop(drop bool) {
	j.mu.Lock()
	j.stopping = true
	if drop {
		j.queue = nil
	}
	j.mu.Unlock()
	j.cond.Signal()
	<-j.done
}

func (j *janitor) run() {
	defer close(j.done)
	for {
		j.mu.Lock()
		for len(j.queue) == 0 && !j.stopping {
			j.cond.Wait()
		}
		batch := j.queue
		j.queue = nil
		stopping := j.stopping
		j.mu.Unlock()
		for _, t := range batch {
			var p pathBuf
			if err := j.sd.removeStateDir(t.path(p[:0])); err != nil {
				j.log.Warn("deleting removed endpoint state failed; the next start retries", "dir", j.sd.abs(t.path(p[:0])), "err", err)
			}
		}
		if stopping && len(batch) == 0 {
			return
		}
	}
}
