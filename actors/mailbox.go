package actors

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// MailboxStats counts an actor's messages (user and system, as
// protoactor's mailbox middleware does); protoactor's own mailbox gauge
// is never exported, so queue depth comes from these counters.
type MailboxStats struct {
	posted   atomic.Int64
	received atomic.Int64
}

// Depth is the number of messages waiting.
func (m *MailboxStats) Depth() int64 { return m.posted.Load() - m.received.Load() }

// Processed is the number of messages taken from the mailbox.
func (m *MailboxStats) Processed() int64 { return m.received.Load() }

// unboundedWithStats returns an unbounded mailbox counted by stats. The
// project never uses BoundedDropping (it spins) nor Bounded (it
// busy-waits senders); back-pressure is applied at the API instead.
func unboundedWithStats(stats *MailboxStats) actor.MailboxProducer {
	return func() actor.Mailbox { return newMailbox(stats) }
}

// Scheduler states of a mailbox.
const (
	mailboxIdle int32 = iota
	mailboxRunning
)

// mailbox is protoactor's default unbounded mailbox (actor.Unbounded)
// with the same order, suspension, throughput and failure escalation,
// minus three costs its profile showed on every message: the
// method-value closure allocated each time an idle mailbox is scheduled
// (about 33 per simulated lifecycle), a list node allocated for every
// system message, and the middleware calls through an interface for the
// counters. Both queues are slices under one mutex: each actor has one
// consumer and few producers.
type mailbox struct {
	mu   sync.Mutex
	user fifo // guarded by mu
	sys  fifo // guarded by mu

	userCount  atomic.Int32
	sysCount   atomic.Int32
	status     atomic.Int32
	suspended  atomic.Bool
	invoker    actor.MessageInvoker
	dispatcher actor.Dispatcher
	stats      *MailboxStats // nil: not counted
	process    func()        // processMessages, made once
}

var _ actor.Mailbox = (*mailbox)(nil)

func newMailbox(stats *MailboxStats) *mailbox {
	m := &mailbox{stats: stats}
	m.process = m.processMessages
	return m
}

// PostUserMessage implements actor.Mailbox. A MessageBatch (bare or in an
// envelope) posts its messages and then itself, as protoactor's does.
func (m *mailbox) PostUserMessage(message any) {
	if batch, ok := message.(actor.MessageBatch); ok {
		for _, msg := range batch.GetMessages() {
			m.PostUserMessage(msg)
		}
	}
	if env, ok := message.(*actor.MessageEnvelope); ok {
		if batch, ok := env.Message.(actor.MessageBatch); ok {
			for _, msg := range batch.GetMessages() {
				m.PostUserMessage(msg)
			}
		}
	}
	m.posted()
	m.mu.Lock()
	m.user.push(message)
	m.mu.Unlock()
	m.userCount.Add(1)
	m.schedule()
}

// PostSystemMessage implements actor.Mailbox.
func (m *mailbox) PostSystemMessage(message any) {
	m.posted()
	m.mu.Lock()
	m.sys.push(message)
	m.mu.Unlock()
	m.sysCount.Add(1)
	m.schedule()
}

func (m *mailbox) posted() {
	if m.stats != nil {
		m.stats.posted.Add(1)
	}
}

func (m *mailbox) received() {
	if m.stats != nil {
		m.stats.received.Add(1)
	}
}

// RegisterHandlers implements actor.Mailbox.
func (m *mailbox) RegisterHandlers(invoker actor.MessageInvoker, dispatcher actor.Dispatcher) {
	m.invoker, m.dispatcher = invoker, dispatcher
}

// Start implements actor.Mailbox.
func (m *mailbox) Start() {}

// UserMessageCount implements actor.Mailbox.
func (m *mailbox) UserMessageCount() int { return int(m.userCount.Load()) }

func (m *mailbox) schedule() {
	if m.status.CompareAndSwap(mailboxIdle, mailboxRunning) {
		m.dispatcher.Schedule(m.process)
	}
}

// processMessages runs the mailbox until it is empty (or suspended with
// only user messages left), then goes idle unless a message arrived
// meanwhile.
func (m *mailbox) processMessages() {
	for {
		m.run()
		m.status.Store(mailboxIdle)
		sys, user := m.sysCount.Load(), m.userCount.Load()
		if sys == 0 && (m.suspended.Load() || user == 0) {
			return
		}
		if !m.status.CompareAndSwap(mailboxIdle, mailboxRunning) {
			return // a sender scheduled it again
		}
	}
}

// run processes system messages first, then user messages, yielding
// after every Throughput messages; a panic escalates to the supervisor.
func (m *mailbox) run() {
	var msg any
	defer func() {
		if r := recover(); r != nil {
			m.invoker.EscalateFailure(r, msg)
		}
	}()
	i, t := 0, m.dispatcher.Throughput()
	for {
		if i > t {
			i = 0
			runtime.Gosched()
		}
		i++
		if msg = m.pop(&m.sys); msg != nil {
			m.sysCount.Add(-1)
			switch msg.(type) {
			case *actor.SuspendMailbox:
				m.suspended.Store(true)
			case *actor.ResumeMailbox:
				m.suspended.Store(false)
			default:
				m.invoker.InvokeSystemMessage(msg)
			}
			m.received()
			continue
		}
		if m.suspended.Load() {
			return
		}
		if msg = m.pop(&m.user); msg == nil {
			return
		}
		m.userCount.Add(-1)
		m.invoker.InvokeUserMessage(msg)
		m.received()
	}
}

func (m *mailbox) pop(q *fifo) any {
	m.mu.Lock()
	msg := q.pop()
	m.mu.Unlock()
	return msg
}

// fifo is a queue in a slice: pop moves a head index, and the slice is
// reused from its start once it is empty (a mailbox drains often), or
// compacted when the consumed head is most of it.
type fifo struct {
	buf  []any
	head int
}

func (q *fifo) push(v any) {
	if q.head > 64 && q.head*2 > len(q.buf) {
		n := copy(q.buf, q.buf[q.head:])
		clear(q.buf[n:])
		q.buf, q.head = q.buf[:n], 0
	}
	q.buf = append(q.buf, v)
}

// pop returns the oldest value, nil when empty.
func (q *fifo) pop() any {
	if q.head == len(q.buf) {
		return nil
	}
	v := q.buf[q.head]
	q.buf[q.head] = nil
	q.head++
	if q.head == len(q.buf) {
		q.buf, q.head = q.buf[:0], 0
	}
	return v
}
