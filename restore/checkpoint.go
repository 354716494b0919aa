package restore

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// maxCheckpointQueue bounds the records durable in the journal but not yet
// in the directories that the store keeps in memory: beyond it the
// appender waits for a checkpoint (back-pressure).
const maxCheckpointQueue = 1 << 15

// kickWrites is how many writes may wait for a checkpoint before one is
// asked for: their bytes (about a KiB each) stay in the arena until then,
// and the arena's free slabs (maxFreeSlabs) should cover them.
const kickWrites = 2048

// addCheckpoint queues durable records for the checkpointer, and asks for
// a checkpoint now when the queue is getting long.
func (s *Store) addCheckpoint(rs []request) {
	if len(rs) == 0 {
		return
	}
	s.cpMu.Lock()
	s.cpQueue = append(s.cpQueue, rs...)
	s.cpWrites += countWrites(rs)
	long := len(s.cpQueue) >= maxCheckpointQueue/4 || s.cpWrites >= kickWrites
	s.cpMu.Unlock()
	if long || slices.ContainsFunc(rs, func(r request) bool { return r.quarantine }) {
		s.kickCheckpoint()
	}
}

// kickCheckpoint asks the checkpointer to run now. Never blocks.
func (s *Store) kickCheckpoint() {
	select {
	case s.cpKick <- struct{}{}:
	default:
	}
}

// waitCheckpointRoom holds the appender while the checkpoint queue is
// full.
func (s *Store) waitCheckpointRoom(t *commitTimes) {
	s.cpMu.Lock()
	defer s.cpMu.Unlock()
	if len(s.cpQueue) < maxCheckpointQueue {
		return
	}
	start := time.Now()
	for len(s.cpQueue) >= maxCheckpointQueue && !s.cpGone() {
		s.kickCheckpoint()
		s.cpRoom.Wait()
	}
	t.stalls++
	t.stalled += time.Since(start)
}

// cpGone says the checkpointer stopped. s.cpMu held.
func (s *Store) cpGone() bool {
	select {
	case <-s.cpDone:
		return true
	default:
		return false
	}
}

// stopCheckpointer has the checkpointer run a last checkpoint (unless
// the store was aborted) and waits for it.
func (s *Store) stopCheckpointer() {
	close(s.cpStop)
	<-s.cpDone
	s.cpMu.Lock()
	s.cpRoom.Broadcast()
	s.cpMu.Unlock()
}

// checkpointer writes the records the journal made durable into the
// endpoint directories: every cpEvery, or at once when the journal or
// the queue fill up (kick). One checkpoint writes the group's files, puts
// them in place, flushes the filesystem with one syncfs, and then records
// in the journal that everything through its last record is in: the
// segments holding only such records are free for reuse. A checkpoint
// that fails is retried (its records stay in the journal meanwhile).
func (s *Store) checkpointer() {
	defer close(s.cpDone)
	defer close(s.work) // its workers end with it
	select {
	case <-s.cpReady:
	case <-s.cpStop:
	}
	t := time.NewTimer(s.cpEvery)
	defer t.Stop()
	backoff := time.Duration(0)
	for {
		stopping := false
		select {
		case <-s.cpKick:
		case <-t.C:
		case <-s.cpStop:
			stopping = true
		}
		s.mu.Lock()
		aborted := s.aborted
		s.mu.Unlock()
		group := s.takeCheckpoint()
		if aborted {
			s.settleAll(group, fmt.Errorf("quarantine: %w", ErrClosed))
			return
		}
		err := s.checkpoint(group)
		switch {
		case err == nil:
			backoff = 0
			s.spareQueue(group)
		case stopping:
			s.log.Error("stopping with state not yet written to the endpoint directories; the next start replays it from the journal", "err", err)
			s.settleAll(group, err)
			return
		default:
			s.putBack(group)
			s.mu.Lock()
			closing := s.closed
			s.mu.Unlock()
			if closing {
				s.j.stop() // an appender waiting for journal space gives up
			}
			s.health.fail(err)
			backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
			s.log.Error("writing the journal's records to the endpoint directories failed; retrying", "err", err, "retry-in", backoff)
		}
		if stopping {
			return
		}
		t.Reset(max(s.cpEvery, backoff))
	}
}

// takeCheckpoint takes the queued records and signals room.
func (s *Store) takeCheckpoint() []request {
	s.cpMu.Lock()
	group := s.cpQueue
	s.cpQueue, s.cpSpare, s.cpWrites = s.cpSpare, nil, 0
	s.cpMu.Unlock()
	s.cpRoom.Broadcast()
	return group
}

// spareQueue keeps a checkpointed group's array for the next queue.
func (s *Store) spareQueue(group []request) {
	if cap(group) > maxCheckpointQueue {
		return
	}
	clear(group)
	s.cpMu.Lock()
	s.cpSpare = group[:0]
	s.cpMu.Unlock()
}

// putBack queues a failed checkpoint's records again, ahead of newer ones.
func (s *Store) putBack(group []request) {
	s.cpMu.Lock()
	s.cpQueue = append(group, s.cpQueue...)
	s.cpWrites += countWrites(group)
	s.cpMu.Unlock()
}

