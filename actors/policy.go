package actors

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"slices"
	"strconv"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// policyActor owns the policy repository and its selector cache. It
// answers ComputePolicy for the endpoint actors, imports and deletes
// policies, follows identities as the identity actor binds and releases
// them, and after each change tells exactly the endpoints whose identity's
// policy changed to regenerate (policy-only). It is the single writer of
// the policies and policy-revision tables and rebuilds from them (and
// the ipcache table, for CIDR identity numbers) after a restart.
type policyActor struct {
	owner
	cfg     PolicyConfig
	deps    *endpointDeps
	manager *actor.PID
	ipcache *actor.PID
	log     *slog.Logger
	repo    *policy.Repository
	// users[ep] is the identity endpoint ep last asked the policy of (0:
	// none). A flat array (256 KiB) instead of maps: no heap per
	// endpoint; a change scans the entries tracked marks. It finds endpoints whose index
	// row does not show their identity yet (a first build is published
	// when it ends).
	users []identity.NumericIdentity
	// tracked has bit ep set when users[ep] is not 0: a change scans
	// its 1,024 words, not the 65,536 entries of users.
	tracked *[(endpoint.MaxID + 1) / 64]uint64
	written uint64 // the revision last written to the index
	persist persistState
	// staging is the import being prepared in steps (policyImportStep
	// messages), nil when none; queued holds the imports and deletes
	// that arrived meanwhile, run in order after it.
	staging *stagedImport
	queued  []policyOp
	// fqdn holds the names learned from DNS answers (policy_fqdn.go);
	// skip is the endpoint apply does not tell (0: none).
	fqdn fqdnState
	skip endpoint.ID
	// host is the host endpoint's realised policy (policy_host.go).
	host hostState
}

// policyOp is an import or delete with the PID its answer goes to.
type policyOp struct {
	msg    any
	sender *actor.PID
}

// stagedImport is an import whose selectors are prepared a step at a
// time, so that ComputePolicy (endpoint creation) and identity changes
// are answered between the steps instead of waiting for a large import.
type stagedImport struct {
	op      policyOp
	staging *policy.Staging
}

// policyImportStep makes the policy actor run the next step of its
// staged import.
type policyImportStep struct{}

// PolicyConfig configures the policy actor.
type PolicyConfig struct {
	// File is where the policies persist (<state-dir>/policy.json),
	// rewritten after every change before the change is answered; ""
	// keeps them in memory (and in the index) only.
	File string
	// Initial and InitialRevision are what File held at agent start;
	// imported when the index holds no policies yet.
	Initial         []*policy.Policy
	InitialRevision uint64
	// ImportStep is how many selectors an import prepares per mailbox
	// pass (default 1000): the requests that arrive meanwhile wait for
	// one step, not for the whole import.
	ImportStep int
	// FQDN bounds and tunes the cache of names learned from DNS answers.
	FQDN fqdn.CacheConfig
	// FQDNDir is where the learned names persist (restore.FQDNFile in
	// it), rewritten after changes, at most one write in flight and one
	// per FQDNWriteGap; "" keeps them in memory only. FQDNInitial is
	// what it held at agent start (expired entries left out), restored
	// by the first incarnation before any endpoint asks for its policy.
	FQDNDir     string
	FQDNInitial []fqdn.Entry
}

// persistState coalesces policy file writes: one in flight; changes
// made meanwhile are written by the next one, and their answers wait
// for it.
type persistState struct {
	busy     bool
	pending  []messages.Reply // answered after the next write
	inflight []messages.Reply // answered after the running write
}

func newPolicyActor(deps *endpointDeps, cfg PolicyConfig, manager, ipcache *actor.PID) *policyActor {
	l := deps.log.With("actor", "policy")
	a := &policyActor{cfg: cfg, deps: deps, manager: manager, ipcache: ipcache, log: l, owner: owner{batch: newBatcher(deps.writer, l)}}
	a.onStart, a.onStop, a.onRestart = a.rebuild, a.stopFQDNTimer, a.restarting
	return a
}

// restarting answers the waiters of a write this incarnation will not
// see end (owner.onRestart); the change itself is applied (and in the
// index).
func (a *policyActor) restarting(actor.Context) {
	a.batch.replies = append(a.batch.replies, append(a.persist.inflight, a.persist.pending...)...)
	a.dropQueued()
}

