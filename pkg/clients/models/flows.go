package models

import "time"

// Flow is one flow of GET /v1/flows: a connection the endpoint programs
// saw (its first packet and verdict), a packet they dropped, or an L7 /
// DNS record of a proxied connection. A stable API.
type Flow struct {
	// Time is when the datapath saw the packet.
	Time time.Time `json:"time"`
	// Node is the node's name.
	Node string `json:"node,omitempty"`
	// Type is "l3-l4" (a connection or a drop), "l7" (an HTTP request the
	// proxy decided) or "dns" (a query the DNS proxy answered).
	Type string `json:"type"`
	// Verdict is "forwarded", "redirected" (to the L7 or DNS proxy),
	// "dropped", "audit" (audit mode: its policy would drop it; it
	// passed) or, for L7 and DNS records, "allowed" / "denied" / "error".
	Verdict string `json:"verdict"`
	// DropReason is the datapath's reason for a dropped (or audit) flow.
	DropReason string `json:"drop-reason,omitempty"`
	// Direction is "ingress" or "egress", relative to Endpoint.
	Direction string `json:"direction"`
	// Endpoint is the endpoint whose program reported it (0: none, e.g. a
	// drop on an interface without an endpoint).
	Endpoint uint16 `json:"endpoint,omitempty"`
	// Source and Destination are both sides.
	Source      FlowPeer `json:"source"`
	Destination FlowPeer `json:"destination"`
	// Protocol is "TCP", "UDP", "SCTP", "ICMP", "ICMPv6" or the number.
	Protocol string `json:"protocol,omitempty"`
	// TCPFlags are the first packet's flags ("SYN", "ACK", ...).
	TCPFlags []string `json:"tcp-flags,omitempty"`
	// Service is the Service frontend (address:port before translation)
	// of a translated connection; ServiceName its namespace/name when
	// known.
	Service     string `json:"service,omitempty"`
	ServiceName string `json:"service-name,omitempty"`
	// ProxyPort is the proxy port of a redirected connection.
	ProxyPort uint16 `json:"proxy-port,omitempty"`
	// Policies name the policies that allowed (a forwarded or redirected
	// connection in an enforced direction) or denied it, where the agent
	// can tell (re-evaluated in user space: the policy map keeps no rule
	// reference). PolicyMatch says which: "allow", "deny" (a deny rule)
	// or "default-deny" (no rule allows it; these policies make the
	// direction default-deny).
	Policies    []string `json:"policies,omitempty"`
	PolicyMatch string   `json:"policy-match,omitempty"`
	// Bytes is the packet's length.
	Bytes uint32 `json:"bytes,omitempty"`
	// L7 is the HTTP request of an "l7" flow, or the first one seen on a
	// redirected connection; DNS the query of a "dns" flow (or of a
	// redirected one).
	L7  *FlowL7  `json:"l7,omitempty"`
	DNS *FlowDNS `json:"dns,omitempty"`
}

// FlowPeer is one side of a flow.
type FlowPeer struct {
	// IP and Port are the address and transport port (the echo
	// identifier for ICMP echo).
	IP   string `json:"ip,omitempty"`
	Port uint16 `json:"port,omitempty"`
	// Identity is the security identity (0: not known).
	Identity uint32 `json:"identity,omitempty"`
	// Namespace and Pod name the pod (a local endpoint, or the namespace
	// from the identity's labels); Labels are the identity's labels.
	Namespace string   `json:"namespace,omitempty"`
	Pod       string   `json:"pod,omitempty"`
	Labels    []string `json:"labels,omitempty"`
}

// FlowL7 is an HTTP request of a proxied connection (an l7-access event).
type FlowL7 struct {
	Protocol string `json:"protocol"`
	Verdict  string `json:"verdict"`
	Method   string `json:"method,omitempty"`
	Path     string `json:"path,omitempty"`
	Host     string `json:"host,omitempty"`
	Code     int    `json:"code,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// Kafka is a Kafka request's (Protocol "kafka").
	Kafka *FlowKafka `json:"kafka,omitempty"`
}

// FlowKafka is a Kafka request of a proxied connection: API key
// (Cilium's name), version, correlation ID, client ID, topics and the
// error code of a denial (29, TOPIC_AUTHORIZATION_FAILED).
type FlowKafka struct {
	APIKey        string   `json:"apiKey,omitempty"`
	APIVersion    int16    `json:"apiVersion"`
	CorrelationID int32    `json:"correlationID"`
	ClientID      string   `json:"clientID,omitempty"`
	Topics        []string `json:"topics,omitempty"`
	ErrorCode     int16    `json:"errorCode,omitempty"`
}

// FlowDNS is a DNS query of a proxied connection (a dns-query event).
type FlowDNS struct {
	Query   string   `json:"query"`
	QType   string   `json:"qtype,omitempty"`
	Verdict string   `json:"verdict"`
	RCode   string   `json:"rcode,omitempty"`
	IPs     []string `json:"ips,omitempty"`
}

// FlowStats are the flow pipeline's counters: what was seen and what was
// lost where. Shown in GET /v1/flows answers and GET /v1/status.
type FlowStats struct {
	// Enabled: the endpoint programs report connections (--flows).
	Enabled bool `json:"enabled"`
	// Capacity is the ring's size (--flows-buffer), Buffered what it
	// holds now, Seen how many flows entered it since the agent started.
	Capacity int    `json:"capacity"`
	Buffered int    `json:"buffered"`
	Seen     uint64 `json:"seen"`
	// RateLimited counts flows not recorded because more than
	// --flows-rate arrived in a second.
	RateLimited uint64 `json:"rate-limited"`
	// DatapathLost counts flow reports, DropsLost drop notifications, the
	// endpoint programs could not write because the ring buffer between
	// kernel and agent was full.
	DatapathLost uint64 `json:"datapath-lost"`
	DropsLost    uint64 `json:"drops-lost"`
	// Followers are the open follow streams; FollowerDrops counts the
	// streams ended because their client read too slowly, FollowerLost
	// the flows those streams missed.
	Followers     int    `json:"followers"`
	FollowerDrops uint64 `json:"follower-drops"`
	FollowerLost  uint64 `json:"follower-lost"`
}

// FlowsResponse is the body of GET /v1/flows (without follow).
type FlowsResponse struct {
	Flows []Flow    `json:"flows"`
	Stats FlowStats `json:"stats"`
}

// FlowStreamLine is one line of GET /v1/flows?follow=true (NDJSON): a
// flow, or, last, why the stream ended (Error) with the stats.
type FlowStreamLine struct {
	Flow  *Flow      `json:"flow,omitempty"`
	Error string     `json:"error,omitempty"`
	Stats *FlowStats `json:"stats,omitempty"`
}
