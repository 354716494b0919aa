package datapath

import (
	"net/netip"
	"strconv"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// Drop reasons reported by the endpoint programs (bpf/endpoint.h).
const (
	// DropPolicy: no policy entry allows a new connection.
	DropPolicy = "policy-denied"
	// DropPolicyDeny: a deny entry (ingressDeny, egressDeny) matches a
	// new connection, whatever allows it.
	DropPolicyDeny = "policy-deny-rule"
	// DropPolicyAudit is no drop: an endpoint in policy audit mode sent
	// or received a new connection its policy (or a deny entry) would
	// drop; it passed, counted and reported with the verdict audit.
	DropPolicyAudit = "policy-audit"
	// DropFragment: a non-first fragment (no ports) that no L3-only or
	// protocol-wide entry allows.
	DropFragment = "fragment"
	// DropMalformed: a truncated or unparseable IP header in an enforced
	// direction.
	DropMalformed = "malformed"
	// DropUnknownL3: a frame from the pod that is not an untagged IPv4,
	// IPv6 or ARP frame (any VLAN tag included: the kernel strips
	// priority tags after TC), whether egress is enforced or not; a frame
	// to the pod neither IP nor ARP, in an enforced ingress; and a
	// non-IP frame out of the tunnel (endpoint 0).
	DropUnknownL3 = "unknown-l3"
	// DropNoBackend: a new connection to a service frontend without
	// backends (bpf/lb.h).
	DropNoBackend = "no-backend"
	// DropProxy: a packet redirected to an L7 or DNS proxy port on which
	// no socket listens (the proxy is down; the port fails closed).
	DropProxy = "proxy-unavailable"
	// DropNoRoute: a NodePort packet translated on the uplink (or a
	// backend's reply to it) whose destination the FIB cannot route
	// (bpf/nodeport.h).
	DropNoRoute = "no-route"
	// DropNATExhausted: a new NodePort connection to a remote backend
	// found no free SNAT port.
	DropNATExhausted = "nat-exhausted"
	// DropNoEndpoint: a frame on an interface running the endpoint
	// programs without an endpoint entry for its ifindex (or whose
	// endpoint has no policy maps): dropped, counted under endpoint 0.
	DropNoEndpoint = "no-endpoint"
	// DropInvalidSource: a packet from the pod whose source address is
	// not the endpoint's address of its family (Cilium's "Invalid source
	// ip"), of a family the endpoint has no address of, or an ARP frame
	// whose sender is not its IPv4 address: a pod cannot pose as
	// another. Essential ICMPv6 (neighbour discovery, MLD, errors) from
	// an IPv6 link-local source or :: passes.
	DropInvalidSource = "invalid-source"
	// DropTunnelPort: a UDP datagram from the pod to the node's tunnel
	// port (tunnel mode): a pod could otherwise write a VXLAN header with
	// an identity of its choosing (Cilium's fix of CVE-2019-13119).
	DropTunnelPort = "tunnel-port"
	// DropUnknownNode: a packet out of the tunnel whose outer source is
	// no known node's address (counted under endpoint 0, ingress).
	DropUnknownNode = "tunnel-unknown-node"
	// DropTunnelSource: a packet out of the tunnel whose inner source is
	// neither in the sending node's pod CIDRs nor one of its addresses
	// (endpoint 0, ingress).
	DropTunnelSource = "tunnel-invalid-source"
	// DropTunnelIdentity: a packet out of the tunnel whose VNI is a
	// reserved identity the sending side never puts there (host above
	// all; endpoint 0, ingress).
	DropTunnelIdentity = "tunnel-reserved-identity"
	// DropUnknownPod: in an enforced direction, a peer address in the
	// node's or the cluster's pod CIDRs that the ipcache holds no entry
	// of (it was full, --ipcache-max): a pod whose identity is unknown,
	// so no rule can be checked; fail closed.
	DropUnknownPod = "unknown-pod"
)

// dropReasons maps the programs' reason numbers to names.
var dropReasons = map[uint8]string{1: DropPolicy, 2: DropFragment, 3: DropMalformed, 4: DropUnknownL3, 5: DropNoBackend, 6: DropProxy, 7: DropNoEndpoint,
	8: DropInvalidSource, 9: DropTunnelPort, 10: DropUnknownNode, 11: DropTunnelSource, 12: DropTunnelIdentity, 13: DropPolicyDeny, 14: DropPolicyAudit,
	16: DropNoRoute, 17: DropNATExhausted, 18: DropUnknownPod}

// dropReasonName returns the name of reason, or "reason-<n>".
func dropReasonName(reason uint8) string {
	if s, ok := dropReasons[reason]; ok {
		return s
	}
	return "reason-" + strconv.Itoa(int(reason))
}

// DropEvent is one packet an endpoint program dropped.
type DropEvent struct {
	// Endpoint is the endpoint whose program dropped the packet.
	Endpoint endpoint.ID
	// Reason is one of the Drop* names.
	Reason string
	// Dir is the direction relative to the endpoint.
	Dir policy.Direction
	// Src and Dst are the packet's addresses (invalid for non-IP frames).
	Src, Dst netip.Addr
	// SrcPort and DstPort are the transport ports (the echo identifier
	// for ICMP echo; 0 for fragments and other protocols).
	SrcPort, DstPort uint16
	// Proto is the IP protocol number.
	Proto uint8
	// TCPFlags is the TCP header's flags byte (TCP only; 0 for later
	// fragments and other protocols).
	TCPFlags uint8
	// PeerIdentity is the identity of the other side (0 when the drop
	// happened before it was looked up).
	PeerIdentity identity.NumericIdentity
	// Length is the packet's length in bytes.
	Length uint32
	// Time is when the program dropped it.
	Time time.Time
}

// DropKey identifies one drop counter.
type DropKey struct {
	Endpoint endpoint.ID
	Reason   string
	Dir      policy.Direction
}

// Counter counts packets and bytes.
type Counter struct {
	Packets uint64
	Bytes   uint64
}
