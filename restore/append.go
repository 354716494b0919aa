package restore

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// appender commits groups to the journal: it takes every request queued
// meanwhile, appends their records with one write and makes them durable
// with one fdatasync, hands them to the checkpointer and answers them.
func (s *Store) appender() {
	defer close(s.appDone)
	var spare []request
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.closed {
			s.cond.Wait()
		}
		if s.aborted {
			s.mu.Unlock()
			return // Abort answered the queue
		}
		group := s.queue
		s.queue = spare
		closed := s.closed
		if len(group) > 0 {
			s.stats.Groups++
			s.stats.Requests += uint64(len(group))
		}
		s.mu.Unlock()
		if len(group) == 0 && closed {
			return
		}
		s.commit(group)
		clear(group)
		if cap(group) <= maxFreeQueue {
			spare = group[:0]
		} else {
			spare = nil
		}
	}
}

// commitTimes is what one commit measured.
type commitTimes struct {
	wait, append, sync, answer, stalled time.Duration
	syncs, stalls                       uint64
}

// commit makes a group's records durable and answers the group.
func (s *Store) commit(group []request) {
	var t commitTimes
	now := time.Now()
	for i := range group {
		t.wait += now.Sub(time.Unix(0, group[i].queued))
	}
	s.waitCheckpointRoom(&t)
	s.checkRecords(group)
	for i := 0; i < len(group); {
		for i < len(group) && (group[i].err != nil || group[i].barrier) {
			i++
		}
		if i == len(group) {
			break
		}
		stall := time.Now()
		seg, err := s.j.take(recordSize(len(group[i].data)), s.kickCheckpoint)
		if d := time.Since(stall); d > time.Millisecond {
			t.stalls++
			t.stalled += d
		}
		if err != nil {
			failFrom(group[i:], err)
			break
		}
		i = s.appendChunk(seg, group, i, &t)
	}
	answer := time.Now()
	var latency time.Duration
	var lh Hist
	var barriers []request
	for i := range group {
		r := &group[i]
		switch {
		case r.barrier:
			barriers = append(barriers, *r)
		case r.err != nil:
			if !errors.Is(r.err, ErrClosed) {
				s.log.Error("writing endpoint state failed", "endpoint", r.id, "err", r.err)
			}
			if errno := unix.Errno(0); errors.As(r.err, &errno) {
				s.health.fail(r.err) // the filesystem's answer, not the request's
			}
			r.done(r.err)
			r.release()
		case !r.quarantine: // a quarantine is answered by its checkpoint
			r.done(nil)
			r.release() // its bytes are in the arena now
		default:
			r.release()
		}
		if !r.barrier {
			l := answer.Sub(time.Unix(0, r.queued))
			latency += l
			lh.Add(l)
		}
	}
	t.answer = time.Since(answer)
	if len(barriers) > 0 {
		s.addCheckpoint(barriers)
		s.kickCheckpoint()
	}
	s.mu.Lock()
	st := &s.stats
	st.Waiting += t.wait
	st.Appending += t.append
	st.Syncing += t.sync
	st.Answering += t.answer
	st.Latency += latency
	for b, n := range lh {
		st.LatencyHist[b] += n
	}
	st.Syncs += t.syncs
	st.Stalls += t.stalls
	st.Stalled += t.stalled
	s.mu.Unlock()
}

// appendChunk writes the records of group[i:] that fit in seg with one
// write and one fdatasync, hands them to the checkpointer, and returns
// the index of the first record it did not take.
func (s *Store) appendChunk(seg *segment, group []request, i int, t *commitTimes) int {
	start := time.Now()
	buf := s.jbuf[:0]
	if seg.used == 0 {
		buf = appendSegHeader(buf, seg.gen)
	}
	lo := i
	for ; i < len(group); i++ {
		r := &group[i]
		if r.err != nil || r.barrier {
			continue
		}
		if seg.used+len(buf)+recordSize(len(r.data)) > seg.size {
			break
		}
		r.seq = s.j.seqs(1)
		buf = appendRecord(buf, jrecord{gen: seg.gen, seq: r.seq, id: r.id, kind: kindOf(r), payload: r.data})
	}
	if cap(buf) <= 1<<20 {
		s.jbuf = buf
	}
	err := pwriteAll(seg.fd, buf, int64(seg.used))
	wrote := time.Now()
	t.append += wrote.Sub(start)
	if err == nil {
		during := s.flushing.Load() != 0
		err = fdatasync(seg.fd)
		during = during || s.flushing.Load() != 0
		d := time.Since(wrote)
		t.sync += d
		t.syncs++
		s.mu.Lock()
		s.stats.SyncHist.Add(d)
		if during {
			s.stats.SyncHistOverlap.Add(d)
		}
		s.mu.Unlock()
	}
	if err != nil {
		s.j.seal(seg)
		failFrom(group[lo:i], fmt.Errorf("append to the state journal %s: %w", seg.name, err))
		return i
	}
	seg.used += len(buf)
	durable := s.durable[:0]
	for k := lo; k < i; k++ {
		if r := group[k]; r.err == nil && !r.barrier {
			seg.maxSeq = r.seq
			if !r.quarantine {
				r.done = nil // answered by commit
			}
			if r.data != nil {
				// The encoding buffer goes back to the pool now (commit
				// releases it); the checkpoint reads the arena's copy.
				r.data, r.header, r.slab = s.arena.copy(r.data, r.header)
				r.buf = nil
			}
			durable = append(durable, r)
		}
	}
	s.addCheckpoint(durable)
	clear(durable)
	s.durable = durable[:0]
	return i
}

// failFrom fails the requests of group that have not failed yet.
func failFrom(group []request, err error) {
	for k := range group {
		if group[k].err == nil {
			group[k].err = fmt.Errorf("state of endpoint %d: %w", group[k].id, err)
		}
	}
}

func kindOf(r *request) recKind {
	switch {
	case r.data != nil:
		return kindWrite
	case r.quarantine:
		return kindQuarantine
	}
	return kindRemove
}

// spaceBlocks is the filesystem blocks a checkpoint may need per write:
// its two files (its directory is usually a spare or recycled one).
const spaceBlocks = 2

// checkRecords fails the writes that cannot be journaled (too large) or
// that the directories would have no room for: a write is refused when
// the state directory's filesystem lacks the blocks to checkpoint it and
// the writes waiting before it (ENOSPC, as a full disk would answer),
// rather than accepted into the journal and stuck there. Removals always
// go on.
func (s *Store) checkRecords(group []request) {
	writes := 0
	for i := range group {
		r := &group[i]
		if r.data == nil {
			continue
		}
		if len(r.data) > s.j.maxPayload() {
			r.err = fmt.Errorf("write state of endpoint %d: %d bytes, the journal takes at most %d", r.id, len(r.data), s.j.maxPayload())
			continue
		}
		writes++
	}
	if writes == 0 {
		return
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(s.sd.fd, &st); err != nil {
		return // no answer: the writes go on, a failing checkpoint retries
	}
	free := st.Bavail
	if os.Geteuid() == 0 {
		free = st.Bfree // root may use the blocks reserved for it
	}
	s.cpMu.Lock()
	pending := min(s.cpWrites, 1024)
	s.cpMu.Unlock()
	need := uint64(writes+pending) * spaceBlocks
	if free >= need {
		return
	}
	for i := range group {
		if r := &group[i]; r.data != nil && r.err == nil {
			r.err = fmt.Errorf("write state of endpoint %d: %d blocks free in the state directory's filesystem, %d needed: %w",
				r.id, free, need, unix.ENOSPC)
		}
	}
}
