package actors

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// asker answers the front door's waits (System.ask) without futures, as
// the actors' requester does (request.go): one process registered for the system's
// life is every ask's sender, with the ask's number in the PID's
// RequestId, and hands each answer to the channel its asker waits on. A
// protoactor future per API call registered and removed a process, and
// armed a timer and a condition variable.
type asker struct {
	id string // the process's ID in the registry

	mu      sync.Mutex
	waiting map[uint32]chan any
	stopped bool
}

var _ actor.Process = (*asker)(nil)

// askerID is the asker's ID in the process registry.
const askerID = "agent-asks"

func newAsker(sys *actor.ActorSystem) *asker {
	a := &asker{id: askerID, waiting: make(map[uint32]chan any)}
	sys.ProcessRegistry.Add(a, askerID)
	return a
}

// SendUserMessage implements actor.Process: an answer to ask pid.RequestId.
func (a *asker) SendUserMessage(pid *actor.PID, msg any) {
	a.mu.Lock()
	ch := a.waiting[pid.RequestId]
	delete(a.waiting, pid.RequestId)
	a.mu.Unlock()
	if ch != nil {
		ch <- actor.UnwrapEnvelopeMessage(msg) // buffered: never blocks
	}
}

// SendSystemMessage implements actor.Process.
func (a *asker) SendSystemMessage(*actor.PID, any) {}

// Stop implements actor.Process.
func (a *asker) Stop(*actor.PID) {}

// askWait is what an ask waits with: its answer channel and its timer,
// reused from askWaits by later asks (an API call allocated both).
type askWait struct {
	ch    chan any // capacity 1, empty when pooled
	timer *time.Timer
}

var askWaits sync.Pool

// ask sends msg to pid and waits for the answer, at most timeout.
func (a *asker) ask(sys *actor.ActorSystem, pid *actor.PID, msg any, timeout time.Duration) (any, error) {
	id := nextRequestID()
	w, _ := askWaits.Get().(*askWait)
	if w == nil {
		w = &askWait{ch: make(chan any, 1)}
	}
	a.mu.Lock()
	if a.stopped {
		a.mu.Unlock()
		askWaits.Put(w)
		return nil, fmt.Errorf("ask %s: %w", pid.Id, actor.ErrDeadLetter)
	}
	a.waiting[id] = w.ch
	a.mu.Unlock()
	sys.Root.RequestWithCustomSender(pid, msg, &actor.PID{Address: sys.Address(), Id: a.id, RequestId: id})
	if w.timer == nil {
		w.timer = time.NewTimer(timeout)
	} else {
		w.timer.Reset(timeout) // stopped, and since Go 1.23 nothing stale in C
	}
	select {
	case res := <-w.ch:
		w.timer.Stop()
		askWaits.Put(w)
		if _, dead := res.(*actor.DeadLetterResponse); dead {
			return nil, actor.ErrDeadLetter
		}
		return res, nil
	case <-w.timer.C:
		a.mu.Lock()
		_, mine := a.waiting[id]
		delete(a.waiting, id)
		a.mu.Unlock()
		if mine { // no answer is on its way into w.ch
			askWaits.Put(w)
		}
		return nil, fmt.Errorf("ask %s: %w", pid.Id, context.DeadlineExceeded)
	}
}

// stop answers every waiting ask as a dead letter (a stopped actor drops
// its mailbox unanswered) and refuses new ones.
func (a *asker) stop() {
	a.mu.Lock()
	waiting := a.waiting
	a.waiting, a.stopped = map[uint32]chan any{}, true
	a.mu.Unlock()
	for _, ch := range waiting {
		ch <- &actor.DeadLetterResponse{}
	}
}
