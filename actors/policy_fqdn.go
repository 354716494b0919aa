package actors

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// fqdnState is the policy actor's DNS cache (names learned from the
// answers the DNS proxy saw, per endpoint) and its expiry timer.
type fqdnState struct {
	cache *fqdn.Cache
	timer *time.Timer
	at    time.Time // when timer fires
}

// fqdnExpire makes the policy actor drop the learned names whose TTL
// ended.
type fqdnExpire struct{}

func (a *policyActor) fqdnCache() *fqdn.Cache {
	if a.fqdn.cache == nil {
		a.fqdn.cache = fqdn.NewCache(a.cfg.FQDN)
	}
	return a.fqdn.cache
}

// learnFQDN records a DNS answer of an endpoint: the name's addresses
// over all endpoints go to the repository, whose CIDR identities go to
// the ipcache and whose policy changes regenerate the endpoints (the
// asking one regenerates itself and waits for it).
func (a *policyActor) learnFQDN(ctx actor.Context, msg *messages.PolicyFQDNLearn) {
	c := a.fqdnCache()
	changed, err := c.Learn(uint16(msg.Endpoint), msg.Name, msg.IPs, msg.TTL, time.Now())
	if err != nil {
		ctx.Respond(&messages.PolicyFQDNLearned{Seq: msg.Seq, Err: fmt.Errorf("learn %s: %w", msg.Name, err)})
		return
	}
	if changed {
		res := a.repo.SetFQDN(msg.Name, c.IPs(msg.Name))
		a.applyExcept(ctx, res, msg.Endpoint)
	}
	a.armFQDN(ctx)
	ctx.Respond(&messages.PolicyFQDNLearned{Seq: msg.Seq, Policy: a.mapState(msg.Identity)})
}

// expireFQDN drops the expired names' addresses (the connections to
// them are denied from then on) and re-arms the timer.
func (a *policyActor) expireFQDN(ctx actor.Context) {
	a.fqdn.timer, a.fqdn.at = nil, time.Time{}
	c := a.fqdnCache()
	for _, name := range c.Expire(time.Now()) {
		a.setFQDN(ctx, name)
	}
	a.armFQDN(ctx)
}

// forgetFQDN drops a deleted endpoint's names.
func (a *policyActor) forgetFQDN(ctx actor.Context, ep endpoint.ID) {
	if a.fqdn.cache == nil {
		return
	}
	for _, name := range a.fqdn.cache.Forget(uint16(ep)) {
		a.setFQDN(ctx, name)
	}
}

func (a *policyActor) setFQDN(ctx actor.Context, name string) {
	ips := a.fqdn.cache.IPs(name)
	res := a.repo.SetFQDN(name, ips)
	a.apply(ctx, res)
	if len(res.CIDRDeletes) > 0 {
		a.deps.events.Publish(events.Event{Type: events.FQDNExpired,
			Message: fmt.Sprintf("%s: %d addresses left, %d removed from the ipcache", name, len(ips), len(res.CIDRDeletes))})
	}
}

// armFQDN arms the expiry timer for the earliest expiry, unless it is
// armed for that time or earlier.
func (a *policyActor) armFQDN(ctx actor.Context) {
	next, ok := a.fqdnCache().Next()
	if !ok || (a.fqdn.timer != nil && !a.fqdn.at.After(next)) {
		return
	}
	a.stopFQDNTimer()
	self, system := ctx.Self(), ctx.ActorSystem()
	a.fqdn.at = next
	a.fqdn.timer = time.AfterFunc(time.Until(next), func() { system.Root.Send(self, &fqdnExpire{}) })
}

func (a *policyActor) stopFQDNTimer() {
	if a.fqdn.timer != nil {
		a.fqdn.timer.Stop()
		a.fqdn.timer = nil
	}
}

// applyExcept is apply without telling endpoint skip to regenerate (it
// regenerates itself and waits for it).
func (a *policyActor) applyExcept(ctx actor.Context, res policy.Result, skip endpoint.ID) {
	a.skip = skip
	a.apply(ctx, res)
	a.skip = 0
}
