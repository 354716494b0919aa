package messages

import (
	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// IdentityAcquire asks the identity actor for the identity of a label set
// and takes one reference on behalf of Holder (dropped if the holder
// stops without releasing it). Reply: *IdentityAcquired.
type IdentityAcquire struct {
	Labels labels.Labels
	Holder *actor.PID
	// Preferred is the identity to bind the labels to if they have none
	// yet and it is free (restore keeps identity numbers across restarts).
	Preferred identity.NumericIdentity
}

// IdentityAcquired answers IdentityAcquire.
type IdentityAcquired struct {
	Identity identity.Identity
	IsNew    bool
	Err      error
}

// IdentityRelease drops Holder's reference on an identity; a Holder that
// holds none (never acquired it, or released it already) changes
// nothing. Reply: *IdentityReleased.
type IdentityRelease struct {
	ID     identity.NumericIdentity
	Holder *actor.PID
}

// IdentityReleased answers IdentityRelease.
type IdentityReleased struct {
	Released bool
	Err      error
}

// IdentityRenumbered tells a holder that the identity actor moved its
// reference from Old to New: the cluster identity store numbers the
// holder's label set New, not Old as this node did. The holder adopts
// New (and regenerates) if it still uses Old; its later release of Old
// releases New. No reply.
type IdentityRenumbered struct {
	Old, New identity.NumericIdentity
}
