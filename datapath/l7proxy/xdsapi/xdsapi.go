// Package xdsapi is what the agent's xDS server and the membrane-proxy
// process agree on: the resources (one endpoint's L7 entries, or the
// ipcache) as JSON documents in google.protobuf.BytesValue, their names
// and versions, and the access record the proxy sends back per request.
package xdsapi

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// TypeURL is the xDS type of every resource the proxy subscribes to.
const TypeURL = "type.googleapis.com/google.protobuf.BytesValue"

// Resource names: "ep/<id>" per endpoint, IPCacheResource/<shard> for
// the ipcache's shards; versions are VersionPrefix and a number.
const (
	endpointPrefix  = "ep/"
	IPCacheResource = "ipcache"
	SecretsResource = "secrets"
	VersionPrefix   = "v"
)

// EndpointPolicy is the proxy's configuration for one endpoint: its
// addresses and the L7 entries of its policy (ingress entries decide
// traffic to IPs, egress entries traffic from them).
type EndpointPolicy struct {
	ID  uint64           `json:"id"`
	IPs []netip.Addr     `json:"ips"`
	L7  []policy.L7Entry `json:"l7"`
}

// IPCache maps prefixes to security identities (the proxy finds a
// connection's peer identity with it). It is published in IPCacheShards
// resources (IPCacheShardName), each holding the prefixes of one shard
// (IPCacheShardOf), so that a batch of changes re-encodes, sends and
// decodes only the shards it touched instead of the whole ipcache.
type IPCache struct {
	Shard   int                                       `json:"shard"`
	Entries map[netip.Prefix]identity.NumericIdentity `json:"entries"`
}

// IPCacheShards is the number of ipcache resources.
const IPCacheShards = 16

// IPCacheShardName is shard k's resource name.
func IPCacheShardName(k int) string { return IPCacheResource + "/" + strconv.Itoa(k) }

// IPCacheShardOf returns the shard holding p (FNV-1a of its address and
// length; p as the ipcache holds it: masked, unmapped).
func IPCacheShardOf(p netip.Prefix) int {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	a := p.Addr().As16()
	for _, b := range a {
		h = (h ^ uint64(b)) * prime
	}
	h = (h ^ uint64(p.Bits())) * prime
	return int(h % IPCacheShards)
}

// Check reports an ipcache resource whose shard is out of range or
// holds a prefix of another shard (a lookup would miss it).
func (c *IPCache) Check() error {
	if c.Shard < 0 || c.Shard >= IPCacheShards {
		return fmt.Errorf("ipcache shard %d out of [0, %d)", c.Shard, IPCacheShards)
	}
	for p := range c.Entries {
		if k := IPCacheShardOf(p); k != c.Shard {
			return fmt.Errorf("ipcache shard %d holds %s of shard %d", c.Shard, p, k)
		}
	}
	return nil
}

// SplitIPCache splits entries into the shards' resources.
func SplitIPCache(entries map[netip.Prefix]identity.NumericIdentity) [IPCacheShards]IPCache {
	var out [IPCacheShards]IPCache
	for k := range out {
		out[k] = IPCache{Shard: k, Entries: map[netip.Prefix]identity.NumericIdentity{}}
	}
	for p, id := range entries {
		out[IPCacheShardOf(p)].Entries[p] = id
	}
	return out
}

// Secrets are the values of the header secrets policies name ("ns/name"
// to the value), sent apart from the endpoints' rules as Envoy's SDS
// does: a policy and an endpoint resource name a secret, never hold its
// value. String and LogValue redact the values.
type Secrets struct {
	Values map[string]string `json:"values"`
}

// String names the secrets, never their values.
func (s Secrets) String() string {
	names := slices.Sorted(maps.Keys(s.Values))
	return fmt.Sprintf("secrets %v (values redacted)", names)
}

// LogValue is String (slog).
func (s Secrets) LogValue() slog.Value { return slog.StringValue(s.String()) }

