package ipam

import (
	"fmt"
	"strconv"
)

// Strategy selects how AllocateNext picks a free address.
type Strategy int

const (
	// Sequential hands out the first free address after the one handed out
	// last, wrapping around at the end of the range (CNI host-local style),
	// so that a released address is reused as late as possible.
	Sequential Strategy = iota
	// Random starts the search at a uniformly random offset and hands out
	// the first free address from there, wrapping around.
	Random
)

// ParseStrategy parses "sequential" or "random".
//
// Returns ErrInvalidStrategy for any other string.
func ParseStrategy(s string) (Strategy, error) {
	switch s {
	case "sequential":
		return Sequential, nil
	case "random":
		return Random, nil
	}
	return 0, fmt.Errorf("parse strategy %q: want \"sequential\" or \"random\": %w", s, ErrInvalidStrategy)
}

// String returns the name ParseStrategy accepts, or "Strategy(N)" for an
// unknown value.
func (s Strategy) String() string {
	switch s {
	case Sequential:
		return "sequential"
	case Random:
		return "random"
	}
	return "Strategy(" + strconv.Itoa(int(s)) + ")"
}

func (s Strategy) valid() bool { return s == Sequential || s == Random }

// Family is an IP address family.
type Family string

const (
	// IPv4 is the IPv4 family.
	IPv4 Family = "ipv4"
	// IPv6 is the IPv6 family.
	IPv6 Family = "ipv6"
)