// Receive implements actor.Actor.
func (a *policyActor) Receive(ctx actor.Context) {
	defer a.batch.flushOnPanic()
	if a.lifecycle(ctx) {
		return
	}
	switch msg := ctx.Message().(type) {
	case *messages.PolicyImport, *messages.PolicyDelete:
		a.queued = append(a.queued, policyOp{msg: msg, sender: ctx.Sender()})
		a.runQueued(ctx)
	case *policyImportStep:
		a.importStep(ctx)
	case *messages.ComputePolicy:
		a.computePolicy(ctx, msg)
	case *messages.IdentityChanged:
		if msg.Deleted {
			a.apply(ctx, a.repo.RemoveIdentity(msg.ID))
		} else {
			a.apply(ctx, a.repo.UpsertIdentity(msg.ID, msg.Labels))
		}
	case *messages.PolicyRemotePorts:
		a.apply(ctx, a.repo.SetEndpointPortsBatch(msg.Set))
	case *messages.PolicyHostLabels:
		a.hostLabelsChanged(ctx)
	case *messages.PolicyHostSafePeers:
		a.host.safe, a.host.safeSet = msg.Peers, true
		a.syncHostSafe(ctx)
	case *messages.PolicyServiceSet:
		// Kept in the index too: a restarted incarnation sets them again
		// (rebuild); the service watcher sends a Service only when it
		// changes.
		k := msg.Namespace + "/" + msg.Name
		row := &index.PolicyServiceRow{Key: k, Namespace: msg.Namespace, Name: msg.Name, Service: msg.Service}
		if msg.Service == nil {
			a.batch.delKeyed(ctx, index.TablePolicyServices, k, row)
		} else {
			a.batch.putKeyed(ctx, index.TablePolicyServices, k, row)
		}
		res := a.repo.SetService(msg.Namespace, msg.Name, msg.Service)
		a.reselected(ctx, res.Reselected)
		a.apply(ctx, res)
	case *messages.EndpointPolicyGone:
		a.untrack(msg.Endpoint)
		a.apply(ctx, a.repo.RemoveEndpointPorts(localPortOwner(msg.Endpoint)))
		a.forgetFQDN(ctx, msg.Endpoint)
	case *messages.PolicyFQDNLearn:
		a.learnFQDN(ctx, msg)
	case *fqdnExpire:
		a.expireFQDN(ctx)
	case *fqdnSave:
		a.fqdn.saveTimer = nil
		a.writeFQDN(ctx)
	case *messages.FQDNCacheDump:
		var es []fqdn.Entry
		if a.fqdn.cache != nil {
			es = a.fqdn.cache.Entries(nil)
		}
		ctx.Respond(&messages.FQDNCacheEntries{Entries: es})
	case *crashForTest:
		panic("policy: crash requested by a test")
	}
}

