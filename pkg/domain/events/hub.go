package events

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Type names an event.
type Type string

// Event types.
const (
	EndpointCreated      Type = "endpoint-created"
	EndpointStateChanged Type = "endpoint-state-changed"
	EndpointDeleted      Type = "endpoint-deleted"
	IdentityAllocated    Type = "identity-allocated"
	IdentityReleased     Type = "identity-released"
	// IdentityWaiting: a label set waits for the cluster identity store
	// (unreachable); Labels and Message say which and why.
	IdentityWaiting Type = "identity-waiting"
	// IdentityRenumbered: the cluster identity store numbers a label set
	// in use here differently (its earlier number was collected and
	// another node numbered the labels anew); the node's endpoints move
	// to the store's number (Identity), Message names both.
	IdentityRenumbered Type = "identity-renumbered"
	PolicyRevision     Type = "policy-revision"
	// PolicyRefused: the agent refused a Kubernetes policy object, or
	// parts of it (then the rest is in force and its pods stay
	// isolated); Namespace names the policy's namespace and Message the
	// policy and the refused fields.
	PolicyRefused Type = "policy-refused"
	DatapathDrop  Type = "datapath-drop"
	// PolicyVerdict is a packet of an endpoint in policy audit mode that
	// its policy would have dropped and that passed (Event.Drop, with
	// Verdict "audit" and Reason "policy-audit").
	PolicyVerdict Type = "policy-verdict"
	// DNSQuery is a query the DNS proxy answered or refused (Event.DNS);
	// FQDNExpired: a name's learned addresses reached their TTL.
	DNSQuery    Type = "dns-query"
	FQDNExpired Type = "fqdn-expired"
	// L7Access is one request an L7 proxy decided (Event.L7).
	L7Access Type = "l7-access"
	// NodeHealth: a remote node's reachability changed (Node, State,
	// PrevState; Message names the failing probes).
	NodeHealth Type = "node-health"
	// StateDirHealth: the state directory's health changed (State "ok"
	// or its cause: read-only, disk-full, io-error, failing; PrevState;
	// Message the error).
	StateDirHealth Type = "state-dir-health"
	// BPFPinsRepaired: the agent found BPF pins removed under it and
	// pinned them again (State "repaired") or could not (State "failed");
	// Message says how many and which.
	BPFPinsRepaired Type = "bpf-pins-repaired"
	// Missed is the marker a subscriber gets when the ring overwrote
	// events it had not read yet; Event.Missed says how many.
	Missed Type = "missed"
)

// Types lists every publishable type (not Missed), for filters and docs.
var Types = []Type{EndpointCreated, EndpointStateChanged, EndpointDeleted, IdentityAllocated, IdentityReleased, IdentityWaiting, IdentityRenumbered, PolicyRevision, PolicyRefused, DatapathDrop,
	PolicyVerdict, L7Access, DNSQuery, FQDNExpired, NodeHealth, StateDirHealth, BPFPinsRepaired}

// Event is one event. Publishers fill Type and the fields that apply; the
// hub sets Seq and, when zero, Time.
type Event struct {
	// Seq is the hub's sequence number, from 1, without gaps.
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	Type Type      `json:"type"`
	// Endpoint is the endpoint ID, for endpoint events and drops.
	Endpoint uint16 `json:"endpoint,omitempty"`
	// Namespace and Pod name the endpoint's pod.
	Namespace string `json:"namespace,omitempty"`
	Pod       string `json:"pod,omitempty"`
	// Node is the remote node (node-health events).
	Node string `json:"node,omitempty"`
	// State is the endpoint's (node's) new state, PrevState the one it left.
	State     string `json:"state,omitempty"`
	PrevState string `json:"prev-state,omitempty"`
	// Identity is the numeric identity (identity events, endpoint events).
	Identity uint32 `json:"identity,omitempty"`
	// Labels of the identity.
	Labels []string `json:"labels,omitempty"`
	// Revision is the policy revision (policy-revision events).
	Revision uint64 `json:"revision,omitempty"`
	// Message is free text: the reason, a drop's summary.
	Message string `json:"message,omitempty"`
	// Missed is how many events a Missed marker stands for.
	Missed uint64 `json:"missed,omitempty"`
	// Drop describes the dropped packet (datapath-drop events).
	Drop *Drop `json:"drop,omitempty"`
	// DNS describes a query (dns-query events).
	DNS *DNS `json:"dns,omitempty"`
	// L7 describes the request (l7-access events).
	L7 *L7 `json:"l7,omitempty"`
}

