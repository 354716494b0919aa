package restore

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// Degraded stands in for a Store when the state directory can be read
// but not written at start (Open failed with EROFS: a filesystem the
// kernel turned read-only after an error and nobody repaired yet). It
// holds what the directory held (Scan), refuses every write and
// removal naming the cause (removals are remembered, as a Store does),
// keeps no file open there, so the operator can unmount, repair and
// mount the filesystem under the running agent, and probes the
// directory: once it works, it opens the Store, removes the state of
// the endpoints deleted meanwhile and hands the Store to onStore, after
// which every call belongs to that Store.
type Degraded struct {
	dir    string
	log    *slog.Logger
	eps    []*endpoint.Endpoint
	bad    []ScanError
	health *health
	// onStore hears the Store once the directory works again.
	onStore func(*Store)

	mu    sync.Mutex
	store *Store // opened once the directory works again
}

// OpenDegraded reads dir without writing to it, after Open failed with
// openErr (which must be EROFS), and starts probing it; onStore is
// called (from the prober) with the Store opened once dir works again.
func OpenDegraded(dir string, log *slog.Logger, openErr error, onStore func(*Store)) (*Degraded, error) {
	if !errors.Is(openErr, unix.EROFS) {
		return nil, openErr
	}
	log = log.With("component", "state")
	eps, bad, err := scanReadOnly(dir, log)
	if err != nil {
		return nil, errors.Join(openErr, err)
	}
	d := &Degraded{dir: dir, log: log, eps: eps, bad: bad, onStore: onStore}
	d.health = newHealth(filepath.Join(dir, journalDir), d.reopen)
	d.health.always = true
	d.health.fail(openErr)
	return d, nil
}

// scanReadOnly reads the journal and the endpoint directories as Open
// and Scan would, without writing, and closes every file it opened.
func scanReadOnly(dir string, log *slog.Logger) ([]*endpoint.Endpoint, []ScanError, error) {
	j := &journal{dir: filepath.Join(dir, journalDir), log: log, segSize: segSizeFor(dir), marker: -1, ro: true,
		done: make(chan struct{})}
	j.cond = sync.NewCond(&j.mu)
	rp, err := j.load(dir)
	j.closeFiles()
	if err != nil {
		return nil, nil, fmt.Errorf("read state dir read-only: %w", err)
	}
	s := &Store{dir: dir, log: log, ro: true, sizes: newSizeTable(), cpReady: make(chan struct{})}
	s.loadReplay(rp)
	eps, bad := s.Scan()
	return eps, bad, nil
}

// reopen opens the Store once a probe succeeded, removes the state
// whose removal was refused and hands the Store over. Writes are
// refused until it returns nil, so no new state races those removals.
func (d *Degraded) reopen(failed []endpoint.ID) error {
	d.mu.Lock()
	st := d.store
	d.mu.Unlock()
	if st == nil {
		var err error
		if st, err = Open(d.dir, d.log); err != nil {
			return err
		}
		if eps, bad := st.Scan(); len(eps) != len(d.eps) || len(bad) > 0 {
			d.log.Warn("the state directory changed while it was read-only", "endpoints-at-start", len(d.eps),
				"endpoints-now", len(eps), "unreadable", len(bad))
		}
		d.mu.Lock()
		d.store = st
		d.mu.Unlock()
	}
	if len(failed) > 0 {
		if err := st.removeFailed(failed); err != nil {
			return err
		}
	}
	d.log.Info("state directory writable again: state store opened", "state-dir", d.dir, "removed", len(failed))
	d.onStore(st)
	return nil
}

// Dir returns the state directory.
func (d *Degraded) Dir() string { return d.dir }

// Scan returns what the directory held at OpenDegraded.
func (d *Degraded) Scan() ([]*endpoint.Endpoint, []ScanError) { return d.eps, d.bad }

// Write refuses: the directory is read-only.
func (d *Degraded) Write(ep *endpoint.Endpoint, done func(error)) {
	done(fmt.Errorf("state of endpoint %d: %w", ep.ID, d.refusal()))
}

// Remove refuses and remembers id: its state is removed once the
// directory works again, before anything else is written.
func (d *Degraded) Remove(id endpoint.ID, done func(error)) {
	d.health.remember(id)
	done(fmt.Errorf("state of endpoint %d: %w", id, d.refusal()))
}

// Quarantine refuses: nothing is moved while the directory is read-only.
func (d *Degraded) Quarantine(id endpoint.ID, done func(moved bool, err error)) {
	done(false, fmt.Errorf("quarantine state of endpoint %d: %w", id, d.refusal()))
}

// refusal is the error every write gets.
func (d *Degraded) refusal() error {
	if err := d.health.refusal(); err != nil {
		return err
	}
	return fmt.Errorf("state directory %s: reopening: %w", d.dir, unix.EROFS)
}

// Health is the state directory's health.
func (d *Degraded) Health() Health { return d.health.get() }

// OnHealth makes fn hear every change of the health (see Store.OnHealth).
func (d *Degraded) OnHealth(fn func(Health)) {
	d.health.mu.Lock()
	d.health.onChange = fn
	d.health.mu.Unlock()
}

// Close stops the probes (and closes the Store if one was opened and
// not handed over yet: the caller closes a Store it was handed).
func (d *Degraded) Close() { d.health.close() }
