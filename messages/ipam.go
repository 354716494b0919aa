package messages

import (
	"net/netip"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
)

// IPAMAllocate asks the IPAM actor for the next free address of a family
// ("" allocates one of every configured family). Reply: *IPAMAllocated.
type IPAMAllocate struct {
	Family ipam.Family
	Owner  string
}

// IPAMAllocateIP asks the IPAM actor for one specific address (restore,
// static addressing). Reply: *IPAMAllocated.
type IPAMAllocateIP struct {
	IP    netip.Addr
	Owner string
}

// IPAMAllocated answers IPAMAllocate and IPAMAllocateIP. Err satisfies
// errors.Is(err, ipam.ErrExhausted) when the pool is full.
type IPAMAllocated struct {
	IPv4, IPv6 netip.Addr
	Err        error
}

// IPAMRelease asks the IPAM actor to release an address. Releasing an
// unallocated address is a no-op; an address claimed by a live endpoint is
// refused with actors.ErrIPInUse unless Force. Reply: *IPAMReleased.
type IPAMRelease struct {
	IP netip.Addr
	// Owner, when set, must match the address's owner (a CNI rollback
	// never releases another pod's address).
	Owner string
	Force bool
}

// IPAMReleased answers IPAMRelease.
type IPAMReleased struct {
	Released bool
	Owner    string
	Err      error
}

// IPAMClaim binds addresses to an endpoint actor (the lease holder; the
// lease ends if the holder stops without unclaiming). Unallocated
// addresses are allocated to Owner. Reply: *IPAMResult.
type IPAMClaim struct {
	Endpoint endpoint.ID
	IPs      []netip.Addr
	Owner    string
	Holder   *actor.PID
}

// IPAMUnclaim ends an endpoint's lease: with Release the addresses are
// freed, without it (delete with NoIPRelease) they stay reserved for their
// owner, without expiry, until released or claimed again. Reply:
// *IPAMResult.
type IPAMUnclaim struct {
	Endpoint endpoint.ID
	IPs      []netip.Addr
	Release  bool
}

// IPAMResult answers IPAMClaim and IPAMUnclaim.
type IPAMResult struct {
	Err error
}