// rebuild loads identities, CIDR identity numbers, the Services of
// toServices rules and policies from the index (all empty at agent start), then regenerates the endpoints whose
// recorded policy differs from the recomputed one.
func (a *policyActor) rebuild(ctx actor.Context) {
	ix := a.deps.ix
	a.repo = policy.NewRepository()
	a.users = make([]identity.NumericIdentity, endpoint.MaxID+1)
	a.tracked = new([(endpoint.MaxID + 1) / 64]uint64)
	for _, row := range ix.Identities() {
		a.repo.UpsertIdentity(row.ID, row.Labels)
	}
	a.upsertNodeIdentities()
	// The named ports of the endpoints in the index, before the rules
	// that resolve them (the endpoints send them again when they ask).
	for _, ep := range ix.Endpoints(index.EndpointFilter{}) {
		if ep.Identity != identity.IdentityUnknown && ep.State != endpoint.StateDisconnecting {
			a.repo.SetEndpointPorts(localPortOwner(ep.ID), ep.Identity, ep.NamedPorts)
		}
	}
	var remotePorts []policy.EndpointPortsChange
	for _, e := range ix.IPCache() {
		for _, c := range e.Claims {
			switch {
			case c.Source == index.SourceCIDRPolicy:
				a.repo.SeedCIDR(e.Prefix, c.Identity)
			case c.Source == index.SourceRemote && len(c.NamedPorts) > 0:
				remotePorts = append(remotePorts, policy.EndpointPortsChange{Owner: remotePortOwner(c.Origin, e.Prefix.Addr()),
					Identity: c.Identity, Ports: c.NamedPorts})
			}
		}
	}
	a.repo.SetEndpointPortsBatch(remotePorts)
	for _, r := range ix.PolicyServices() {
		a.repo.SetService(r.Namespace, r.Name, r.Service)
	}
	rows := ix.Policies()
	slices.SortFunc(rows, func(x, y *index.PolicyRow) int { return cmp.Compare(x.Revision, y.Revision) })
	pols := make([]*policy.Policy, len(rows))
	for i, r := range rows {
		pols[i] = r.Policy
	}
	rev := ix.PolicyRevisionNow()
	if rev == 0 && len(rows) == 0 && a.cfg.InitialRevision > 0 {
		// Agent start: what policy.json held.
		pols, rev = a.cfg.Initial, a.cfg.InitialRevision
		for _, p := range pols {
			a.batch.putKeyed(ctx, index.TablePolicies, p.Key(), &index.PolicyRow{Key: p.Key(), Policy: p, Revision: rev})
		}
		a.batch.putKeyed(ctx, index.TablePolicyRevision, 0, &index.PolicyRevision{Revision: rev})
		a.log.Info("policies loaded from the policy file", "policies", len(pols), "revision", rev, "file", a.cfg.File)
	}
	res := a.repo.Import(pols)
	a.repo.SetRevision(rev)
	a.written = a.repo.Revision()
	a.sendCIDRs(ctx, res)
	if len(rows) > 0 {
		a.log.Info("rebuilt policies from the index", "policies", len(rows), "revision", a.repo.Revision())
	}
	// A restarted incarnation may have missed changes its endpoints must
	// follow. A first incarnation must not: endpoints created before its
	// Started ran ask for their policy anyway.
	// The node's labels, when known: the host policy is realised again
	// (a restarted incarnation does not know what its predecessor wrote).
	a.hostLabelsChanged(ctx)
	if slot := a.deps.registry.slot(ctx.Self().Id); slot != nil && slot.restarted() {
		a.reconcile(ctx)
	} else {
		a.restoreFQDN(ctx)
	}
}

// reconcile runs after a restart: it regenerates the endpoints whose
// recorded policy is stale, and those whose row may lag behind (a first
// build is published only when it ends): they may hold a policy computed
// by the previous incarnation, which no longer knows them.
func (a *policyActor) reconcile(ctx actor.Context) {
	for _, ep := range a.deps.ix.Endpoints(index.EndpointFilter{}) {
		if ep.State == endpoint.StateDisconnecting {
			continue
		}
		stale := ep.Identity == identity.IdentityUnknown || ep.State != endpoint.StateReady
		if !stale {
			a.track(ep.ID, ep.Identity)
			stale = !a.mapStateFor(ep.Identity, ep.NamedPorts).Equal(ep.Policy)
		}
		if stale {
			ctx.Send(a.manager, &messages.RegeneratePolicy{ID: ep.ID, Revision: a.repo.Revision()})
		}
	}
}

// runQueued runs the queued imports and deletes in order until one is
// staged.
func (a *policyActor) runQueued(ctx actor.Context) {
	for a.staging == nil && len(a.queued) > 0 {
		op := a.queued[0]
		a.queued = a.queued[1:]
		switch msg := op.msg.(type) {
		case *messages.PolicyImport:
			s := a.repo.Stage(msg.Policies)
			if s.Step(a.cfg.ImportStep) {
				a.doImport(ctx, op, s)
				continue
			}
			a.staging = &stagedImport{op: op, staging: s}
			ctx.Send(ctx.Self(), &policyImportStep{})
		case *messages.PolicyDelete:
			a.doDelete(ctx, op, msg)
		}
	}
}

