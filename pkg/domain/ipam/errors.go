package ipam

import (
	"errors"
	"net/netip"
)

var (
	// ErrInvalidRange is returned by NewRange for a prefix that cannot back a
	// Range: invalid, IPv4-mapped IPv6, too small to leave an allocatable
	// address (longer than /30 or /126) or too large for the bitmap (more
	// than 2^24 addresses).
	ErrInvalidRange = errors.New("invalid range")
	// ErrInvalidStrategy is returned by ParseStrategy and NewRange for an
	// unknown allocation strategy.
	ErrInvalidStrategy = errors.New("invalid strategy")
	// ErrExhausted is matched (via errors.Is) by the *ExhaustedError that
	// AllocateNext returns when no free address is left.
	ErrExhausted = errors.New("range exhausted")
	// ErrOutOfRange is returned by Allocate for an address outside the
	// range's prefix, including one of the other family.
	ErrOutOfRange = errors.New("address out of range")
	// ErrReserved is returned by Allocate for the network, gateway or (IPv4)
	// broadcast address.
	ErrReserved = errors.New("address reserved")
	// ErrAllocated is returned by Allocate for an address that already
	// belongs to another owner.
	ErrAllocated = errors.New("address already allocated")
)

// ExhaustedError reports that a Range has no free address left. It matches
// ErrExhausted with errors.Is.
type ExhaustedError struct {
	// Prefix is the CIDR of the exhausted Range.
	Prefix netip.Prefix
}

var _ error = (*ExhaustedError)(nil)

func (e *ExhaustedError) Error() string {
	return "range " + e.Prefix.String() + " exhausted"
}

// Is reports whether target is ErrExhausted.
func (e *ExhaustedError) Is(target error) bool { return target == ErrExhausted }
