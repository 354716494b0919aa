package actors

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/endpoint"
	"github.com/membrane-cni/membrane/pkg/identity"
	"github.com/membrane-cni/membrane/pkg/index"
	"github.com/membrane-cni/membrane/pkg/policy"
)

// policyActor owns the policy repository and its selector cache. It
// answers ComputePolicy for the endpoint actors, imports and deletes
// policies, follows identities as the identity actor binds and releases
// them, and after each change tells exactly the endpoints whose identity's
// policy changed to regenerate (policy-only). It is the single writer of
// the policies and policy-revision tables and rebuilds from them (and
// the ipcache table, for CIDR identity numbers) after a restart.
type policyActor struct {
	deps    *endpointDeps
	manager *actor.PID
	ipcache *actor.PID
	log     *slog.Logger
	batch   batcher
	repo    *policy.Repository
	// users are the endpoints that asked for a policy, by identity.
	users   map[identity.NumericIdentity]map[endpoint.ID]struct{}
	userIDs map[endpoint.ID]identity.NumericIdentity
	written uint64 // the revision last written to the index
}

func newPolicyActor(deps *endpointDeps, manager, ipcache *actor.PID) *policyActor {
	l := deps.log.With("actor", "policy")
	return &policyActor{deps: deps, manager: manager, ipcache: ipcache, log: l, batch: batcher{ix: deps.ix, log: l}}
}

// Receive implements actor.Actor.
func (a *policyActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		a.rebuild(ctx)
	case *actor.Restarting:
		a.batch.flush(ctx.ActorSystem().Root.Send)
	case *flushIndex:
		a.batch.flush(ctx.Send)
	case *messages.PolicyImport:
		a.doImport(ctx, msg)
	case *messages.PolicyDelete:
		a.doDelete(ctx, msg)
	case *messages.ComputePolicy:
		a.computePolicy(ctx, msg)
	case *messages.IdentityChanged:
		if msg.Deleted {
			a.apply(ctx, a.repo.RemoveIdentity(msg.ID))
		} else {
			a.apply(ctx, a.repo.UpsertIdentity(msg.ID, msg.Labels))
		}
	case *messages.EndpointPolicyGone:
		a.untrack(msg.Endpoint)
	case *crashForTest:
		panic("policy: crash requested by a test")
	}
}

// rebuild loads identities, CIDR identity numbers and policies from the
// index (all empty at agent start), then regenerates the endpoints whose
// recorded policy differs from the recomputed one.
func (a *policyActor) rebuild(ctx actor.Context) {
	ix := a.deps.ix
	a.repo = policy.NewRepository()
	a.users = map[identity.NumericIdentity]map[endpoint.ID]struct{}{}
	a.userIDs = map[endpoint.ID]identity.NumericIdentity{}
	for _, row := range ix.Identities() {
		a.repo.UpsertIdentity(row.ID, row.Labels)
	}
	for _, e := range ix.IPCache() {
		for _, c := range e.Claims {
			if c.Source == index.SourceCIDRPolicy {
				a.repo.SeedCIDR(e.Prefix, c.Identity)
			}
		}
	}
	rows := ix.Policies()
	slices.SortFunc(rows, func(x, y *index.PolicyRow) int { return int(x.Revision) - int(y.Revision) })
	pols := make([]*policy.Policy, len(rows))
	for i, r := range rows {
		pols[i] = r.Policy
	}
	res := a.repo.Import(pols)
	a.repo.SetRevision(ix.PolicyRevisionNow())
	a.written = a.repo.Revision()
	a.sendCIDRs(ctx, res)
	if len(rows) > 0 {
		a.log.Info("rebuilt policies from the index", "policies", len(rows), "revision", a.repo.Revision())
	}
	for _, ep := range ix.Endpoints(index.EndpointFilter{}) {
		if ep.Identity == identity.IdentityUnknown || ep.State == endpoint.StateDisconnecting {
			continue
		}
		m := a.mapState(ep.Identity)
		a.track(ep.ID, ep.Identity)
		if !m.Equal(ep.Policy) {
			ctx.Send(a.manager, &messages.RegeneratePolicy{ID: ep.ID, Revision: a.repo.Revision()})
		}
	}
}

