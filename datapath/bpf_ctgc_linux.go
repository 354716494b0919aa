package datapath

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// Conntrack lifetimes without traffic: bpf/endpoint.c's CT_LIFETIME_TCP
// and CT_LIFETIME_OTHER (an entry older than its lifetime is no longer a
// connection for the programs).
const (
	ctLifetimeTCP   = 6 * time.Hour
	ctLifetimeOther = 60 * time.Second
)

// ctExpired reports whether the programs treat v as gone at now (both
// bpf_ktime_get_ns, CLOCK_MONOTONIC).
func ctExpired(k *bpf.EndpointCtKey, v *bpf.EndpointCtValue, now uint64) bool {
	life := uint64(ctLifetimeOther)
	if k.Proto == policy.ProtoTCP {
		life = uint64(ctLifetimeTCP)
	}
	return v.LastSeen < now && now-v.LastSeen > life
}

// ktimeNow is bpf_ktime_get_ns's clock.
func ktimeNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// ctMinBatch is the smallest batch a pass asks for (buckets hold a few
// entries; smaller buffers risk ENOSPC).
const ctMinBatch = 64

// ctCollector walks the ct map a bounded number of entries per pass,
// resuming where the previous pass stopped. One goroutine uses it.
type ctCollector struct {
	cursor ebpf.MapBatchCursor
	keys   []bpf.EndpointCtKey
	vals   []bpf.EndpointCtValue
	victim []bpf.EndpointCtKey
}

// pass examines up to budget entries of m and deletes those expired at
// now, re-checking each just before its delete (a packet may have
// refreshed it meanwhile). done reports that the pass reached the map's
// end (the next pass starts over).
func (g *ctCollector) pass(m *ebpf.Map, now uint64, budget int) (examined, deleted int, done bool, err error) {
	if g.keys == nil {
		g.keys, g.vals = make([]bpf.EndpointCtKey, ctBatch), make([]bpf.EndpointCtValue, ctBatch)
	}
	g.victim = g.victim[:0]
	for examined < budget && !done {
		// A batch returns whole hash buckets: a buffer smaller than a
		// bucket is refused (ENOSPC) and retried larger, so a pass may
		// exceed its budget by a bucket.
		n := min(ctBatch, max(budget-examined, ctMinBatch))
		got, lerr := m.BatchLookup(&g.cursor, g.keys[:n], g.vals[:n], nil)
		for errors.Is(lerr, unix.ENOSPC) && n < ctBatch {
			n = min(2*n, ctBatch)
			got, lerr = m.BatchLookup(&g.cursor, g.keys[:n], g.vals[:n], nil)
		}
		switch {
		case errors.Is(lerr, ebpf.ErrKeyNotExist):
			done, g.cursor = true, ebpf.MapBatchCursor{}
		case errors.Is(lerr, ebpf.ErrNotSupported):
			return g.passIterate(m, now)
		case lerr != nil:
			return examined, deleted, false, fmt.Errorf("conntrack gc: batch lookup: %w", lerr)
		}
		for i := range got {
			if ctExpired(&g.keys[i], &g.vals[i], now) {
				g.victim = append(g.victim, g.keys[i])
			}
		}
		examined += got
	}
	deleted, err = g.deleteExpired(m, now)
	return examined, deleted, done, err
}

// passIterate is pass on kernels without batch lookups: the whole map,
// key by key (bounded by the map's size).
func (g *ctCollector) passIterate(m *ebpf.Map, now uint64) (examined, deleted int, done bool, err error) {
	g.victim = g.victim[:0]
	var k bpf.EndpointCtKey
	var v bpf.EndpointCtValue
	it := m.Iterate()
	for it.Next(&k, &v) {
		examined++
		if ctExpired(&k, &v, now) {
			g.victim = append(g.victim, k)
		}
	}
	if err := it.Err(); err != nil {
		return examined, 0, false, fmt.Errorf("conntrack gc: iterate: %w", err)
	}
	deleted, err = g.deleteExpired(m, now)
	return examined, deleted, true, err
}

// deleteExpired deletes the victims still expired.
func (g *ctCollector) deleteExpired(m *ebpf.Map, now uint64) (int, error) {
	n := 0
	var v bpf.EndpointCtValue
	for i := range g.victim {
		k := &g.victim[i]
		if err := m.Lookup(k, &v); err != nil || !ctExpired(k, &v, now) {
			continue // gone or refreshed meanwhile
		}
		err := m.Delete(k)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("conntrack gc: delete: %w", err)
		}
		n++
	}
	return n, nil
}

// ctGCLoop runs conntrack passes until stop closes, at intervals adapted
// to what each pass deletes. A goroutine of the datapath, not an actor:
// its map calls block nobody's mailbox.
func (l *Linux) ctGCLoop(stop <-chan struct{}) {
	cfg := l.cfg.CTGC
	var g ctCollector
	interval := cfg.Interval
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		select {
		case <-stop:
			return
		case <-timer.C:
		}
		var examined, deleted int
		var done bool
		err := l.guardBPF(func(b *bpfState) error {
			var err error
			examined, deleted, done, err = g.pass(b.maps.ct, ktimeNow(), cfg.Budget)
			return err
		})
		if errors.Is(err, ErrClosed) {
			return
		}
		if err != nil {
			l.log.Warn("conntrack garbage collection pass failed", "err", err)
		}
		interval = NextCTGCInterval(interval, deleted, examined, cfg.MinInterval, cfg.MaxInterval)
		l.mu.Lock()
		st := &l.ctStats
		st.Passes++
		if done {
			st.Cycles++
		}
		st.Examined += uint64(examined)
		st.Deleted += uint64(deleted)
		st.LastExamined, st.LastDeleted, st.Interval = examined, deleted, interval
		l.mu.Unlock()
		if deleted > 0 {
			l.log.Debug("conntrack garbage collection", "examined", examined, "deleted", deleted, "next", interval)
		}
		timer.Reset(interval)
	}
}

// CTGCStats returns what the conntrack garbage collector did so far.
func (l *Linux) CTGCStats() CTGCStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ctStats
}
