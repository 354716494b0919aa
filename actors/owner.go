package actors

import "github.com/asynkron/protoactor-go/actor"

// owner is what the node-wide owner actors (ipcache, nodes, services,
// policy) share: the requester they wait with, the batch of their index
// writes, and the lifecycle messages around both, handled here once
// instead of in every Receive (protoactor's receive-middleware idea,
// kept as a plain call so the actor's type switch stays one place).
type owner struct {
	req   requester
	batch batcher

	// The actor's hooks: onStart rebuilds its state from the index
	// (Started, also after a restart); onStop stops its timers (Stopping
	// and Restarting: an armed timer's closure would keep the system
	// reachable); onRestart, when set, runs before the last flush of a
	// failed incarnation.
	onStart   func(ctx actor.Context)
	onStop    func()
	onRestart func(ctx actor.Context)
}

// lifecycle handles ctx's message if it is a lifecycle message, a
// request's answer or an index flush, and reports whether it did; the
// actor handles everything else itself.
func (o *owner) lifecycle(ctx actor.Context) bool {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		o.req.register(ctx)
		o.onStart(ctx)
	case *actor.Stopped:
		o.req.unregister(ctx)
	case *requestAnswer:
		o.req.answered(msg)
	case *actor.Stopping:
		o.req.drop()
		o.onStop()
		o.batch.flush()
	case *actor.Restarting:
		o.req.drop()
		o.onStop()
		if o.onRestart != nil {
			o.onRestart(ctx)
		}
		o.batch.flush()
	case *flushIndex:
		o.batch.flush()
	default:
		return false
	}
	return true
}
