package actors

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
)

// requester is the one way an actor waits for an answer: from another
// actor, from the datapath pool (inPool) or from a goroutine outside the
// actor system such as the state store (await). It never blocks: the
// answer comes back as a requestAnswer message in the actor's own
// mailbox, and the actor continues in the request's continuation.
//
// Each actor registers one answers process for its life (answersID);
// a request names it as its sender with the request's number in the
// PID's RequestId, and the process forwards every answer, tagged with
// that number, into the actor's mailbox. Responders are unchanged: they
// answer ctx.Sender().
//
// The stale-answer guard: request numbers are process-wide and a restart
// drops the pending requests (drop), so an answer meant for an earlier
// incarnation, or for a request that timed out, matches nothing and is
// dropped.
type requester struct {
	answersID string
	pending   *pendingRequest // rarely more than two
	// timer bounds the pending requests: one per requester, armed for
	// the earliest deadline (or earlier: an answered request does not
	// disarm it), instead of a timer allocated, started and stopped per
	// request (about 12 per simulated lifecycle). When it fires it sends
	// the actor a requestAnswer with id 0, which times out the requests
	// past their deadline, one per such message.
	timer *time.Timer
	armed time.Time // when timer fires; zero: not armed
}

// requestIDs numbers requests process-wide.
var requestIDs atomic.Uint32

func nextRequestID() uint32 {
	for {
		if id := requestIDs.Add(1); id != 0 {
			return id
		}
	}
}

// pendingRequest is a request an actor waits for.
type pendingRequest struct {
	id       uint32
	deadline time.Time // zero: no timeout
	cont     func(res any, err error)
	next     *pendingRequest
}

// requestAnswer is an answer (or the timeout) of request id, delivered to
// the actor itself; id 0 (never a request's) is the requester's timer.
type requestAnswer struct {
	id  uint32
	msg any
	err error
}

// answersProcess forwards the answers addressed to an actor's answers PID
// into the actor's mailbox.
type answersProcess struct {
	actor *actor.PID
	root  *actor.RootContext
}

var _ actor.Process = (*answersProcess)(nil)

// SendUserMessage implements actor.Process.
func (p *answersProcess) SendUserMessage(pid *actor.PID, msg any) {
	p.root.Send(p.actor, &requestAnswer{id: pid.RequestId, msg: actor.UnwrapEnvelopeMessage(msg)})
}

// SendSystemMessage implements actor.Process.
func (p *answersProcess) SendSystemMessage(*actor.PID, any) {}

// Stop implements actor.Process.
func (p *answersProcess) Stop(*actor.PID) {}

// answersSuffix ends the ID of an actor's answers process.
const answersSuffix = "$answers"

// register registers the actor's answers process (in Started); a
// restarted incarnation, or an actor whose parent registered it at spawn
// (registerAnswers), finds it registered.
func (r *requester) register(ctx actor.Context) {
	r.answersID = registerAnswers(ctx.ActorSystem(), ctx.Self())
}

// registerAnswers registers the answers process of actor self, if it is
// not yet, and returns its ID.
func registerAnswers(sys *actor.ActorSystem, self *actor.PID) string {
	id := self.Id + answersSuffix
	sys.ProcessRegistry.Add(&answersProcess{actor: self, root: sys.Root}, id)
	return id
}

// unregister removes the answers process once the actor stopped.
func (r *requester) unregister(ctx actor.Context) {
	if r.answersID != "" {
		ctx.ActorSystem().ProcessRegistry.Remove(&actor.PID{Address: ctx.Self().Address, Id: r.answersID})
	}
}

// add registers a pending request; timeout 0 means none.
func (r *requester) add(ctx actor.Context, timeout time.Duration, cont func(any, error)) uint32 {
	id := nextRequestID()
	p := &pendingRequest{id: id, cont: cont, next: r.pending}
	r.pending = p
	if timeout > 0 {
		p.deadline = time.Now().Add(timeout)
		if r.armed.IsZero() || p.deadline.Before(r.armed) {
			r.arm(ctx, p.deadline)
		}
	}
	return id
}

// arm sets the timer to fire at deadline.
func (r *requester) arm(ctx actor.Context, deadline time.Time) {
	r.armed = deadline
	if r.timer == nil {
		self, root := ctx.Self(), ctx.ActorSystem().Root
		r.timer = time.AfterFunc(time.Until(deadline), func() { root.Send(self, &requestAnswer{}) })
		return
	}
	r.timer.Reset(time.Until(deadline))
}

