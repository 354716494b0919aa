package actors

import (
	"context"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/restore"
)

// fqdnState is the policy actor's DNS cache (names learned from the
// answers the DNS proxy saw, per endpoint), its expiry timer and the
// state of its file (PolicyConfig.FQDNDir).
type fqdnState struct {
	cache *fqdn.Cache
	timer *time.Timer
	at    time.Time // when timer fires
	// writing: a write is in the pool; dirty: the cache changed since
	// the last write began; saveTimer: the next write waits for
	// FQDNWriteGap after the last one began (lastWrite).
	writing, dirty bool
	saveTimer      *time.Timer
	lastWrite      time.Time
}

// fqdnExpire makes the policy actor drop the learned names whose TTL
// ended.
type fqdnExpire struct{}

// fqdnSave makes the policy actor write its learned names.
type fqdnSave struct{}

// FQDNWriteGap is the least time between two writes of the learned
// names: a burst of DNS answers costs one write a second, not one each
// (an answer learned in the gap before a crash is lost, as it would be
// in Cilium, which writes its DNS history with the endpoint's state).
const FQDNWriteGap = time.Second

func (a *policyActor) fqdnCache() *fqdn.Cache {
	if a.fqdn.cache == nil {
		a.fqdn.cache = fqdn.NewCache(a.cfg.FQDN)
	}
	return a.fqdn.cache
}

// learnFQDN records a DNS answer of an endpoint: the name's addresses
// over all endpoints go to the repository, whose CIDR identities go to
// the ipcache and whose policy changes regenerate the endpoints, the
// asking one included (the front door waits for its regeneration).
func (a *policyActor) learnFQDN(ctx actor.Context, msg *messages.PolicyFQDNLearn) {
	c := a.fqdnCache()
	renewal := ctx.Sender() == nil // LearnFQDN's renewal of a realised answer: nobody waits
	changed, err := c.Learn(uint16(msg.Endpoint), msg.Name, msg.IPs, msg.TTL, time.Now())
	if err != nil {
		if renewal {
			a.log.Warn("dns answer's renewal refused", "endpoint", msg.Endpoint, "name", msg.Name, "err", err)
			return
		}
		ctx.Respond(&messages.PolicyFQDNLearned{Err: fmt.Errorf("learn %s: %w", msg.Name, err)})
		return
	}
	if changed {
		// The asker too: its regeneration starts now, before the
		// answer; LearnFQDN waits for it (RegeneratePolicy's Join).
		a.apply(ctx, a.repo.SetFQDN(msg.Name, c.IPs(msg.Name)))
	}
	a.armFQDN(ctx)
	a.saveFQDN(ctx)
	if renewal {
		return
	}
	a.mapState(msg.Identity)
	ctx.Respond(&messages.PolicyFQDNLearned{Policy: a.repo.MapStateFor(msg.Identity, a.repo.EndpointPorts(localPortOwner(msg.Endpoint)))})
}

// expireFQDN drops the expired names' addresses (the connections to
// them are denied from then on) and re-arms the timer.
func (a *policyActor) expireFQDN(ctx actor.Context) {
	a.fqdn.timer, a.fqdn.at = nil, time.Time{}
	c := a.fqdnCache()
	names := c.Expire(time.Now())
	for _, name := range names {
		a.setFQDN(ctx, name)
	}
	a.armFQDN(ctx)
	if len(names) > 0 {
		a.saveFQDN(ctx)
	}
}

// forgetFQDN drops a deleted endpoint's names.
func (a *policyActor) forgetFQDN(ctx actor.Context, ep endpoint.ID) {
	if a.fqdn.cache == nil {
		return
	}
	names := a.fqdn.cache.Forget(uint16(ep))
	for _, name := range names {
		a.setFQDN(ctx, name)
	}
	if len(names) > 0 {
		a.saveFQDN(ctx)
	}
}

// restoreFQDN puts what the file held at agent start (FQDNInitial) back
// into the cache, and the addresses into the repository and the
// ipcache, as learnFQDN would: the first incarnation does it before any
// endpoint asks for its policy, so that a restored endpoint's policy map
// keeps allowing the addresses it resolved (its open connections to
// them survive the restart) and a new connection needs no new query.
func (a *policyActor) restoreFQDN(ctx actor.Context) {
	if len(a.cfg.FQDNInitial) == 0 {
		return
	}
	c := a.fqdnCache()
	names := c.Restore(a.cfg.FQDNInitial, time.Now())
	for _, name := range names {
		a.apply(ctx, a.repo.SetFQDN(name, c.IPs(name)))
	}
	a.armFQDN(ctx)
	a.log.Info("learned names restored", "entries", c.Len(), "names", len(names))
}

// saveFQDN writes the cache to its file: now when no write is in
// flight and the last began FQDNWriteGap ago, else once the running
// write ended and the gap passed.
func (a *policyActor) saveFQDN(ctx actor.Context) {
	if a.cfg.FQDNDir == "" {
		return
	}
	a.fqdn.dirty = true
	if a.fqdn.writing || a.fqdn.saveTimer != nil {
		return
	}
	if wait := FQDNWriteGap - time.Since(a.fqdn.lastWrite); wait > 0 {
		self, system := ctx.Self(), ctx.ActorSystem()
		a.fqdn.saveTimer = time.AfterFunc(wait, func() { system.Root.Send(self, &fqdnSave{}) })
		return
	}
	a.writeFQDN(ctx)
}

// writeFQDN hands the cache's entries to the pool to be written.
func (a *policyActor) writeFQDN(ctx actor.Context) {
	if !a.fqdn.dirty || a.fqdn.writing {
		return
	}
	data, err := fqdn.MarshalFile(a.fqdnCache().Entries(nil))
	if err != nil {
		a.log.Error("learned names not persisted", "err", err)
		return
	}
	a.fqdn.writing, a.fqdn.dirty, a.fqdn.lastWrite = true, false, time.Now()
	dir := a.cfg.FQDNDir
	work := &messages.DatapathWork{Op: "write-fqdn", Run: func(context.Context) (any, error) {
		return nil, restore.WriteFQDN(dir, data)
	}}
	a.req.inPool(ctx, a.deps, work, func(_ any, err error) {
		a.fqdn.writing = false
		if err != nil {
			// Kept in memory; lost at a restart unless a later write
			// succeeds.
			a.log.Error("writing the learned names failed", "dir", dir, "err", err)
			a.fqdn.dirty = true
		}
		if a.fqdn.dirty {
			a.saveFQDN(ctx)
		}
	})
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
	if a.fqdn.saveTimer != nil {
		a.fqdn.saveTimer.Stop()
		a.fqdn.saveTimer = nil
	}
}

// applyExcept is apply without telling endpoint skip to regenerate (it
// asked for its policy, which the answer gives it).
func (a *policyActor) applyExcept(ctx actor.Context, res policy.Result, skip endpoint.ID) {
	a.skip = skip
	a.apply(ctx, res)
	a.skip = 0
}
