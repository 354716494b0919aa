package l7proxy

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// TypeURL is the xDS type of every resource the proxy subscribes to.
const TypeURL = "type.googleapis.com/google.protobuf.BytesValue"

// Resource names: "ep/<id>" per endpoint, IPCacheResource for the ipcache.
const (
	endpointPrefix  = "ep/"
	IPCacheResource = "ipcache"
	versionPrefix   = "v"
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
// connection's peer identity with it).
type IPCache struct {
	Entries map[netip.Prefix]identity.NumericIdentity `json:"entries"`
}

// Resource is the document in every resource (sotw responses carry no
// resource names): exactly one of its fields is set.
type Resource struct {
	Endpoint *EndpointPolicy `json:"endpoint,omitempty"`
	IPCache  *IPCache        `json:"ipcache,omitempty"`
}

func endpointName(id uint64) string { return endpointPrefix + strconv.FormatUint(id, 10) }

func encode(v any) (*wrapperspb.BytesValue, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode proxy resource: %w", err)
	}
	return wrapperspb.Bytes(b), nil
}

// parseVersion parses "v<N>"; "" (nothing applied yet) is 0.
func parseVersion(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(strings.TrimPrefix(s, versionPrefix), 10, 64)
	if err != nil || !strings.HasPrefix(s, versionPrefix) {
		return 0, fmt.Errorf("version %q is not v<N>", s)
	}
	return n, nil
}