// importStep prepares the next part of the staged import; the last one
// imports it. Messages queued meanwhile ran before this step.
func (a *policyActor) importStep(ctx actor.Context) {
	st := a.staging
	if st == nil {
		return // sent to a predecessor
	}
	if !st.staging.Step(a.cfg.ImportStep) {
		ctx.Send(ctx.Self(), &policyImportStep{})
		return
	}
	a.staging = nil
	a.doImport(ctx, st.op, st.staging)
	a.runQueued(ctx)
}

// dropQueued answers the imports and deletes this incarnation will not
// run (it is restarting): they were not applied.
func (a *policyActor) dropQueued() {
	ops := a.queued
	if a.staging != nil {
		ops = append([]policyOp{a.staging.op}, ops...)
	}
	for _, op := range ops {
		if op.sender != nil {
			a.batch.replies = append(a.batch.replies, messages.Reply{To: op.sender,
				Message: &messages.PolicyResult{Err: fmt.Errorf("policy change not applied: %w", ErrActorRestarted)}})
		}
	}
	a.staging, a.queued = nil, nil
}

func (a *policyActor) doImport(ctx actor.Context, op policyOp, s *policy.Staging) {
	msg := op.msg.(*messages.PolicyImport)
	res := s.Import()
	names := make([]string, len(msg.Policies))
	for i, p := range msg.Policies {
		names[i] = p.Key()
		a.batch.putKeyed(ctx, index.TablePolicies, p.Key(), &index.PolicyRow{Key: p.Key(), Policy: p, Revision: res.Revision,
			Selected: a.repo.Selections(p.Key())})
	}
	a.log.Info("policies imported", "policies", len(names), "revision", res.Revision, "regenerate-identities", len(res.Changed))
	a.apply(ctx, res)
	a.replyDurable(ctx, op.sender, &messages.PolicyResult{Revision: res.Revision, Names: names})
}

