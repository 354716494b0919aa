package datapath

import (
	"net/netip"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// Flow verdicts of the endpoint programs' flow reports (bpf/endpoint.h
// FLOW_*). Drops are DropEvents.
const (
	// FlowForwarded: the connection's first packet passed to its
	// destination.
	FlowForwarded = "forwarded"
	// FlowRedirected: it was handed to the L7 or DNS proxy (ProxyPort).
	FlowRedirected = "redirected"
)

// flowVerdicts maps the programs' FLOW_* numbers to names.
var flowVerdicts = map[uint8]string{1: FlowForwarded, 2: FlowRedirected}

// Flow flags (bpf/endpoint.h FLOW_F_*).
const (
	flowTranslated = 1
	flowEnforced   = 2
	flowHairpin    = 4
)

// FlowEvent is one flow report of the endpoint programs: the first
// packet of a new connection (when conntrack created its entry) and the
// verdict it got. Later packets of the connection report nothing.
type FlowEvent struct {
	// Endpoint is the endpoint whose program saw the connection, Identity
	// its identity.
	Endpoint endpoint.ID
	Identity identity.NumericIdentity
	// Verdict is FlowForwarded or FlowRedirected.
	Verdict string
	// Dir is the direction relative to the endpoint.
	Dir policy.Direction
	// Src and Dst are the packet's addresses; Dst is the backend of a
	// Service-translated connection (Frontend the address it was sent to).
	Src, Dst netip.Addr
	// SrcPort and DstPort are the transport ports (the echo identifier
	// for ICMP echo).
	SrcPort, DstPort uint16
	// Proto is the IP protocol number.
	Proto uint8
	// TCPFlags is the TCP header's flags byte (FIN 0x01, SYN 0x02, RST
	// 0x04, PSH 0x08, ACK 0x10, URG 0x20, ECE 0x40, CWR 0x80).
	TCPFlags uint8
	// PeerIdentity is the other side's identity.
	PeerIdentity identity.NumericIdentity
	// Frontend is the Service frontend (address and port before
	// translation) of a translated connection, invalid otherwise.
	Frontend netip.AddrPort
	// Hairpin: a Service sent the pod's connection back to itself.
	Hairpin bool
	// Enforced: the direction is policy-enforced (an entry allowed it);
	// otherwise it is allow-all.
	Enforced bool
	// ProxyPort is the proxy's port of a redirected connection.
	ProxyPort uint16
	// Length is the packet's length in bytes.
	Length uint32
	// Time is when the program saw it.
	Time time.Time
}

// FlowStats are the endpoint programs' flow counters, summed over CPUs.
type FlowStats struct {
	// Reported counts the flow reports written to the ring.
	Reported uint64
	// FlowsLost and DropsLost count the flow reports and drop
	// notifications lost because their ring buffer was full.
	FlowsLost, DropsLost uint64
}