// expire handles the timer's message: the request with the earliest
// past deadline, if any, is removed and returned, and the timer is armed
// again for the earliest deadline left (at once if another one passed).
func (r *requester) expire() *pendingRequest {
	r.armed = time.Time{}
	now := time.Now()
	var expired, next *pendingRequest
	for p := &r.pending; *p != nil; {
		q := *p
		switch {
		case q.deadline.IsZero():
		case expired == nil && !q.deadline.After(now):
			expired, *p = q, q.next
			continue
		case next == nil || q.deadline.Before(next.deadline):
			next = q
		}
		p = &q.next
	}
	switch {
	case next != nil:
		r.armed = next.deadline
		r.timer.Reset(time.Until(next.deadline))
	case r.pending == nil:
		r.timer = nil // fired and not needed: an idle actor keeps no timer
	}
	return expired
}

// request sends msg to pid and continues with cont once it is answered,
// or with actor.ErrTimeout after timeout.
func (r *requester) request(ctx actor.Context, pid *actor.PID, msg any, timeout time.Duration, cont func(res any, err error)) {
	ctx.RequestWithCustomSender(pid, msg, r.replyTo(ctx, timeout, cont))
}

// replyTo returns the address another actor answers at, for a message
// that names its own reply address (a messages.Reply): the actor
// continues with cont when something is sent there, or with
// actor.ErrTimeout after timeout (0: none).
func (r *requester) replyTo(ctx actor.Context, timeout time.Duration, cont func(res any, err error)) *actor.PID {
	id := r.add(ctx, timeout, cont)
	return &actor.PID{Address: ctx.Self().Address, Id: r.answersID, RequestId: id}
}

// await hands reply to submit, which passes it to code outside the actor
// system that calls it exactly once (from any goroutine, without
// blocking); the actor continues with cont when it is called, or with
// actor.ErrTimeout after timeout (0: none).
func (r *requester) await(ctx actor.Context, timeout time.Duration, submit func(reply func(any, error)), cont func(res any, err error)) {
	id := r.add(ctx, timeout, cont)
	self, root := ctx.Self(), ctx.ActorSystem().Root
	submit(func(res any, err error) { root.Send(self, &requestAnswer{id: id, msg: res, err: err}) })
}

// inPool runs work in the datapath pool and continues with its value and
// error (the pool's, the timeout's or the work's own). The wait is
// bounded by the work's timeout (the pool's default when 0) plus slack.
func (r *requester) inPool(ctx actor.Context, d *endpointDeps, work *messages.DatapathWork, cont func(value any, err error)) {
	timeout := work.Timeout
	if timeout == 0 {
		timeout = d.cfg.DatapathTimeout
	}
	r.request(ctx, d.pool, work, timeout+d.cfg.RequestTimeout, func(res any, err error) {
		if err != nil {
			cont(nil, fmt.Errorf("%s: %w", work.Op, err))
			return
		}
		dr, ok := res.(*messages.DatapathResult)
		if !ok {
			cont(nil, fmt.Errorf("%s: unexpected answer %T", work.Op, res))
			return
		}
		cont(dr.Value, dr.Err)
	})
}

// answered continues the request msg answers; an answer nobody waits
// for is dropped.
func (r *requester) answered(msg *requestAnswer) {
	if cont := r.take(msg); cont != nil {
		cont(msg.msg, msg.err)
	}
}

// take removes the request msg answers and returns its continuation (nil
// when no request matches). For the timer's message it is the
// continuation of a request past its deadline, and msg's error becomes
// actor.ErrTimeout.
func (r *requester) take(msg *requestAnswer) func(any, error) {
	if msg.id == 0 {
		if q := r.expire(); q != nil {
			msg.msg, msg.err = nil, actor.ErrTimeout
			return q.cont
		}
		return nil
	}
	for p := &r.pending; *p != nil; p = &(*p).next {
		if q := *p; q.id == msg.id {
			*p = q.next
			return q.cont
		}
	}
	return nil
}

// drop stops the timer and forgets the pending requests (restart,
// stop): their answers will match nothing.
func (r *requester) drop() {
	if r.timer != nil {
		r.timer.Stop()
	}
	r.armed = time.Time{}
	r.pending = nil
}
