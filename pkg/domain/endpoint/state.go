package endpoint

import "fmt"

// State is an endpoint's lifecycle state, named as in Cilium.
type State string

const (
	// StateNone is the state before the endpoint actor set any state.
	StateNone State = ""
	// StateWaitingForIdentity: the endpoint waits for its security identity.
	StateWaitingForIdentity State = "waiting-for-identity"
	// StateWaitingToRegenerate: a regeneration is queued.
	StateWaitingToRegenerate State = "waiting-to-regenerate"
	// StateRegenerating: the datapath is being (re)built for the endpoint.
	StateRegenerating State = "regenerating"
	// StateReady: the datapath realises the endpoint's current revision.
	StateReady State = "ready"
	// StateDisconnecting: the endpoint is being deleted.
	StateDisconnecting State = "disconnecting"
	// StateDisconnected: terminal; the endpoint is gone.
	StateDisconnected State = "disconnected"
	// StateRestoring: the endpoint is being restored after an agent start.
	StateRestoring State = "restoring"
)

// States lists every state, in lifecycle order.
var States = []State{
	StateWaitingForIdentity, StateWaitingToRegenerate, StateRegenerating, StateReady,
	StateDisconnecting, StateDisconnected, StateRestoring,
}

// transitions is Cilium's table (pkg/domain/endpoint: setState plus
// BuilderSetStateLocked, which adds the builder-only edges
// waiting-to-regenerate/restoring -> regenerating -> ready).
var transitions = map[State][]State{
	StateNone:                {StateWaitingForIdentity, StateRestoring},
	StateWaitingForIdentity:  {StateReady, StateDisconnecting},
	StateReady:               {StateWaitingForIdentity, StateDisconnecting, StateWaitingToRegenerate, StateRestoring},
	StateDisconnecting:       {StateDisconnected},
	StateDisconnected:        nil,
	StateWaitingToRegenerate: {StateWaitingForIdentity, StateDisconnecting, StateRestoring, StateRegenerating},
	StateRegenerating:        {StateWaitingForIdentity, StateDisconnecting, StateWaitingToRegenerate, StateRestoring, StateReady},
	StateRestoring:           {StateDisconnecting, StateRestoring, StateRegenerating},
}

// Valid reports whether s is one of the known states.
func (s State) Valid() bool {
	_, ok := transitions[s]
	return ok && s != StateNone
}

// CanTransition reports whether from -> to is an allowed transition.
func CanTransition(from, to State) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// Transition returns ErrIllegalTransition if from -> to is not allowed.
func Transition(from, to State) error {
	if !CanTransition(from, to) {
		return fmt.Errorf("transition %q -> %q: %w", from, to, ErrIllegalTransition)
	}
	return nil
}

// ParseState parses a state name. Returns ErrUnknownState for anything else.
func ParseState(s string) (State, error) {
	st := State(s)
	if !st.Valid() {
		return StateNone, fmt.Errorf("parse state %q: %w", s, ErrUnknownState)
	}
	return st, nil
}