func (a *policyActor) doImport(ctx actor.Context, msg *messages.PolicyImport) {
	res := a.repo.Import(msg.Policies)
	names := make([]string, len(msg.Policies))
	for i, p := range msg.Policies {
		names[i] = p.Key()
		a.batch.putKeyed(ctx, index.TablePolicies, p.Key(), &index.PolicyRow{Key: p.Key(), Policy: p, Revision: res.Revision})
	}
	a.log.Info("policies imported", "policies", len(names), "revision", res.Revision, "regenerate-identities", len(res.Changed))
	a.apply(ctx, res)
	a.batch.reply(ctx, ctx.Sender(), &messages.PolicyResult{Revision: res.Revision, Names: names})
}

func (a *policyActor) doDelete(ctx actor.Context, msg *messages.PolicyDelete) {
	var (
		res     policy.Result
		deleted []string
	)
	if msg.Name != "" {
		var err error
		res, err = a.repo.DeleteByName(msg.Name)
		if errors.Is(err, policy.ErrNotFound) {
			ctx.Respond(&messages.PolicyResult{Revision: res.Revision, Err: fmt.Errorf("delete policy %s: %w", msg.Name, err)})
			return
		}
		deleted = []string{msg.Name}
	} else {
		res, deleted = a.repo.DeleteByLabels(msg.Labels)
	}
	for _, key := range deleted {
		a.batch.delKeyed(ctx, index.TablePolicies, key, &index.PolicyRow{Key: key})
	}
	a.log.Info("policies deleted", "policies", len(deleted), "revision", res.Revision, "regenerate-identities", len(res.Changed))
	a.apply(ctx, res)
	a.batch.reply(ctx, ctx.Sender(), &messages.PolicyResult{Revision: res.Revision, Deleted: len(deleted)})
}

func (a *policyActor) computePolicy(ctx actor.Context, msg *messages.ComputePolicy) {
	var m *policy.MapState
	if msg.Identity != identity.IdentityUnknown {
		m = a.mapState(msg.Identity)
		a.track(msg.Endpoint, msg.Identity)
	}
	ctx.Respond(&messages.PolicyComputed{Policy: m, Revision: a.repo.Revision()})
}

// mapState returns the policy of id, learning the identity from the
// index first if the identity actor's notification has not arrived.
func (a *policyActor) mapState(id identity.NumericIdentity) *policy.MapState {
	if !a.repo.Known(id) {
		if row, ok := a.deps.ix.Identity(id); ok {
			a.repo.UpsertIdentity(id, row.Labels)
		}
	}
	return a.repo.MapState(id)
}

// apply records the revision, sends CIDR changes to the ipcache actor
// and asks the endpoints of every identity whose policy changed (known
// users and the index's endpoints with that identity) to regenerate.
func (a *policyActor) apply(ctx actor.Context, res policy.Result) {
	if rev := a.repo.Revision(); rev != a.written {
		a.written = rev
		a.batch.putKeyed(ctx, index.TablePolicyRevision, 0, &index.PolicyRevision{Revision: rev})
	}
	a.sendCIDRs(ctx, res)
	for _, ch := range res.Changed {
		targets := map[endpoint.ID]struct{}{}
		for id := range a.users[ch.Identity] {
			targets[id] = struct{}{}
		}
		for _, ep := range a.deps.ix.Endpoints(index.EndpointFilter{Identity: ch.Identity}) {
			targets[ep.ID] = struct{}{}
		}
		for id := range targets {
			ctx.Send(a.manager, &messages.RegeneratePolicy{ID: id, Revision: res.Revision})
		}
	}
}

func (a *policyActor) sendCIDRs(ctx actor.Context, res policy.Result) {
	if len(res.CIDRUpserts) > 0 || len(res.CIDRDeletes) > 0 {
		ctx.Send(a.ipcache, &messages.IPCacheCIDRs{Upserts: res.CIDRUpserts, Deletes: res.CIDRDeletes})
	}
}

func (a *policyActor) track(ep endpoint.ID, id identity.NumericIdentity) {
	if old, ok := a.userIDs[ep]; ok && old != id {
		a.untrack(ep)
	}
	set := a.users[id]
	if set == nil {
		set = map[endpoint.ID]struct{}{}
		a.users[id] = set
	}
	set[ep] = struct{}{}
	a.userIDs[ep] = id
}

func (a *policyActor) untrack(ep endpoint.ID) {
	id, ok := a.userIDs[ep]
	if !ok {
		return
	}
	delete(a.userIDs, ep)
	if set := a.users[id]; set != nil {
		delete(set, ep)
		if len(set) == 0 {
			delete(a.users, id)
		}
	}
}
