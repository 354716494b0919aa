package actors

import (
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/index"
)

// indexWriter commits the index changes of every table owner (the IPAM,
// identity, ipcache and policy actors and the endpoint manager) on one
// goroutine: each owner hands over what one mailbox pass changed (a
// group), and the writer applies every group queued meanwhile in one
// go-memdb write transaction, then sends the groups' replies. Before, each
// owner committed its own pass: ~3 rows per transaction, and go-memdb
// copies the upper radix nodes and sets up a writable cache per index for
// every transaction. One writer also takes memdb's write lock off the
// actors' goroutines.
//
// Groups are applied whole and in the order they were handed over, so a
// reader's snapshot never shows half of a pass (an identity's refcount
// always agrees with its leases) and an owner's later pass overwrites its
// earlier one. A reply is sent only after the transaction holding every
// group handed over before it committed. An owner that rebuilds from the
// index calls sync first, so it reads what its previous incarnation wrote.
type indexWriter struct {
	ix  *index.Index
	log *slog.Logger
	// send delivers replies (the actor system's root Send).
	send func(*actor.PID, any)
	// counters counts transactions and rows (nil: not counted).
	counters *Counters

	mu        sync.Mutex
	committed *sync.Cond // signalled after each commit, on mu
	queue     []writeGroup
	spare     []writeGroup // the previous round's queue, for reuse
	free      [][]indexOp  // op slices of committed groups, for reuse
	submitted uint64       // groups handed over
	done      uint64       // groups committed and answered
	stopped   bool
	wake      chan struct{} // cap 1: the queue became non-empty
	exited    chan struct{}
}

// writeGroup is one owner's mailbox pass: changes and the replies that
// wait for them.
type writeGroup struct {
	ops     []indexOp
	replies []messages.Reply
}

// maxFreeOps bounds the recycled op slices (and their capacity), so one
// burst does not pin memory.
const (
	maxFreeOps   = 64
	maxRecycleOp = 256
)

func newIndexWriter(ix *index.Index, send func(*actor.PID, any), counters *Counters, log *slog.Logger) *indexWriter {
	w := &indexWriter{ix: ix, send: send, counters: counters, log: log.With("component", "index-writer"),
		wake: make(chan struct{}, 1), exited: make(chan struct{})}
	w.committed = sync.NewCond(&w.mu)
	go w.run()
	return w
}

// submit hands over a group; its op slice belongs to the writer from now
// on. A group of replies only, with nothing queued before it, is answered
// at once. After stop, the group is committed on the caller's goroutine.
func (w *indexWriter) submit(g writeGroup) {
	w.mu.Lock()
	if len(g.ops) == 0 && w.done == w.submitted {
		w.mu.Unlock()
		w.answer(g.replies)
		return
	}
	if w.stopped {
		w.mu.Unlock()
		<-w.exited // after the groups queued before the stop
		w.commit([]writeGroup{g})
		return
	}
	w.submitted++
	w.queue = append(w.queue, g)
	if len(w.queue) == 1 {
		select { // under mu: stop closes wake under mu
		case w.wake <- struct{}{}:
		default:
		}
	}
	w.mu.Unlock()
}

// opsBuffer returns an empty op slice for a new group.
func (w *indexWriter) opsBuffer() []indexOp {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := len(w.free); n > 0 {
		ops := w.free[n-1]
		w.free = w.free[:n-1]
		return ops
	}
	return nil
}

// sync waits until every group handed over so far is committed.
func (w *indexWriter) sync() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for target := w.submitted; w.done < target; {
		w.committed.Wait()
	}
}

// stop commits what is queued and ends the goroutine; later groups are
// committed by their submitter.
func (w *indexWriter) stop() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		<-w.exited
		return
	}
	w.stopped = true
	close(w.wake)
	w.mu.Unlock()
	<-w.exited
}

func (w *indexWriter) run() {
	defer close(w.exited)
	for {
		_, ok := <-w.wake
		if ok {
			// Let the goroutines that are runnable hand over their
			// groups first, so a transaction carries more rows
			// (membrane-sim reports rows per transaction).
			runtime.Gosched()
		}
		w.round()
		if !ok {
			return
		}
	}
}

// round commits every queued group in one transaction.
func (w *indexWriter) round() {
	w.mu.Lock()
	groups := w.queue
	w.queue, w.spare = w.spare[:0], nil
	w.mu.Unlock()
	if len(groups) == 0 {
		return
	}
	w.commit(groups)
	w.mu.Lock()
	w.done += uint64(len(groups))
	for i := range groups {
		if ops := groups[i].ops; cap(ops) > 0 && cap(ops) <= maxRecycleOp && len(w.free) < maxFreeOps {
			clear(ops)
			w.free = append(w.free, ops[:0])
		}
		groups[i] = writeGroup{}
	}
	w.spare = groups[:0]
	w.committed.Broadcast()
	w.mu.Unlock()
}

// commit applies groups in one write transaction and sends their replies.
func (w *indexWriter) commit(groups []writeGroup) {
	start := time.Now()
	txn := w.ix.WriteTxn()
	rows := 0
	for _, g := range groups {
		rows += len(g.ops)
		for _, op := range g.ops {
			var err error
			if op.Delete {
				err = index.Delete(txn, op.Table, op.Obj)
			} else {
				err = index.Insert(txn, op.Table, op.Obj)
			}
			if err != nil && !(op.Delete && isNotFound(err)) {
				w.log.Error("index write failed", "table", op.Table, "delete", op.Delete, "err", err)
			}
		}
	}
	txn.Commit()
	if w.counters != nil {
		w.counters.indexTxns.Add(1)
		w.counters.indexRows.Add(uint64(rows))
	}
	for _, g := range groups {
		w.answer(g.replies)
	}
	if w.counters != nil {
		w.counters.indexCommitNs.Add(int64(time.Since(start)))
	}
}

func (w *indexWriter) answer(replies []messages.Reply) {
	for _, r := range replies {
		w.send(r.To, r.Message)
	}
}
