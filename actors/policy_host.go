package actors

import (
	"context"
	"net/netip"
	"slices"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// The host endpoint (host policies, pkg/domain/policy/hostpolicy.go):
// the policy actor gives the host identity the node's labels and, with
// the host firewall on, realises the host identity's MapState through
// the pool (datapath.HostPolicyDatapath), one write in flight, a change
// made meanwhile written by the next. Nothing is realised before the
// node's labels are known (Kubernetes mode: the Node object), so that a
// restart never briefly applies the host policies of a node without
// labels.

// hostState is what the policy actor realised for the host endpoint.
type hostState struct {
	// known: the node's labels arrived (hostLabels holder set).
	known bool
	// busy: a write is in flight; dirty: the policy changed meanwhile,
	// or the last write failed (retried with the next change).
	busy, dirty bool
	// done, have and haveAudit: the last write succeeded with have, in
	// audit mode haveAudit.
	done      bool
	have      *policy.MapState
	haveAudit bool

	// safe: the safety net's peers from the API server's EndpointSlice
	// (safeSet: some arrived); written through the pool like the
	// policy, one write in flight (safeBusy), a change meanwhile or a
	// failure written again (safeDirty).
	safe                         []netip.AddrPort
	safeSet, safeBusy, safeDirty bool
}

// SetKubeAPIServerPeers gives the host firewall's safety net the API
// server's addresses and TCP ports (its own EndpointSlice,
// default/kubernetes). It does not wait.
func (s *System) SetKubeAPIServerPeers(peers []netip.AddrPort) {
	s.Actors.Root.Send(s.deps.policy, &messages.PolicyHostSafePeers{Peers: slices.Clone(peers)})
}

// syncHostSafe writes the safety net's peers to the datapath unless a
// write is in flight (then the next write carries them).
func (a *policyActor) syncHostSafe(ctx actor.Context) {
	hp, ok := a.deps.dp.(datapath.HostPolicyDatapath)
	if !ok || !hp.HostFirewall() || !a.host.safeSet {
		return
	}
	if a.host.safeBusy {
		a.host.safeDirty = true
		return
	}
	peers := a.host.safe
	a.host.safeBusy, a.host.safeDirty = true, false
	work := &messages.DatapathWork{Op: "host-safe-peers", Run: func(c context.Context) (any, error) {
		return nil, hp.SetHostSafePeers(c, peers)
	}}
	a.req.inPool(ctx, a.deps, work, func(_ any, err error) {
		a.host.safeBusy = false
		if err != nil {
			a.log.Error("host firewall safety net peers not written; retried with the next change", "err", err)
			return
		}
		a.log.Info("host firewall safety net: API server peers", "peers", peers)
		if a.host.safeDirty {
			a.syncHostSafe(ctx)
		}
	})
}

// SetHostLabels gives the host identity the node's labels (its Node
// object's; nil: none), which host policies select nodes by, and the
// host endpoint its policy audit mode (audit: what its policy would drop
// passes, reported as policy-audit). It does not wait.
func (s *System) SetHostLabels(nodeLabels map[string]string, audit bool) {
	ls, err := policy.HostLabels(nodeLabels)
	if err != nil {
		s.log.Warn("node labels left out of the host identity", "err", err)
	}
	s.deps.hostAudit.Store(audit)
	s.deps.hostLabels.Store(&ls)
	s.Actors.Root.Send(s.deps.policy, &messages.PolicyHostLabels{})
}

// hostLabelsChanged reads the node's labels from the holder into the
// host identity and realises the host policy.
func (a *policyActor) hostLabelsChanged(ctx actor.Context) {
	ls := a.deps.hostLabels.Load()
	if ls == nil {
		return
	}
	a.host.known = true
	a.apply(ctx, a.repo.UpsertIdentity(identity.ReservedHost, *ls))
	a.syncHost(ctx)
}

// syncHost writes the host identity's policy to the datapath unless it
// holds it already or a write is in flight.
func (a *policyActor) syncHost(ctx actor.Context) {
	hp, ok := a.deps.dp.(datapath.HostPolicyDatapath)
	if !ok || !hp.HostFirewall() || !a.host.known {
		return
	}
	if a.host.busy {
		a.host.dirty = true
		return
	}
	m := a.repo.MapState(identity.ReservedHost)
	audit := a.deps.hostAudit.Load()
	if a.host.done && m.Equal(a.host.have) && audit == a.host.haveAudit {
		return
	}
	a.host.busy, a.host.dirty = true, false
	work := &messages.DatapathWork{Op: "host-policy", Run: func(c context.Context) (any, error) {
		return nil, hp.RealizeHostPolicy(c, m, audit)
	}}
	a.req.inPool(ctx, a.deps, work, func(_ any, err error) {
		a.host.busy = false
		if err != nil {
			a.log.Error("host policy not realised; retried with the next change", "err", err)
			a.host.done = false
			return
		}
		a.host.done, a.host.have, a.host.haveAudit = true, m, audit
		a.log.Info("host policy realised", "enforced-ingress", m.Enforced(policy.Ingress), "enforced-egress", m.Enforced(policy.Egress),
			"audit", audit)
		if a.host.dirty {
			a.syncHost(ctx)
		}
	})
}
