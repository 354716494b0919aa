package messages

import (
	"net/netip"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// PolicyFQDNLearn is sent by the front door (LearnFQDN) to the policy
// actor with a DNS answer of endpoint Endpoint. Reply:
// *PolicyFQDNLearned, after the learned addresses changed the selectors
// (the ipcache actor has the CIDR changes in its mailbox and the
// endpoints whose policy changed were told to regenerate, except
// Endpoint, whose wait the front door runs).
type PolicyFQDNLearn struct {
	Endpoint endpoint.ID
	Identity identity.NumericIdentity
	Name     string
	IPs      []netip.Addr
	TTL      time.Duration
}

// PolicyFQDNLearned answers PolicyFQDNLearn: Policy is the identity's
// policy after the change (the endpoint regenerates unless it realised
// exactly that one).
type PolicyFQDNLearned struct {
	Policy *policy.MapState
	Err    error
}

// FQDNCacheDump asks the policy actor for the learned names. Reply:
// *FQDNCacheEntries.
type FQDNCacheDump struct{}

// FQDNCacheEntries answers FQDNCacheDump.
type FQDNCacheEntries struct {
	Entries []fqdn.Entry
}

// IPCacheBarrier asks the ipcache actor to answer once the datapath
// holds every change the actor received before it. Reply:
// *IPCacheBarrierDone with the same Seq.
type IPCacheBarrier struct {
	Seq uint64
}

// IPCacheBarrierDone answers IPCacheBarrier.
type IPCacheBarrierDone struct {
	Seq uint64
}