// DNS is the query of a dns-query event; Event.Endpoint is the endpoint
// that asked.
type DNS struct {
	// Query is the queried name, QType its type ("A", "AAAA", ...).
	Query string `json:"query"`
	QType string `json:"qtype"`
	// Verdict is "allowed" (answered), "denied" (refused by rules.dns)
	// or "error" (the server failed or the answer could not be held).
	Verdict string `json:"verdict"`
	// RCode is the answer's response code ("NOERROR", "REFUSED", ...).
	RCode string `json:"rcode,omitempty"`
	// Server is the server the query was sent to (original destination).
	Server string `json:"server,omitempty"`
	// IPs are the answer's addresses, TTL its lowest TTL in seconds.
	IPs []string `json:"ips,omitempty"`
	TTL uint32   `json:"ttl,omitempty"`
	// Identity is the asking endpoint's identity.
	Identity uint32 `json:"identity,omitempty"`
	// Error says why, for the "error" verdict.
	Error string `json:"error,omitempty"`
}

// L7 is the request of an l7-access event; Event.Endpoint is the
// endpoint whose rules decided it (the destination for ingress rules,
// the source for egress rules).
type L7 struct {
	// Protocol is the proxy's parser ("http", "kafka").
	Protocol string `json:"protocol"`
	// Verdict is "allowed" or "denied"; Reason says why a request was
	// denied.
	Verdict string `json:"verdict"`
	Reason  string `json:"reason,omitempty"`
	// Direction is "ingress" or "egress", relative to Event.Endpoint.
	Direction string `json:"direction,omitempty"`
	// Src and Dst are the connection's addresses (host:port), the
	// destination as the client addressed it.
	Src string `json:"src"`
	Dst string `json:"dst"`
	// SrcIdentity and DstIdentity are both sides' identities.
	SrcIdentity uint32 `json:"src-identity"`
	DstIdentity uint32 `json:"dst-identity"`
	// Method, Path and Host are the HTTP request's.
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
	Host   string `json:"host,omitempty"`
	// HTTPVersion is the request's protocol ("HTTP/1.1", "HTTP/2.0");
	// GRPC says it is a gRPC call.
	HTTPVersion string `json:"http-version,omitempty"`
	GRPC        bool   `json:"grpc,omitempty"`
	// Code is the HTTP status of a denial (403), GRPCStatus the gRPC
	// status a denied gRPC call got instead (7, PERMISSION_DENIED).
	Code       int `json:"code,omitempty"`
	GRPCStatus int `json:"grpc-status,omitempty"`
	// HeaderMismatches are the allowing rules' headerMatches the request
	// did not satisfy, with the action taken ("LOG X-Token").
	HeaderMismatches []string `json:"header-mismatches,omitempty"`
	// Kafka is a Kafka request's (Protocol "kafka").
	Kafka *KafkaL7 `json:"kafka,omitempty"`
}

// Drop is the packet of a datapath-drop event; Event.Endpoint is the
// endpoint whose program dropped it.
type Drop struct {
	// Reason is the datapath's drop reason ("policy-denied", "fragment",
	// "malformed", "unknown-l3", "invalid-source", ...: datapath/drops.go).
	Reason string `json:"reason"`
	// Direction is "ingress" or "egress", relative to the endpoint.
	Direction string `json:"direction"`
	// Src and Dst are the packet's addresses ("" for non-IP frames).
	Src string `json:"src,omitempty"`
	Dst string `json:"dst,omitempty"`
	// SrcPort and DstPort are the transport ports (the identifier for
	// ICMP echo; 0 for fragments and other protocols).
	SrcPort uint16 `json:"src-port,omitempty"`
	DstPort uint16 `json:"dst-port,omitempty"`
	// Proto is the IP protocol number (6 TCP, 17 UDP, ...).
	Proto uint8 `json:"proto,omitempty"`
	// PeerIdentity is the other side's identity (0: not looked up).
	PeerIdentity uint32 `json:"peer-identity,omitempty"`
	// Bytes is the packet's length.
	Bytes uint32 `json:"bytes,omitempty"`
	// Verdict is "audit" for a policy-verdict event (the packet passed:
	// its endpoint is in audit mode); empty for a drop.
	Verdict string `json:"verdict,omitempty"`
}

var (
	// ErrClosed is returned by Subscription.Next after Close.
	ErrClosed = errors.New("subscription closed")
)

// DefaultCapacity is the ring size used when New is given 0: at about
// 200 bytes per event, 8192 events are ~1.6 MiB and cover a burst of
// several thousand endpoint changes before a slow reader misses any.
const DefaultCapacity = 8192

// Hub is the ring buffer of recent events and the set of subscribers. The
// zero value is not usable; a nil *Hub accepts and drops publications, so
// components built without one need no checks.
type Hub struct {
	// mu guards ring, next and subs. It is held for O(1) work per
	// Publish (plus one non-blocking channel send per subscriber), never
	// across I/O, so publishing actors do not block.
	mu sync.Mutex
	// ring holds event Seq at index Seq % capacity. It starts small and
	// doubles as events come, up to capacity (a full ring allocated at
	// start was 1.75 MiB of live heap on an idle node, which the garbage
	// collector's goal multiplies); until it wraps, no index reaches its
	// length.
	ring     []Event
	capacity uint64
	next     uint64 // Seq of the next event; the first event is 1
	subs     map[*Subscription]struct{}
}

