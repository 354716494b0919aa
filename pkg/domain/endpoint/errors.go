package endpoint

import "errors"

var (
	// ErrIllegalTransition is returned for a state change Cilium's table forbids.
	ErrIllegalTransition = errors.New("illegal state transition")
	// ErrUnknownState is returned when parsing a name that is not a State.
	ErrUnknownState = errors.New("unknown endpoint state")
	// ErrInvalidID is returned for an endpoint ID outside 1..65535 or a
	// malformed ID reference.
	ErrInvalidID = errors.New("invalid endpoint id")
)
