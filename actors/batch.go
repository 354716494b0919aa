package actors

import (
	"errors"
	"log/slog"

	"github.com/asynkron/protoactor-go/actor"
	memdb "github.com/hashicorp/go-memdb"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/index"
)

// flushIndex is the message a batcher sends to its own actor to commit.
type flushIndex struct{}

// indexOp is one queued index change: insert Obj, or delete Obj when Delete.
type indexOp struct {
	Table  string
	Obj    any
	Delete bool
}

// batcher groups an actor's index writes per mailbox pass: the first
// queued change sends flushIndex to self, and everything queued before that
// message is processed goes to the shared index writer as one group,
// committed whole (see indexWriter). Replies wait for the commit so
// callers read their writes. Not goroutine safe: owned by one actor.
type batcher struct {
	ix *index.Index
	w  *indexWriter
	// latest maps a row key to its op in ops, so that a row changed
	// several times in one batch is written once (its last version).
	latest    map[rowKey]int
	log       *slog.Logger
	ops       []indexOp
	replies   []messages.Reply
	scheduled bool
}

func newBatcher(w *indexWriter, log *slog.Logger) batcher {
	return batcher{ix: w.ix, w: w, log: log}
}

// rowKey identifies a row for de-duplication within a batch.
type rowKey struct {
	table string
	key   any
}

func (b *batcher) put(ctx actor.Context, table string, obj any) {
	b.add(ctx, indexOp{Table: table, Obj: obj}, nil)
}

func (b *batcher) del(ctx actor.Context, table string, obj any) {
	b.add(ctx, indexOp{Table: table, Obj: obj, Delete: true}, nil)
}

// putKeyed and delKeyed replace an earlier op on the same row in this batch.
func (b *batcher) putKeyed(ctx actor.Context, table string, key, obj any) {
	b.add(ctx, indexOp{Table: table, Obj: obj}, key)
}

func (b *batcher) delKeyed(ctx actor.Context, table string, key, obj any) {
	b.add(ctx, indexOp{Table: table, Obj: obj, Delete: true}, key)
}

func (b *batcher) add(ctx actor.Context, op indexOp, key any) {
	if key != nil {
		k := rowKey{op.Table, key}
		if i, ok := b.latest[k]; ok {
			b.ops[i] = op
			return
		}
		if b.latest == nil {
			b.latest = make(map[rowKey]int)
		}
		b.latest[k] = len(b.ops)
	}
	b.ops = append(b.ops, op)
	b.schedule(ctx)
}

// reply queues an answer to send after the next commit.
func (b *batcher) reply(ctx actor.Context, to *actor.PID, msg any) {
	if to == nil {
		return
	}
	b.replies = append(b.replies, messages.Reply{To: to, Message: msg})
	b.schedule(ctx)
}

func (b *batcher) schedule(ctx actor.Context) {
	if !b.scheduled {
		b.scheduled = true
		ctx.Send(ctx.Self(), &flushIndex{})
	}
}

// flush hands the queued changes and replies to the index writer.
func (b *batcher) flush() {
	b.scheduled = false
	if len(b.ops) == 0 && len(b.replies) == 0 {
		return
	}
	var ops []indexOp // a group's ops belong to the writer from now on
	if len(b.ops) > 0 {
		ops, b.ops = b.ops, b.w.opsBuffer()
		clear(b.latest)
	}
	b.w.submit(writeGroup{ops: ops, replies: b.replies})
	b.replies = nil
}

// flushOnPanic, deferred at the top of an owner's Receive, hands the
// queued changes to the index writer when the handler panics, then lets
// the panic go on to the supervisor. The root's strategy restarts the
// owner only once everything handed over before is committed
// (commitThenRestart), so the next incarnation rebuilds from what its
// predecessor wrote, and nothing waits.
func (b *batcher) flushOnPanic() {
	if r := recover(); r != nil {
		b.flush()
		panic(r)
	}
}

func isNotFound(err error) bool {
	return errors.Is(err, memdb.ErrNotFound)
}
