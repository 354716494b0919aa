package actors

import (
	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// resumeRealized ends the restore of an endpoint whose datapath already
// realises the state on disk, without a regeneration: it kept its identity
// number, and the datapath reported (at restore, in RealizedRevision) the
// revision the state records. A restart then costs no state write and no
// datapath work for intact endpoints (no regeneration storm). It reports
// false, changing nothing, when a regeneration is needed.
func (a *endpointActor) resumeRealized(ctx actor.Context) bool {
	ep := a.ep
	if ep.State != endpoint.StateRestoring || ep.RealizedRevision == 0 || ep.RealizedRevision != ep.DesiredRevision ||
		a.regen.running || a.regen.want != wantNone || len(a.regen.pendingWaiters) > 0 || a.deleting() {
		return false
	}
	// restoring -> regenerating -> ready: a regeneration with nothing to do.
	if !a.setState(endpoint.StateRegenerating, "restored with its datapath intact") ||
		!a.setState(endpoint.StateReady, "restored with its datapath intact") {
		return false
	}
	a.publish(ctx)
	return true
}
