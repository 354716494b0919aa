package actors

import (
	"net/netip"
	"slices"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// Per-node identities (Config.NodeSelectorLabels, Cilium's
// --enable-node-selector-labels): every distinct label set of the other
// nodes (policy.NodeIdentityLabels of their Node labels) gets an
// identity of this agent's own from identity.MinNodeIdentity, the
// nodes' addresses get it in the ipcache instead of remote-node, and the
// policy actor learns its labels (messages.IdentityChanged), so that
// fromNodes/toNodes, remote-node and cluster select it. The nodes actor
// allocates them; the allocation lives in endpointDeps.nodeIDs so that a
// restarted nodes or policy actor finds it.

// nodeIdentities is one allocation, copied on write.
type nodeIdentities struct {
	byKey  map[string]identity.NumericIdentity // labels.Key() -> identity
	labels map[identity.NumericIdentity]labels.Labels
}

// nodeIdentities allocates the identities of the active rows' label
// sets, releases the ones no row has any more, tells the policy actor
// what changed and returns each active address's identity.
func (a *nodesActor) nodeIdentities(ctx actor.Context) map[netip.Addr]identity.NumericIdentity {
	old := a.deps.nodeIDs.Load()
	if old == nil {
		old = &nodeIdentities{}
	}
	next := &nodeIdentities{byKey: map[string]identity.NumericIdentity{}, labels: map[identity.NumericIdentity]labels.Labels{}}
	out := map[netip.Addr]identity.NumericIdentity{}
	var added []identity.NumericIdentity
	for _, r := range a.rows {
		if !r.Active {
			continue
		}
		ls, err := policy.NodeIdentityLabels(a.deps.filterNodeLabels(r.Labels))
		if err != nil {
			a.log.Warn("node labels left out of the node's identity", "node", r.Name, "err", err)
		}
		key := ls.Key()
		id, ok := next.byKey[key]
		if !ok {
			if id, ok = old.byKey[key]; !ok {
				id = freeNodeIdentity(old, next)
				if id == 0 {
					a.log.Error("no per-node identity left; the node stays remote-node", "node", r.Name)
					continue
				}
				added = append(added, id)
			}
			next.byKey[key], next.labels[id] = id, ls
		}
		for _, ip := range r.Addrs {
			out[ip.Unmap()] = id
		}
	}
	a.deps.nodeIDs.Store(next)
	// Labels first: the policy actor knows an identity before the
	// ipcache maps an address to it.
	slices.Sort(added)
	for _, id := range added {
		ctx.Send(a.deps.policy, &messages.IdentityChanged{ID: id, Labels: next.labels[id]})
	}
	for id := range old.labels {
		if _, ok := next.labels[id]; !ok {
			ctx.Send(a.deps.policy, &messages.IdentityChanged{ID: id, Deleted: true})
		}
	}
	return out
}

// freeNodeIdentity is the lowest per-node identity neither old nor next
// uses (0: none left).
func freeNodeIdentity(old, next *nodeIdentities) identity.NumericIdentity {
	for id := identity.MinNodeIdentity; id <= identity.MaxNodeIdentity; id++ {
		_, o := old.labels[id]
		_, n := next.labels[id]
		if !o && !n {
			return id
		}
	}
	return 0
}

// upsertNodeIdentities gives a rebuilt policy repository the per-node
// identities.
func (a *policyActor) upsertNodeIdentities() {
	if ids := a.deps.nodeIDs.Load(); ids != nil {
		for id, ls := range ids.labels {
			a.repo.UpsertIdentity(id, ls)
		}
	}
}

// NodeIdentities returns the per-node identities (Config.NodeSelectorLabels)
// and their labels; empty without them (or on a nil System: API tests).
func (s *System) NodeIdentities() map[identity.NumericIdentity]labels.Labels {
	if s == nil {
		return nil
	}
	ids := s.deps.nodeIDs.Load()
	if ids == nil {
		return nil
	}
	out := make(map[identity.NumericIdentity]labels.Labels, len(ids.labels))
	for id, ls := range ids.labels {
		out[id] = ls
	}
	return out
}

// filterNodeLabels keeps the Node labels --node-labels chooses (all
// without it).
func (d *endpointDeps) filterNodeLabels(nodeLabels map[string]string) map[string]string {
	if d.nodeLabels == nil {
		return nodeLabels
	}
	out := make(map[string]string, len(nodeLabels))
	for k, v := range nodeLabels {
		if d.nodeLabels.Relevant(labels.Label{Source: policy.SourceNode, Key: k, Value: v}) {
			out[k] = v
		}
	}
	return out
}
