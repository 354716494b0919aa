package flows

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent/metrics"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
	"github.com/membrane-cni/membrane/pkg/domain/index"
)

var (
	// ErrInvalidConfig is wrapped by Config validation errors.
	ErrInvalidConfig = errors.New("invalid flows config")
	// ErrTooManyFollowers is returned by Follow when MaxFollowers streams
	// are open.
	ErrTooManyFollowers = errors.New("too many flow followers")
)

// Defaults of Config.
const (
	DefaultCapacity       = 4096
	DefaultRate           = 5000
	DefaultMaxFollowers   = 16
	DefaultFollowerBuffer = 1024
)

// Config configures a Store.
type Config struct {
	// Enabled says whether the endpoint programs report connections
	// (--flows), for the stats; drops are recorded either way.
	Enabled bool
	// Capacity is how many flows the ring keeps (--flows-buffer, default
	// DefaultCapacity).
	Capacity int
	// Rate bounds the flows recorded per second (--flows-rate, default
	// DefaultRate); the rest are counted as rate-limited.
	Rate int
	// MaxFollowers bounds the open follow streams (default
	// DefaultMaxFollowers); FollowerBuffer is how many flows one may
	// lag behind before it is dropped (default DefaultFollowerBuffer).
	MaxFollowers, FollowerBuffer int
	// Node is the node's name, written into every flow.
	Node string
	// Index is read for both sides' pods, labels and policies (nil:
	// flows carry addresses and identities only).
	Index *index.Index
	// Metrics counts the flows (nil: not counted).
	Metrics *metrics.Metrics
	// DatapathStats reads the programs' loss counters (nil: none).
	DatapathStats func() (datapath.FlowStats, error)
	// FQDNMinTTL is the agent's --tofqdns-min-ttl (fqdn.CacheConfig
	// MinTTL): how long a DNS answer names its addresses for the toFQDNs
	// rules a flow is explained by.
	FQDNMinTTL time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (c *Config) validate() error {
	for _, v := range []struct {
		name string
		val  *int
		def  int
	}{{"Capacity", &c.Capacity, DefaultCapacity}, {"Rate", &c.Rate, DefaultRate},
		{"MaxFollowers", &c.MaxFollowers, DefaultMaxFollowers}, {"FollowerBuffer", &c.FollowerBuffer, DefaultFollowerBuffer}} {
		if *v.val < 0 {
			return fmt.Errorf("flows config: %s %d: must not be negative: %w", v.name, *v.val, ErrInvalidConfig)
		}
		if *v.val == 0 {
			*v.val = v.def
		}
	}
	if c.Capacity > 1<<20 {
		return fmt.Errorf("flows config: Capacity %d: at most %d: %w", c.Capacity, 1<<20, ErrInvalidConfig)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Store is the node's flow log: a ring of the last Capacity flows and the
// open follow streams. Safe for concurrent use; no method blocks.
type Store struct {
	cfg Config

	// mu guards everything below. Held for O(1) work per flow plus one
	// non-blocking send per follower, never across I/O.
	mu        sync.Mutex
	ring      []models.Flow
	next      uint64 // sequence number of the next flow; ring[seq%capacity]
	followers map[*Follower]struct{}
	// proxied maps a redirected connection's tuple to its flow's
	// sequence number, for the L7 and DNS records (correlate.go); an
	// entry leaves when the ring overwrites its flow.
	proxied map[tuple]uint64
	// early holds L7 and DNS records that came before their redirected
	// flow (the proxies' records and the programs' reports travel apart),
	// attached when the flow comes; bounded by maxEarly, each kept for
	// earlyTTL.
	early map[tuple]earlyRecord
	// window, inWindow: the rate limit's current second.
	window   time.Time
	inWindow int
	stats    models.FlowStats

	// explainMu guards explained, the policies behind recent verdicts
	// (enrich.go), valid for policy revision explainRev.
	explainMu  sync.Mutex
	explained  map[explainKey][]string
	explainRev uint64

	// names are the DNS proxy's answers, for toFQDNs rules (names.go).
	names learnedNames
}

// New returns an empty Store.
func New(cfg Config) (*Store, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Store{cfg: cfg, ring: make([]models.Flow, min(cfg.Capacity, initialRing)), followers: map[*Follower]struct{}{},
		proxied: map[tuple]uint64{}, early: map[tuple]earlyRecord{}, names: learnedNames{cfg: fqdn.CacheConfig{MinTTL: cfg.FQDNMinTTL}}}, nil
}

// initialRing is the ring's length before it grows: it doubles as flows
// come, up to Config.Capacity (a full ring allocated at start was 1.7
// MiB of live heap on a node without traffic, which the garbage
// collector's goal multiplies). Until it wraps, no index reaches its
// length.
const initialRing = 64

// capacity is how many flows the ring keeps once grown: flow seq is at
// ring[seq % capacity].
func (s *Store) capacity() uint64 { return uint64(s.cfg.Capacity) }

// OnFlow records a flow report (datapath.LinuxHooks.OnFlow).
func (s *Store) OnFlow(ev datapath.FlowEvent) {
	if !s.admit() {
		return
	}
	s.add(s.fromFlow(ev))
}

// OnDrop records a drop notification as a dropped (or audit) flow.
func (s *Store) OnDrop(ev datapath.DropEvent) {
	if !s.admit() {
		return
	}
	s.add(s.fromDrop(ev))
}

// admit applies the rate limit, counting what it refuses.
func (s *Store) admit() bool {
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.window) >= time.Second {
		s.window, s.inWindow = now, 0
	}
	if s.inWindow >= s.cfg.Rate {
		s.stats.RateLimited++
		return false
	}
	s.inWindow++
	return true
}

// add appends fl to the ring and hands it to the followers it matches.
func (s *Store) add(fl models.Flow) {
	if m := s.cfg.Metrics; m != nil {
		m.Flow(fl.Type, fl.Verdict, fl.DropReason, fl.Source.Namespace, fl.Destination.Namespace)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addLocked(fl)
}

func (s *Store) addLocked(fl models.Flow) {
	seq := s.next
	i := seq % s.capacity()
	if i >= uint64(len(s.ring)) {
		grown := make([]models.Flow, min(s.capacity(), 2*uint64(len(s.ring))))
		copy(grown, s.ring)
		s.ring = grown
	}
	slot := &s.ring[i]
	if slot.Verdict == datapath.FlowRedirected {
		for _, k := range tuplesOf(slot) {
			if s.proxied[k] == seq-s.capacity() {
				delete(s.proxied, k)
			}
		}
	}
	*slot = fl
	s.next++
	s.stats.Seen++
	if fl.Verdict == datapath.FlowRedirected {
		for _, k := range tuplesOf(&fl) {
			s.proxied[k] = seq
			if e, ok := s.early[k]; ok {
				delete(s.early, k)
				if e.l7 != nil && slot.L7 == nil {
					slot.L7 = e.l7
				}
				if e.dns != nil && slot.DNS == nil {
					slot.DNS = e.dns
				}
			}
		}
		fl = *slot
	}
	for f := range s.followers {
		if !f.filter.Match(&fl) {
			continue
		}
		select {
		case f.ch <- fl:
		default:
			// Too slow: dropped, never waited for.
			s.stats.FollowerDrops++
			s.stats.FollowerLost++
			f.lost++
			delete(s.followers, f)
			close(f.dropped)
		}
	}
}

// Query returns the flows the ring holds that f matches, oldest first
// (the last f.Last of them when set), and the stats.
func (s *Store) Query(f Filter) ([]models.Flow, models.FlowStats) {
	s.mu.Lock()
	out := s.queryLocked(f)
	st := s.statsLocked()
	s.mu.Unlock()
	s.addDatapathStats(&st)
	return out, st
}

func (s *Store) queryLocked(f Filter) []models.Flow {
	n := s.capacity()
	first := uint64(0)
	if s.next > n {
		first = s.next - n
	}
	out := []models.Flow{}
	for seq := first; seq < s.next; seq++ {
		fl := &s.ring[seq%n]
		if f.Match(fl) {
			out = append(out, *fl)
		}
	}
	if f.Last > 0 && len(out) > f.Last {
		out = out[len(out)-f.Last:]
	}
	return out
}

// Stats returns the counters.
func (s *Store) Stats() models.FlowStats {
	s.mu.Lock()
	st := s.statsLocked()
	s.mu.Unlock()
	s.addDatapathStats(&st)
	return st
}

func (s *Store) statsLocked() models.FlowStats {
	st := s.stats
	st.Enabled, st.Capacity, st.Followers = s.cfg.Enabled, s.cfg.Capacity, len(s.followers)
	st.Buffered = int(min(s.next, s.capacity()))
	return st
}

// addDatapathStats reads the programs' loss counters (a map read,
// outside the lock).
func (s *Store) addDatapathStats(st *models.FlowStats) {
	if s.cfg.DatapathStats == nil {
		return
	}
	if ds, err := s.cfg.DatapathStats(); err == nil {
		st.DatapathLost, st.DropsLost = ds.FlowsLost, ds.DropsLost
	}
}

// Follower is an open follow stream: the flows f matches, from the time
// Follow returned.
type Follower struct {
	s      *Store
	filter Filter
	ch     chan models.Flow
	// dropped is closed when the store dropped the follower (too slow).
	dropped chan struct{}
	lost    uint64 // guarded by s.mu
}

// Follow opens a follow stream for the flows f matches, after the stored
// ones it returns (the Query of f). Returns ErrTooManyFollowers when
// MaxFollowers are open.
func (s *Store) Follow(f Filter) (*Follower, []models.Flow, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.followers) >= s.cfg.MaxFollowers {
		return nil, nil, fmt.Errorf("%w: %d open", ErrTooManyFollowers, len(s.followers))
	}
	fw := &Follower{s: s, filter: f, ch: make(chan models.Flow, s.cfg.FollowerBuffer), dropped: make(chan struct{})}
	s.followers[fw] = struct{}{}
	return fw, s.queryLocked(f), nil
}

// C delivers the flows.
func (fw *Follower) C() <-chan models.Flow { return fw.ch }

// Dropped is closed when the store dropped the follower because it fell
// FollowerBuffer flows behind; the flows still in C were sent before.
func (fw *Follower) Dropped() <-chan struct{} { return fw.dropped }

// Close ends the stream. Idempotent.
func (fw *Follower) Close() {
	fw.s.mu.Lock()
	delete(fw.s.followers, fw)
	fw.s.mu.Unlock()
}