// Resource is the document in every resource (sotw responses carry no
// resource names): exactly one of its fields is set.
type Resource struct {
	Endpoint *EndpointPolicy `json:"endpoint,omitempty"`
	IPCache  *IPCache        `json:"ipcache,omitempty"`
	Secrets  *Secrets        `json:"secrets,omitempty"`
}

// EndpointName is endpoint id's resource name.
func EndpointName(id uint64) string { return endpointPrefix + strconv.FormatUint(id, 10) }

// Encode wraps a Resource as the BytesValue the xDS cache serves.
func Encode(v any) (*wrapperspb.BytesValue, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode proxy resource: %w", err)
	}
	return wrapperspb.Bytes(b), nil
}

// ParseVersion parses "v<N>"; "" (nothing applied yet) is 0.
func ParseVersion(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(strings.TrimPrefix(s, VersionPrefix), 10, 64)
	if err != nil || !strings.HasPrefix(s, VersionPrefix) {
		return 0, fmt.Errorf("version %q is not v<N>", s)
	}
	return n, nil
}

// AccessRecord is one request the proxy decided. The proxy sends each
// as a JSON datagram to the agent's access socket (AccessServer); the
// agent publishes it (events, metrics). Fields as in events.L7.
type AccessRecord struct {
	Time time.Time `json:"time"`
	// Endpoint is the endpoint whose rules decided (0: none had rules),
	// Direction theirs ("ingress", "egress").
	Endpoint    uint64         `json:"endpoint"`
	Direction   string         `json:"direction"`
	Src         netip.AddrPort `json:"src"`
	Dst         netip.AddrPort `json:"dst"`
	SrcIdentity uint32         `json:"srcIdentity"`
	DstIdentity uint32         `json:"dstIdentity"`
	Method      string         `json:"method,omitempty"`
	Path        string         `json:"path,omitempty"`
	Host        string         `json:"host,omitempty"`
	Allowed     bool           `json:"allowed"`
	Reason      string         `json:"reason,omitempty"`
	// Version is the request's protocol ("HTTP/1.1", "HTTP/2.0"); GRPC
	// says it is a gRPC call (content-type application/grpc).
	Version string `json:"version,omitempty"`
	GRPC    bool   `json:"grpc,omitempty"`
	// Code is the HTTP status of the proxy's denial (403; 0 when
	// forwarded); GRPCStatus the gRPC status a denied gRPC call got
	// instead, in an HTTP 200 (7, PERMISSION_DENIED).
	Code       int `json:"code,omitempty"`
	GRPCStatus int `json:"grpcStatus,omitempty"`
	// HeaderMismatches are the allowing rules' headerMatches the request
	// did not satisfy, with their action ("LOG X-Token", "ADD X-Env"),
	// applied before it was forwarded.
	HeaderMismatches []string `json:"headerMismatches,omitempty"`
	// Kafka is set for a Kafka request (the Kafka listener's records);
	// the HTTP fields are then empty.
	Kafka *KafkaAccess `json:"kafka,omitempty"`
}

// KafkaAccess is what an access record says of one Kafka request.
type KafkaAccess struct {
	// APIKey is Cilium's name of the request's API key ("produce",
	// "fetch"; the number for keys it does not name).
	APIKey        string   `json:"apiKey"`
	APIVersion    int16    `json:"apiVersion"`
	CorrelationID int32    `json:"correlationID"`
	ClientID      string   `json:"clientID,omitempty"`
	Topics        []string `json:"topics,omitempty"`
	// ErrorCode is the Kafka error of the proxy's denial (29,
	// TOPIC_AUTHORIZATION_FAILED); 0 when forwarded or when the
	// connection was closed instead (an unparsable request).
	ErrorCode int16 `json:"errorCode,omitempty"`
}

// MaxAccessDatagram bounds one record (the path and host are the
// client's; longer records are cut to their first bytes by truncation
// of the path).
const MaxAccessDatagram = 16 << 10
