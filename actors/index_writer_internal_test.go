package actors

import (
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
)

// writerHarness is an index writer whose replies land in a channel.
type writerHarness struct {
	ix      *index.Index
	w       *indexWriter
	replies chan any
}

func newWriterHarness(t *testing.T) *writerHarness {
	t.Helper()
	ix, err := index.New()
	if err != nil {
		t.Fatal(err)
	}
	h := &writerHarness{ix: ix, replies: make(chan any, 1024)}
	h.w = newIndexWriter(ix, func(_ *actor.PID, msg any) { h.replies <- msg }, nil, slog.New(slog.DiscardHandler))
	t.Cleanup(h.w.stop)
	return h
}

func lease(id int, holder string) indexOp {
	return indexOp{Table: index.TableIdentityLeases, Obj: &index.IdentityLease{ID: identity.NumericIdentity(id), Holder: holder}}
}

func reply(msg string) []messages.Reply {
	return []messages.Reply{{To: &actor.PID{Id: "caller"}, Message: msg}}
}

func (h *writerHarness) hasLease(id int, holder string) bool {
	txn := h.ix.ReadTxn()
	defer txn.Abort()
	row, err := txn.First(index.TableIdentityLeases, index.IndexID, index.LeaseKey(identity.NumericIdentity(id), holder))
	return err == nil && row != nil
}

// TestIndexWriterRepliesAfterCommit: a reply, also one handed over alone
// after a pending change, is sent only once every change handed over
// before it is committed and readable. The test holds memdb's write lock,
// so the writer cannot commit; nothing may be answered meanwhile.
func TestIndexWriterRepliesAfterCommit(t *testing.T) {
	tests := []struct {
		name   string
		groups []writeGroup
		want   []string
	}{
		{name: "reply with its change", groups: []writeGroup{{ops: []indexOp{lease(1, "a")}, replies: reply("one")}}, want: []string{"one"}},
		{name: "reply alone after another owner's change", groups: []writeGroup{
			{ops: []indexOp{lease(1, "a")}},
			{replies: reply("two")},
		}, want: []string{"two"}},
		{name: "replies in order", groups: []writeGroup{
			{ops: []indexOp{lease(1, "a")}, replies: reply("one")},
			{replies: reply("two")},
			{ops: []indexOp{lease(2, "a")}, replies: reply("three")},
		}, want: []string{"one", "two", "three"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newWriterHarness(t)
			locked := h.ix.WriteTxn()
			for _, g := range tt.groups {
				h.w.submit(g)
			}
			select {
			case msg := <-h.replies:
				locked.Abort()
				t.Fatalf("answered %v before the commit", msg)
			case <-time.After(lockedWindow):
			}
			locked.Abort()
			for _, want := range tt.want {
				if got := <-h.replies; got != want {
					t.Fatalf("reply %v, want %v", got, want)
				}
				if !h.hasLease(1, "a") {
					t.Fatalf("reply %v arrived before its change is readable", want)
				}
			}
		})
	}
}

// lockedWindow is how long a test holds the index's write lock waiting to
// see whether the writer answers before it could have committed. A correct
// writer never answers inside the window; only a missed detection depends
// on its length.
const lockedWindow = 200 * time.Millisecond

// TestIndexWriterGroupsWhole: a reader never sees half of a group, however
// the writer batches groups into transactions.
func TestIndexWriterGroupsWhole(t *testing.T) {
	h := newWriterHarness(t)
	const groups = 2000
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var torn []string
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			seen := map[identity.NumericIdentity]int{}
			for _, l := range h.ix.IdentityLeases() {
				seen[l.ID]++
			}
			for id, n := range seen {
				if n != 2 {
					torn = append(torn, fmt.Sprintf("identity %d: %d of 2 leases", id, n))
				}
			}
		}
	}()
	for i := range groups {
		h.w.submit(writeGroup{ops: []indexOp{lease(i, "a"), lease(i, "b")}})
	}
	h.w.sync()
	close(stop)
	wg.Wait()
	if len(torn) > 0 {
		t.Fatalf("a snapshot showed part of a group: %v", torn[:min(len(torn), 5)])
	}
	if n := len(h.ix.IdentityLeases()); n != 2*groups {
		t.Fatalf("%d leases after sync, want %d", n, 2*groups)
	}
}

