package actors

import (
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// An endpoint actor's requests to the IPAM, identity, policy and datapath
// pool actors are answered without futures. A protoactor future registers
// a process per request (a registry insert and removal, a condition
// variable, a timer) and ReenterAfter wraps the continuation twice: with
// ~9 requests per endpoint lifecycle that was ~7% of the simulator's CPU.
// Instead each endpoint actor registers one answers process for its life
// (answersID), requests name it as their sender with a request number in
// the PID's RequestId, and the process forwards every answer, tagged
// with that number, into the actor's mailbox. The responders are
// unchanged: they answer ctx.Sender() as before.

// requestIDs numbers requests process-wide, so an answer meant for an
// earlier incarnation (whose pending requests a restart drops) or a timed
// out request never matches a pending one.
var requestIDs atomic.Uint32

func nextRequestID() uint32 {
	for {
		if id := requestIDs.Add(1); id != 0 {
			return id
		}
	}
}

// pendingRequest is a request an endpoint actor waits for; the actor's
// pending requests form a list (rarely more than two).
type pendingRequest struct {
	id    uint32
	timer *time.Timer
	cont  func(res any, err error)
	next  *pendingRequest
}

// requestAnswer is an answer (or the timeout) of request id, delivered to
// the endpoint actor itself.
type requestAnswer struct {
	id  uint32
	msg any
	err error
}

// answersProcess forwards the answers addressed to an endpoint actor's
// answers PID into the actor's mailbox.
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

// answersSuffix ends the ID of an endpoint actor's answers process.
const answersSuffix = "$answers"

// registerAnswers registers the actor's answers process; a restarted
// incarnation finds it registered.
func (a *endpointActor) registerAnswers(ctx actor.Context) {
	self := ctx.Self()
	a.answersID = self.Id + answersSuffix
	sys := ctx.ActorSystem()
	sys.ProcessRegistry.Add(&answersProcess{actor: self, root: sys.Root}, a.answersID)
}

// unregisterAnswers removes the answers process once the actor stopped.
func (a *endpointActor) unregisterAnswers(ctx actor.Context) {
	if a.answersID != "" {
		ctx.ActorSystem().ProcessRegistry.Remove(&actor.PID{Address: ctx.Self().Address, Id: a.answersID})
	}
}

// request sends msg to pid and continues with cont once it is answered,
// or with actor.ErrTimeout after timeout. An incarnation that restarted
// meanwhile never continues: its successor does not know the request.
func (a *endpointActor) request(ctx actor.Context, pid *actor.PID, msg any, timeout time.Duration, cont func(res any, err error)) {
	id := nextRequestID()
	self, root := ctx.Self(), ctx.ActorSystem().Root
	r := &pendingRequest{id: id, cont: cont, next: a.requests}
	r.timer = time.AfterFunc(timeout, func() { root.Send(self, &requestAnswer{id: id, err: actor.ErrTimeout}) })
	a.requests = r
	ctx.RequestWithCustomSender(pid, msg, &actor.PID{Address: self.Address, Id: a.answersID, RequestId: id})
	a.setOp(endpointOpName(msg))
}

// answered continues the request msg answers; an answer nobody waits for
// (timed out, or meant for an earlier incarnation) is dropped.
func (a *endpointActor) answered(msg *requestAnswer) {
	for p := &a.requests; *p != nil; p = &(*p).next {
		if r := *p; r.id == msg.id {
			*p = r.next
			r.timer.Stop()
			a.setOp("")
			r.cont(msg.msg, msg.err)
			return
		}
	}
}

// dropRequests stops the timers of the pending requests and forgets them
// (restart, stop).
func (a *endpointActor) dropRequests() {
	for r := a.requests; r != nil; r = r.next {
		r.timer.Stop()
	}
	a.requests = nil
}
