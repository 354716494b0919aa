package actors

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// maxFQDNWaits bounds the DNS answers one endpoint holds at once
// (EndpointFQDN waiting for the policy actor, the ipcache and a
// regeneration); more are refused with ErrFQDNBusy.
const maxFQDNWaits = 64

// fqdnWaitLimit drops a wait whose answers never came (an actor
// restarted meanwhile): its asker gave up long before.
const fqdnWaitLimit = time.Minute

// fqdnWait is a DNS answer held until the endpoint's datapath has its
// addresses: the policy actor learned them (policy), the ipcache wrote
// their identities (ipcache), and the endpoint realised regeneration
// rev (0: none needed).
type fqdnWait struct {
	seq             uint64
	to              *actor.PID
	policy, ipcache bool
	rev             uint64
	err             error
	deadline        time.Time
}

// fqdnWaits are an endpoint's held DNS answers (nil for endpoints that
// never had one: heap per endpoint). Kept once made, so that seq never
// repeats: a late answer of a dropped wait matches no other.
type fqdnWaits struct {
	seq   uint64
	waits []*fqdnWait
}

// learnFQDN starts holding a DNS answer: the policy actor learns it,
// then the ipcache barrier and a regeneration (if the policy changed)
// release it. Never blocks: each step is a message.
func (a *endpointActor) learnFQDN(ctx actor.Context, msg *messages.EndpointFQDN) {
	to := ctx.Sender()
	var err error
	switch {
	case a.deleting():
		err = ErrEndpointDeleting
	case a.ep.Identity == identity.IdentityUnknown:
		err = ErrFQDNNoIdentity
	}
	if err != nil {
		ctx.Respond(&messages.EndpointFQDNResult{Err: fmt.Errorf("endpoint %d: dns answer for %s: %w", a.ep.ID, msg.Name, err)})
		return
	}
	if a.fqdn == nil {
		a.fqdn = &fqdnWaits{}
	}
	a.sweepFQDN(ctx)
	if len(a.fqdn.waits) >= maxFQDNWaits {
		ctx.Respond(&messages.EndpointFQDNResult{Err: fmt.Errorf("endpoint %d: %d dns answers held: %w", a.ep.ID, len(a.fqdn.waits), ErrFQDNBusy)})
		return
	}
	a.fqdn.seq++
	w := &fqdnWait{seq: a.fqdn.seq, to: to, policy: true, ipcache: true, deadline: time.Now().Add(fqdnWaitLimit)}
	a.fqdn.waits = append(a.fqdn.waits, w)
	ctx.Request(a.deps.policy, &messages.PolicyFQDNLearn{Seq: w.seq, Endpoint: a.ep.ID, Identity: a.ep.Identity,
		Name: msg.Name, IPs: msg.IPs, TTL: msg.TTL})
}

// fqdnLearned continues a wait once the policy actor learned the answer:
// the ipcache barrier goes after the CIDR changes the policy actor sent
// (same mailbox, sent before its answer), and a regeneration is owed
// unless the endpoint realised exactly the policy that selects them.
func (a *endpointActor) fqdnLearned(ctx actor.Context, msg *messages.PolicyFQDNLearned) {
	w := a.fqdnWait(msg.Seq)
	if w == nil {
		return
	}
	w.policy = false
	if msg.Err != nil {
		w.err, w.ipcache = msg.Err, false
		a.fqdnMaybeDone(ctx, w)
		return
	}
	ctx.Request(a.deps.ipcache, &messages.IPCacheBarrier{Seq: w.seq})
	if msg.Policy != a.ep.Policy || a.regen.running || a.regen.want != wantNone {
		a.requestPolicyRegen(ctx)
		w.rev = a.ep.DesiredRevision
	}
	a.fqdnMaybeDone(ctx, w)
}

func (a *endpointActor) fqdnBarrier(ctx actor.Context, msg *messages.IPCacheBarrierDone) {
	if w := a.fqdnWait(msg.Seq); w != nil {
		w.ipcache = false
		a.fqdnMaybeDone(ctx, w)
	}
}

// fqdnRegenEnded releases the waits the regeneration that just ended
// (revision rev, err nil on success) covers.
func (a *endpointActor) fqdnRegenEnded(ctx actor.Context, rev uint64, err error) {
	if a.fqdn == nil {
		return
	}
	for _, w := range append([]*fqdnWait(nil), a.fqdn.waits...) {
		if w.rev != 0 && w.rev <= rev {
			w.rev = 0
			if err != nil {
				w.err = err
			}
			a.fqdnMaybeDone(ctx, w)
		}
	}
}

// failFQDN answers every wait with err (the endpoint is deleted).
func (a *endpointActor) failFQDN(ctx actor.Context, err error) {
	if a.fqdn == nil {
		return
	}
	for _, w := range a.fqdn.waits {
		ctx.Send(w.to, &messages.EndpointFQDNResult{Err: fmt.Errorf("endpoint %d: %w", a.ep.ID, err)})
	}
	a.fqdn = nil
}

func (a *endpointActor) fqdnWait(seq uint64) *fqdnWait {
	if a.fqdn == nil {
		return nil
	}
	for _, w := range a.fqdn.waits {
		if w.seq == seq {
			return w
		}
	}
	return nil
}

// fqdnMaybeDone answers w once nothing holds it any more.
func (a *endpointActor) fqdnMaybeDone(ctx actor.Context, w *fqdnWait) {
	if w.policy || w.ipcache || w.rev != 0 {
		return
	}
	ctx.Send(w.to, &messages.EndpointFQDNResult{Err: w.err})
	a.removeFQDNWait(w)
}

func (a *endpointActor) removeFQDNWait(w *fqdnWait) {
	ws := a.fqdn.waits
	for i := range ws {
		if ws[i] == w {
			a.fqdn.waits = append(ws[:i], ws[i+1:]...)
			break
		}
	}
}

// sweepFQDN drops waits whose answers never came.
func (a *endpointActor) sweepFQDN(ctx actor.Context) {
	now := time.Now()
	for _, w := range append([]*fqdnWait(nil), a.fqdn.waits...) {
		if now.After(w.deadline) {
			ctx.Send(w.to, &messages.EndpointFQDNResult{Err: fmt.Errorf("endpoint %d: dns answer not realised: %w", a.ep.ID, ErrFQDNBusy)})
			a.removeFQDNWait(w)
		}
	}
}