func (a *policyActor) doDelete(ctx actor.Context, op policyOp, msg *messages.PolicyDelete) {
	var (
		res     policy.Result
		deleted []string
	)
	if msg.Name != "" {
		var err error
		res, err = a.repo.DeleteByName(msg.Name)
		if errors.Is(err, policy.ErrNotFound) {
			if op.sender != nil {
				ctx.Send(op.sender, &messages.PolicyResult{Revision: res.Revision, Err: fmt.Errorf("delete policy %s: %w", msg.Name, err)})
			}
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
	a.replyDurable(ctx, op.sender, &messages.PolicyResult{Revision: res.Revision, Deleted: len(deleted)})
}

// replyDurable answers to once the change is in the policy file (and
// the index), or right after the index commit without a file.
func (a *policyActor) replyDurable(ctx actor.Context, to *actor.PID, msg any) {
	if a.cfg.File == "" {
		a.batch.reply(ctx, to, msg)
		return
	}
	if to != nil {
		a.persist.pending = append(a.persist.pending, messages.Reply{To: to, Message: msg})
	}
	a.writeFile(ctx)
}

// writeFile writes the policy file in the worker pool, unless a write
// is in flight (then the next one starts when it ends).
func (a *policyActor) writeFile(ctx actor.Context) {
	if a.persist.busy || len(a.persist.pending) == 0 {
		return
	}
	data, err := policy.MarshalFile(a.repo.Revision(), a.repo.Policies())
	if err != nil {
		a.log.Error("policies not persisted", "err", err)
		for _, r := range a.persist.pending {
			a.batch.reply(ctx, r.To, r.Message)
		}
		a.persist.pending = nil
		return
	}
	a.persist.busy = true
	a.persist.inflight, a.persist.pending = a.persist.pending, nil
	path := a.cfg.File
	work := &messages.DatapathWork{Op: "write-policy", Run: func(context.Context) (any, error) {
		return nil, policy.WriteFile(path, data)
	}}
	a.req.inPool(ctx, a.deps, work, func(_ any, err error) {
		if err != nil {
			// The change is applied but would be lost at the next agent
			// restart unless a later write succeeds: say so (re-importing
			// is harmless).
			a.log.Error("writing the policy file failed", "file", path, "err", err)
		}
		a.persist.busy = false
		for _, r := range a.persist.inflight {
			msg := r.Message
			if pr, ok := msg.(*messages.PolicyResult); ok && err != nil {
				c := *pr
				c.Err = fmt.Errorf("policy revision %d applied but not persisted to %s: %w", pr.Revision, path, err)
				msg = &c
			}
			a.batch.reply(ctx, r.To, msg)
		}
		a.persist.inflight = nil
		a.writeFile(ctx)
	})
}

func (a *policyActor) computePolicy(ctx actor.Context, msg *messages.ComputePolicy) {
	var m *policy.MapState
	if msg.Identity != identity.IdentityUnknown {
		a.track(msg.Endpoint, msg.Identity)
		a.applyExcept(ctx, a.repo.SetEndpointPorts(localPortOwner(msg.Endpoint), msg.Identity, msg.NamedPorts), msg.Endpoint)
		m = a.mapStateFor(msg.Identity, msg.NamedPorts)
	} else {
		a.applyExcept(ctx, a.repo.RemoveEndpointPorts(localPortOwner(msg.Endpoint)), msg.Endpoint)
	}
	ctx.Respond(&messages.PolicyComputed{Policy: m, Revision: a.repo.Revision()})
}

// localPortOwner is the repository's key for a local endpoint's named
// ports.
func localPortOwner(ep endpoint.ID) string { return "ep:" + strconv.Itoa(int(ep)) }

// mapStateFor is mapState resolved for an endpoint declaring ports.
func (a *policyActor) mapStateFor(id identity.NumericIdentity, ports policy.NamedPorts) *policy.MapState {
	a.mapState(id)
	return a.repo.MapStateFor(id, ports)
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
		a.deps.events.Publish(events.Event{Type: events.PolicyRevision, Revision: rev,
			Message: fmt.Sprintf("%d identities with changed policy", len(res.Changed))})
	}
	a.sendCIDRs(ctx, res)
	if len(res.Changed) == 0 {
		return
	}
	for _, ch := range res.Changed {
		if ch.Identity == identity.ReservedHost {
			a.syncHost(ctx)
		}
	}
	changed := make(map[identity.NumericIdentity]bool, len(res.Changed))
	targets := map[endpoint.ID]struct{}{}
	for _, ch := range res.Changed {
		changed[ch.Identity] = true
		for _, ep := range a.deps.ix.Endpoints(index.EndpointFilter{Identity: ch.Identity}) {
			targets[ep.ID] = struct{}{}
		}
	}
	for w, word := range a.tracked {
		for ; word != 0; word &= word - 1 {
			ep := w*64 + bits.TrailingZeros64(word)
			if changed[a.users[ep]] {
				targets[endpoint.ID(ep)] = struct{}{}
			}
		}
	}
	delete(targets, a.skip)
	for id := range targets {
		ctx.Send(a.manager, &messages.RegeneratePolicy{ID: id, Revision: res.Revision})
	}
}

func (a *policyActor) sendCIDRs(ctx actor.Context, res policy.Result) {
	if len(res.CIDRUpserts) > 0 || len(res.CIDRDeletes) > 0 {
		ctx.Send(a.ipcache, &messages.IPCacheCIDRs{Upserts: res.CIDRUpserts, Deletes: res.CIDRDeletes})
	}
}

func (a *policyActor) track(ep endpoint.ID, id identity.NumericIdentity) {
	a.users[ep] = id
	if id == identity.IdentityUnknown {
		a.tracked[ep/64] &^= 1 << (ep % 64)
	} else {
		a.tracked[ep/64] |= 1 << (ep % 64)
	}
}

func (a *policyActor) untrack(ep endpoint.ID) { a.track(ep, identity.IdentityUnknown) }

// reselected rewrites the rows of the policies whose service selections
// may have changed, with what they select now.
func (a *policyActor) reselected(ctx actor.Context, keys []string) {
	if len(keys) == 0 {
		return
	}
	rows := map[string]*index.PolicyRow{}
	for _, r := range a.deps.ix.Policies() {
		rows[r.Key] = r
	}
	for _, k := range keys {
		old, p := rows[k], a.repo.Policy(k)
		if old == nil || p == nil {
			continue // imported in this mailbox pass (its row has its selections) or deleted
		}
		row := *old
		row.Policy, row.Selected = p, a.repo.Selections(k)
		a.batch.putKeyed(ctx, index.TablePolicies, k, &row)
	}
}