// TestIndexWriterLaterGroupWins: groups apply in the order handed over, so
// an owner's delete after its insert leaves the row out.
func TestIndexWriterLaterGroupWins(t *testing.T) {
	h := newWriterHarness(t)
	locked := h.ix.WriteTxn() // both groups land in one transaction
	h.w.submit(writeGroup{ops: []indexOp{lease(7, "a")}})
	del := lease(7, "a")
	del.Delete = true
	h.w.submit(writeGroup{ops: []indexOp{del}})
	locked.Abort()
	h.w.sync()
	if h.hasLease(7, "a") {
		t.Fatal("the later delete lost to the earlier insert")
	}
}

// TestIndexWriterStop: stop commits what is queued; a group handed over
// after stop is committed by its submitter; stop twice is harmless.
func TestIndexWriterStop(t *testing.T) {
	h := newWriterHarness(t)
	h.w.submit(writeGroup{ops: []indexOp{lease(1, "a")}, replies: reply("queued")})
	h.w.stop()
	if !h.hasLease(1, "a") {
		t.Fatal("stop dropped a queued group")
	}
	h.w.submit(writeGroup{ops: []indexOp{lease(2, "a")}, replies: reply("late")})
	if !h.hasLease(2, "a") {
		t.Fatal("a group after stop was not committed")
	}
	h.w.sync()
	h.w.stop()
	for _, want := range []string{"queued", "late"} {
		if got := <-h.replies; got != want {
			t.Fatalf("reply %v, want %v", got, want)
		}
	}
}

// TestBatcherKeepsNoHandedOverBuffer: after a flush the batcher's op
// buffer is never one the writer owns (and may hand to another owner),
// also when the flush carried replies only.
func TestBatcherKeepsNoHandedOverBuffer(t *testing.T) {
	h := newWriterHarness(t)
	b := newBatcher(h.w, slog.New(slog.DiscardHandler))
	b.scheduled = true // no actor: never send flushIndex
	owned := func() bool {
		if cap(b.ops) == 0 {
			return false
		}
		mine := &b.ops[:1][0]
		h.w.mu.Lock()
		defer h.w.mu.Unlock()
		for _, f := range h.w.free {
			if &f[:1][0] == mine {
				return true
			}
		}
		return false
	}
	for i := range 4 {
		locked := h.ix.WriteTxn() // the reply-only group queues behind the change
		b.put(nil, index.TableIdentityLeases, lease(i, "a").Obj)
		b.flush()
		b.scheduled = true
		b.replies = reply("only")
		b.flush()
		b.scheduled = true
		locked.Abort()
		h.w.sync()
		if owned() {
			t.Fatalf("round %d: the batcher writes into a buffer the writer recycled", i)
		}
	}
}

// TestIndexWriterStopWhileSubmitting: owners handing over groups while
// the writer stops neither panic nor see their groups reordered: each
// owner inserts and deletes its row, alternately, so a reordering leaves
// a row behind.
func TestIndexWriterStopWhileSubmitting(t *testing.T) {
	for round := range 20 {
		h := newWriterHarness(t)
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 200 {
					h.w.submit(writeGroup{ops: []indexOp{lease(g, "x")}})
					del := lease(g, "x")
					del.Delete = true
					h.w.submit(writeGroup{ops: []indexOp{del}})
				}
			}()
		}
		time.Sleep(time.Duration(round) * 100 * time.Microsecond)
		h.w.stop()
		wg.Wait()
		if n := len(h.ix.IdentityLeases()); n != 0 {
			t.Fatalf("round %d: %d rows left: groups committed out of order", round, n)
		}
	}
}
