package agent

import (
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/restore"
)

// stateStore is the agent's state store: the restore.Store, or, when
// the state directory is read-only at start, a restore.Degraded that
// serves the endpoints it held, refuses every change naming the cause
// and hands a Store over once the directory works again (an agent that
// crashed or was restarted on a read-only directory comes up instead
// of crash-looping, and recovers without another restart).
type stateStore struct {
	deg *restore.Degraded // nil when the directory was writable at start

	// mu orders the handover with OnHealth.
	mu       sync.Mutex
	onHealth func(restore.Health)
	st       atomic.Pointer[restore.Store]
}

func openStateStore(dir string, log *slog.Logger) (*stateStore, error) {
	s := &stateStore{}
	st, err := restore.Open(dir, log)
	if err == nil {
		s.st.Store(st)
		return s, nil
	}
	deg, err := restore.OpenDegraded(dir, log, err, s.handOver)
	if err != nil {
		return nil, err
	}
	log.Error("state directory read-only at start: its endpoints are restored, creates and state changes are refused until it is writable again",
		"state-dir", dir, "cause", deg.Health().Err)
	s.deg = deg
	return s, nil
}

// handOver makes st the store once the read-only directory works again.
func (s *stateStore) handOver(st *restore.Store) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.onHealth != nil {
		st.OnHealth(s.onHealth)
	}
	s.st.Store(st)
}

func (s *stateStore) Write(ep *endpoint.Endpoint, done func(error)) {
	if st := s.st.Load(); st != nil {
		st.Write(ep, done)
		return
	}
	s.deg.Write(ep, done)
}

func (s *stateStore) Remove(id endpoint.ID, done func(error)) {
	if st := s.st.Load(); st != nil {
		st.Remove(id, done)
		return
	}
	s.deg.Remove(id, done)
}

func (s *stateStore) Quarantine(id endpoint.ID, done func(moved bool, err error)) {
	if st := s.st.Load(); st != nil {
		st.Quarantine(id, done)
		return
	}
	s.deg.Quarantine(id, done)
}

// Scan is the store's Scan; with a degraded start, what the read-only
// directory held (the Store handed over later scanned it itself).
func (s *stateStore) Scan() ([]*endpoint.Endpoint, []restore.ScanError) {
	if s.deg != nil {
		return s.deg.Scan()
	}
	return s.st.Load().Scan()
}

func (s *stateStore) Dir() string {
	if s.deg != nil {
		return s.deg.Dir()
	}
	return s.st.Load().Dir()
}

func (s *stateStore) Stats() restore.Stats {
	if st := s.st.Load(); st != nil {
		return st.Stats()
	}
	return restore.Stats{}
}

func (s *stateStore) Health() restore.Health {
	if st := s.st.Load(); st != nil {
		return st.Health()
	}
	return s.deg.Health()
}

// OnHealth makes fn hear every change of the directory's health, from
// the degraded start through the handover to the Store.
func (s *stateStore) OnHealth(fn func(restore.Health)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onHealth = fn
	if s.deg != nil {
		s.deg.OnHealth(fn)
	}
	if st := s.st.Load(); st != nil {
		st.OnHealth(fn)
	}
}

// Close stops the degraded store's probes (no handover after it) and
// closes the Store.
func (s *stateStore) Close() {
	if s.deg != nil {
		s.deg.Close()
	}
	if st := s.st.Load(); st != nil {
		st.Close()
	}
}

// Abort is Store.Abort (a simulated crash).
func (s *stateStore) Abort() {
	if s.deg != nil {
		s.deg.Close()
	}
	if st := s.st.Load(); st != nil {
		st.Abort()
	}
}