// initialRing is the ring's length before it grows.
const initialRing = 64

// New returns a hub keeping the last capacity events (DefaultCapacity if 0).
func New(capacity int) *Hub {
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	return &Hub{ring: make([]Event, min(capacity, initialRing)), capacity: uint64(capacity), next: 1, subs: make(map[*Subscription]struct{})}
}

// Publish records ev and wakes the subscribers. It never blocks.
func (h *Hub) Publish(ev Event) {
	if h == nil {
		return
	}
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	h.mu.Lock()
	ev.Seq = h.next
	slot := ev.Seq % h.capacity
	if slot >= uint64(len(h.ring)) {
		grown := make([]Event, min(h.capacity, 2*uint64(len(h.ring))))
		copy(grown, h.ring)
		h.ring = grown
	}
	h.ring[slot] = ev
	h.next++
	for s := range h.subs {
		select {
		case s.wake <- struct{}{}:
		default: // already signalled
		}
	}
	h.mu.Unlock()
}

// Last returns the sequence number of the latest event (0 if none).
func (h *Hub) Last() uint64 {
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.next - 1
}

// Subscribers returns how many subscriptions are open.
func (h *Hub) Subscribers() int {
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// Subscribe returns a subscription starting after the event with sequence
// number after: 0 means "only new events"; a client resuming with
// Last-Event-ID passes that ID and gets everything after it that the ring
// still holds, or a Missed marker first.
func (h *Hub) Subscribe(after uint64) *Subscription {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := &Subscription{h: h, wake: make(chan struct{}, 1), done: make(chan struct{})}
	s.cursor = h.next
	if after > 0 && after < h.next {
		s.cursor = after + 1
	}
	h.subs[s] = struct{}{}
	return s
}

// oldestLocked is the Seq of the oldest event the ring still holds.
func (h *Hub) oldestLocked() uint64 {
	if h.next <= h.capacity {
		return 1
	}
	return h.next - h.capacity
}

// Subscription reads events in order. It is used by one goroutine.
type Subscription struct {
	h      *Hub
	cursor uint64 // Seq of the next event to read; guarded by h.mu
	wake   chan struct{}
	done   chan struct{}
	once   sync.Once
}

// Next returns the next event, waiting for one until ctx ends or the
// subscription is closed. If the ring overwrote events this subscriber had
// not read, Next first returns a Missed marker whose Missed field counts
// them and whose Seq is the last missed one (a client resuming from it
// continues right after the gap).
func (s *Subscription) Next(ctx context.Context) (Event, error) {
	for {
		if ev, ok := s.poll(); ok {
			return ev, nil
		}
		select {
		case <-s.wake:
		case <-s.done:
			return Event{}, ErrClosed
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// Ready is signalled (at most one pending signal) when events arrive; a
// reader selecting on it must then call TryNext until it returns false.
func (s *Subscription) Ready() <-chan struct{} { return s.wake }

// TryNext returns the next event if one is ready, without waiting.
func (s *Subscription) TryNext() (Event, bool) { return s.poll() }

func (s *Subscription) poll() (Event, bool) {
	h := s.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if oldest := h.oldestLocked(); s.cursor < oldest {
		ev := Event{Seq: oldest - 1, Time: time.Now(), Type: Missed, Missed: oldest - s.cursor}
		s.cursor = oldest
		return ev, true
	}
	if s.cursor >= h.next {
		return Event{}, false
	}
	ev := h.ring[s.cursor%h.capacity]
	s.cursor++
	return ev, true
}

// Close ends the subscription; a waiting Next returns ErrClosed.
func (s *Subscription) Close() {
	s.once.Do(func() {
		s.h.mu.Lock()
		delete(s.h.subs, s)
		s.h.mu.Unlock()
		close(s.done)
	})
}

// KafkaL7 is what an l7-access event says of a Kafka request: its API
// key (Cilium's name: "produce", "fetch", ...), version, correlation
// ID, client ID and topics, and the Kafka error code of the proxy's
// denial (29, TOPIC_AUTHORIZATION_FAILED; 0 when forwarded, or when an
// unparsable request closed the connection).
type KafkaL7 struct {
	APIKey        string   `json:"api-key,omitempty"`
	APIVersion    int16    `json:"api-version"`
	CorrelationID int32    `json:"correlation-id"`
	ClientID      string   `json:"client-id,omitempty"`
	Topics        []string `json:"topics,omitempty"`
	ErrorCode     int16    `json:"error-code,omitempty"`
}
