package actors

import (
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// MailboxStats counts an actor's user messages; protoactor's own mailbox
// gauge is never exported, so queue depth comes from this middleware.
type MailboxStats struct {
	posted   atomic.Int64
	received atomic.Int64
}

var _ actor.MailboxMiddleware = (*MailboxStats)(nil)

// MailboxStarted implements actor.MailboxMiddleware.
func (m *MailboxStats) MailboxStarted() {}

// MessagePosted implements actor.MailboxMiddleware.
func (m *MailboxStats) MessagePosted(any) { m.posted.Add(1) }

// MessageReceived implements actor.MailboxMiddleware.
func (m *MailboxStats) MessageReceived(any) { m.received.Add(1) }

// MailboxEmpty implements actor.MailboxMiddleware.
func (m *MailboxStats) MailboxEmpty() {}

// Depth is the number of user messages waiting.
func (m *MailboxStats) Depth() int64 { return m.posted.Load() - m.received.Load() }

// Processed is the number of user messages taken from the mailbox.
func (m *MailboxStats) Processed() int64 { return m.received.Load() }

// unboundedWithStats returns an unbounded mailbox counted by stats. The
// project never uses BoundedDropping (it spins) nor Bounded (it
// busy-waits senders); back-pressure is applied at the API instead.
func unboundedWithStats(stats *MailboxStats) actor.MailboxProducer {
	return actor.Unbounded(stats)
}