// countWrites counts the writes among rs.
func countWrites(rs []request) int {
	n := 0
	for i := range rs {
		if rs[i].data != nil {
			n++
		}
	}
	return n
}

// settleAll answers the quarantines of a group that will not be
// checkpointed in this run, and releases its buffers.
func (s *Store) settleAll(group []request, err error) {
	for i := range group {
		if r := &group[i]; r.done != nil {
			r.done(err)
		}
		group[i].release()
	}
	s.arena.drop(group)
}

// checkpoint applies group (records in seq order) to the directories and
// makes them durable. On success it answers the group's quarantines and
// advances the journal's checkpoint; on failure it changes nothing the
// caller must undo (a retry applies the group again: a write puts the
// whole state in place, a removal of missing state succeeds).
func (s *Store) checkpoint(group []request) error {
	recs := group
	var barriers []request
	if slices.ContainsFunc(group, func(r request) bool { return r.barrier }) {
		recs = make([]request, 0, len(group))
		for _, r := range group {
			if r.barrier {
				barriers = append(barriers, r)
			} else {
				recs = append(recs, r)
			}
		}
	}
	err := s.applyRecords(recs)
	if err == nil {
		for _, r := range barriers {
			r.done(nil)
		}
	}
	return err
}

// applyRecords is checkpoint's work for the records of a group.
func (s *Store) applyRecords(group []request) error {
	if len(group) == 0 {
		return nil
	}
	start := time.Now()
	b := s.prepare(group)
	s.apply(b, nil)
	err := s.flush()
	for _, i := range b.final {
		if e := b.res[i].err; e != nil && err == nil {
			err = e
		}
	}
	last := group[len(group)-1].seq
	if err == nil {
		err = s.j.checkpointed(last)
	}
	s.settle(b, err)
	s.mu.Lock()
	s.stats.Checkpoints++
	s.stats.Applied += uint64(len(group))
	s.stats.Checkpointing += time.Since(start)
	if err != nil {
		s.stats.CheckpointFailures++
	}
	s.mu.Unlock()
	return err
}

// settle ends a checkpoint's batch: on success it answers the
// quarantines, releases the buffers and recycles the removed directories;
// on failure it keeps the requests for the retry (only the removed
// directories, already in the trash, are recycled).
func (s *Store) settle(b *batch, err error) {
	if err == nil {
		for _, r := range b.group {
			res := &b.res[b.last[r.id]] // a superseded request shares the outcome of the last
			if r.moved != nil {
				*r.moved = res.quarantined
			}
			if r.done != nil {
				r.done(nil)
			}
			r.release()
		}
		s.arena.drop(b.group)
	}
	for _, i := range b.final {
		if res := &b.res[i]; res.ntrash > 0 {
			s.recycle(res.trash[:res.ntrash])
		}
	}
	s.recycleBatch(b, err == nil)
}

// loadReplay turns what Open found in the journal beyond the last
// checkpoint into the first checkpoint's queue and Scan's view.
func (s *Store) loadReplay(rp replayed) {
	s.replayBad = rp.bad
	if len(rp.recs) == 0 {
		return
	}
	s.replay = make(map[endpoint.ID]*endpoint.Endpoint)
	for _, r := range rp.recs {
		req := request{id: r.id, seq: r.seq}
		switch r.kind {
		case kindWrite:
			ep, err := Decode(r.payload)
			if err == nil && ep.ID != r.id {
				err = fmt.Errorf("journal record %d for endpoint %d holds endpoint %d: %w", r.seq, r.id, ep.ID, ErrCorrupt)
			}
			if err != nil {
				s.replayBad = append(s.replayBad, s.quarantineRecord(r, err))
				continue
			}
			req.data = slices.Clone(r.payload)
			req.header = appendHeader(nil, ep)
			s.replay[r.id] = ep
		case kindQuarantine:
			req.quarantine = true
			s.replay[r.id] = nil
		default:
			s.replay[r.id] = nil
		}
		s.cpQueue = append(s.cpQueue, req)
	}
	s.cpWrites = countWrites(s.cpQueue)
	s.log.Info("replaying the state journal", "records", len(rp.recs), "endpoints", len(s.replay))
}

// quarantineRecord sets aside a journal record whose CRC checks but whose
// state does not decode (a bug or a foreign version): its bytes go to the
// quarantine, the endpoint keeps what its directory holds.
func (s *Store) quarantineRecord(r jrecord, cause error) ScanError {
	se := ScanError{Dir: fmt.Sprintf("%s/%s (record %d, endpoint %d)", s.dir, journalDir, r.seq, r.id), Err: cause}
	name := fmt.Sprintf("journal-%d-record-%d.json", r.id, r.seq)
	if p, err := s.writeQuarantine(name, r.payload); err == nil {
		se.Quarantined = p
	} else {
		s.log.Error("cannot quarantine a journal record", "err", errors.Join(err, cause))
	}
	s.log.Error("unreadable state in the journal set aside", "endpoint", r.id, "seq", r.seq, "err", cause, "quarantined", se.Quarantined)
	return se
}
