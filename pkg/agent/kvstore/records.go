package kvstore

import (
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"slices"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// endpointRecord is the value of state/endpoints/v1/<node>/<id>: a local
// endpoint of <node> as other nodes' ipcaches need it. Stable wire form.
type endpointRecord struct {
	IPs      []netip.Addr `json:"ips"`
	Identity uint32       `json:"identity"`
	Node     string       `json:"node"`
	NodeIP   netip.Addr   `json:"nodeIP,omitzero"`
	// NamedPorts are the pod's named container ports, "name/PROTO=port"
	// (policy.ParseNamedPort); ports is their decoded form.
	NamedPorts []string          `json:"namedPorts,omitempty"`
	ports      policy.NamedPorts `json:"-"`
}

// nodeRecord is the value of state/nodes/v1/<node>. Stable wire form.
type nodeRecord struct {
	Name     string         `json:"name"`
	Addrs    []netip.Addr   `json:"addrs"`
	PodCIDRs []netip.Prefix `json:"podCIDRs"`
	// HealthIPs are the node's health endpoint addresses (Cilium's
	// CiliumNode spec.health); the other nodes believe them only inside
	// PodCIDRs (the nodes actor).
	HealthIPs []netip.Addr `json:"healthIPs,omitempty"`
}

// heldRecord is an endpoint record as the mirror keeps it, one per
// remote endpoint (heap per remote endpoint is a target): the decoded
// fields without the wire form of the named ports, the node's name
// sharing the record key's bytes (hold). 104 bytes (the 112-byte size
// class).
type heldRecord struct {
	ips    []netip.Addr
	nodeIP netip.Addr
	ports  policy.NamedPorts
	node   string
	// rev is the record's etcd ModRevision: when it was last written,
	// which orders the claims of one address (Mirror.claimBefore).
	rev      int64
	identity uint32
}

// hold returns r, written at etcd revision rev, as the mirror keeps it
// under record key key ("<node>/<id>"): a node name equal to the key's
// is the key's substring, not a string of its own.
func hold(key string, r endpointRecord, rev int64) *heldRecord {
	node := r.Node
	if kn := recNode(key); kn == node {
		node = kn
	}
	return &heldRecord{ips: r.IPs, nodeIP: r.NodeIP, ports: r.ports, node: node, rev: rev, identity: r.Identity}
}

// sameAs reports whether r says what o says (their revisions aside).
func (r *heldRecord) sameAs(o *heldRecord) bool {
	return r.identity == o.identity && r.node == o.node && r.nodeIP == o.nodeIP && slices.Equal(r.ips, o.ips) && r.ports.Equal(o.ports)
}

func (r *heldRecord) remote() endpoint.Remote {
	return endpoint.Remote{IPs: r.ips, Identity: identity.NumericIdentity(r.identity), Node: r.node, NodeIP: r.nodeIP, NamedPorts: r.ports}
}

// equal reports whether r and o are the same record.
func (r nodeRecord) equal(o nodeRecord) bool {
	return r.Name == o.Name && slices.Equal(r.Addrs, o.Addrs) && slices.Equal(r.PodCIDRs, o.PodCIDRs) && slices.Equal(r.HealthIPs, o.HealthIPs)
}

func (r nodeRecord) remoteNode() datapath.RemoteNode {
	return datapath.RemoteNode{Name: r.Name, Addrs: r.Addrs, PodCIDRs: r.PodCIDRs, HealthIPs: r.HealthIPs}
}

// decodeEndpoint reads and checks a record another node wrote. Every
// node's mirror decodes every record (at churn C over N nodes, 2C(N-1)
// per second cluster-wide): the form the publisher writes is read
// directly (parseEndpointRecord), anything else by encoding/json.
func decodeEndpoint(v []byte) (endpointRecord, error) {
	r, ok := parseEndpointRecord(v)
	if !ok {
		r = endpointRecord{}
		if err := json.Unmarshal(v, &r); err != nil {
			return r, fmt.Errorf("decode endpoint record: %w", err)
		}
	}
	if len(r.IPs) == 0 || len(r.IPs) > 2 {
		return r, fmt.Errorf("decode endpoint record: %d addresses", len(r.IPs))
	}
	for _, ip := range r.IPs {
		if !ip.IsValid() || ip.IsUnspecified() {
			return r, fmt.Errorf("decode endpoint record: address %s", ip)
		}
	}
	if r.Identity == 0 || r.Identity > uint32(maxID) {
		return r, fmt.Errorf("decode endpoint record: identity %d", r.Identity)
	}
	ps := make([]policy.NamedPort, 0, len(r.NamedPorts))
	for _, s := range r.NamedPorts {
		p, err := policy.ParseNamedPort(s)
		if err != nil {
			return r, fmt.Errorf("decode endpoint record: %w", err)
		}
		ps = append(ps, p)
	}
	ports, err := policy.NewNamedPorts(ps)
	if err != nil {
		return r, fmt.Errorf("decode endpoint record: %w", err)
	}
	r.ports = ports
	return r, nil
}

// decodeNode reads and checks a node record.
func decodeNode(v []byte) (nodeRecord, error) {
	var r nodeRecord
	if err := json.Unmarshal(v, &r); err != nil {
		return r, fmt.Errorf("decode node record: %w", err)
	}
	if len(r.Name) > 253 || !nodeName.MatchString(r.Name) {
		return r, fmt.Errorf("decode node record: name %q", r.Name)
	}
	for _, a := range r.Addrs {
		if !a.IsValid() {
			return r, fmt.Errorf("decode node record %s: invalid address", r.Name)
		}
	}
	for _, p := range r.PodCIDRs {
		if !p.IsValid() {
			return r, fmt.Errorf("decode node record %s: invalid pod CIDR", r.Name)
		}
	}
	if len(r.HealthIPs) > 2 {
		return r, fmt.Errorf("decode node record %s: %d health addresses", r.Name, len(r.HealthIPs))
	}
	for _, a := range r.HealthIPs {
		if !a.IsValid() || a.IsUnspecified() {
			return r, fmt.Errorf("decode node record %s: invalid health address", r.Name)
		}
	}
	return r, nil
}

// parseEndpointRecord reads v if it is exactly what json.Marshal writes
// for an endpointRecord (the publisher's form: the fields in order, no
// space, strings of printable ASCII without escapes, identity a plain
// decimal) and returns what json.Unmarshal would; ok is false for any
// other form, valid JSON or not, which the caller hands to json.Unmarshal.
// It is about five times cheaper than json.Unmarshal.
func parseEndpointRecord(v []byte) (r endpointRecord, ok bool) {
	p := recParser{v: v}
	if !p.lit(`{"ips":[`) {
		return r, false
	}
	var ips [2]netip.Addr
	n := 0
	for {
		a, ok := p.addr()
		if !ok || n == len(ips) {
			return r, false
		}
		ips[n], n = a, n+1
		if p.lit(`]`) {
			break
		}
		if !p.lit(`,`) {
			return r, false
		}
	}
	r.IPs = append(make([]netip.Addr, 0, n), ips[:n]...)
	if !p.lit(`,"identity":`) {
		return r, false
	}
	if r.Identity, ok = p.uint32(); !ok || !p.lit(`,"node":`) {
		return r, false
	}
	if r.Node, ok = p.str(); !ok {
		return r, false
	}
	if p.lit(`,"nodeIP":`) {
		if r.NodeIP, ok = p.addr(); !ok {
			return r, false
		}
	}
	if p.lit(`,"namedPorts":[`) {
		for {
			s, ok := p.str()
			if !ok {
				return r, false
			}
			r.NamedPorts = append(r.NamedPorts, s)
			if p.lit(`]`) {
				break
			}
			if !p.lit(`,`) {
				return r, false
			}
		}
	}
	return r, p.lit(`}`) && p.i == len(p.v)
}

// recParser reads parseEndpointRecord's input.
type recParser struct {
	v []byte
	i int
}

// lit consumes s if the input goes on with it.
func (p *recParser) lit(s string) bool {
	if len(p.v)-p.i < len(s) || string(p.v[p.i:p.i+len(s)]) != s {
		return false
	}
	p.i += len(s)
	return true
}

// str consumes a string of printable ASCII without escapes (what JSON
// decoding would return unchanged).
func (p *recParser) str() (string, bool) {
	if !p.lit(`"`) {
		return "", false
	}
	for j := p.i; j < len(p.v); j++ {
		switch c := p.v[j]; {
		case c == '"':
			s := string(p.v[p.i:j])
			p.i = j + 1
			return s, true
		case c == '\\' || c < 0x20 || c >= 0x7f:
			return "", false
		}
	}
	return "", false
}

// addr consumes an address string as netip.Addr's UnmarshalText reads
// it (empty: the zero Addr).
func (p *recParser) addr() (netip.Addr, bool) {
	s, ok := p.str()
	if !ok {
		return netip.Addr{}, false
	}
	if s == "" {
		return netip.Addr{}, true
	}
	a, err := netip.ParseAddr(s)
	return a, err == nil
}

// uint32 consumes a JSON number that is a uint32 written plainly (no
// sign, fraction, exponent or leading zero).
func (p *recParser) uint32() (uint32, bool) {
	j := p.i
	var n uint64
	for j < len(p.v) && p.v[j] >= '0' && p.v[j] <= '9' {
		n = n*10 + uint64(p.v[j]-'0')
		if n > math.MaxUint32 {
			return 0, false
		}
		j++
	}
	if j == p.i || (p.v[p.i] == '0' && j-p.i > 1) {
		return 0, false
	}
	p.i = j
	return uint32(n), true
}
