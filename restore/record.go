package restore

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/ifname"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/domain/service"
)

// Version is the version of ep.json this agent writes and reads.
const Version = 1

var (
	// ErrUnknownVersion is returned for a record written by an
	// incompatible agent version.
	ErrUnknownVersion = errors.New("unknown state version")
	// ErrCorrupt is returned for a record that does not parse or validate.
	ErrCorrupt = errors.New("corrupt endpoint state")
	// ErrClosed is returned for requests submitted after Close.
	ErrClosed = errors.New("state store closed")
	// ErrBusy is returned for requests beyond the store's queue bound.
	ErrBusy = errors.New("state store queue full")
)

// Record is the on-disk form of an endpoint (ep.json).
type Record struct {
	Version  int           `json:"version"`
	Endpoint EndpointState `json:"endpoint"`
}

// EndpointState is everything needed to rebuild an endpoint.
type EndpointState struct {
	ID                     uint16   `json:"id"`
	ContainerID            string   `json:"container-id,omitempty"`
	ContainerName          string   `json:"container-name,omitempty"`
	ContainerInterfaceName string   `json:"container-interface-name,omitempty"`
	Namespace              string   `json:"k8s-namespace,omitempty"`
	PodName                string   `json:"k8s-pod-name,omitempty"`
	PodUID                 string   `json:"k8s-uid,omitempty"`
	Labels                 []string `json:"labels"`
	IPv4                   string   `json:"ipv4,omitempty"`
	IPv6                   string   `json:"ipv6,omitempty"`
	IfName                 string   `json:"interface-name,omitempty"`
	IfIndex                int      `json:"interface-index,omitempty"`
	MAC                    string   `json:"mac,omitempty"`
	HostMAC                string   `json:"host-mac,omitempty"`
	Netns                  string   `json:"netns,omitempty"`
	NamedPorts             []string `json:"named-ports,omitempty"`
	// Chained: the interface and addresses are another CNI plugin's
	// (endpoint.Endpoint.Chained).
	Chained bool `json:"chained,omitempty"`
	// PolicyAudit: the endpoint's policy audit mode
	// (endpoint.Endpoint.PolicyAudit), kept so that a restored endpoint
	// stays in audit mode before its pod is read again.
	PolicyAudit bool `json:"policy-audit-mode,omitempty"`
	// HostPorts are the pod's BPF port mappings, "[addr:]port/proto=port".
	HostPorts []string  `json:"host-ports,omitempty"`
	Identity  uint32    `json:"identity"`
	Revision  uint64    `json:"revision"`
	Created   time.Time `json:"created"`
}

// FromEndpoint builds the record of an endpoint.
func FromEndpoint(ep *endpoint.Endpoint) Record {
	st := EndpointState{
		ID: uint16(ep.ID), ContainerID: ep.ContainerID, ContainerName: ep.ContainerName,
		ContainerInterfaceName: ep.ContainerInterfaceName, Namespace: ep.Namespace, PodName: ep.PodName,
		PodUID: ep.PodUID, Labels: ep.Labels.Strings(), IfName: ep.IfName, IfIndex: ep.IfIndex,
		MAC: ep.MAC, HostMAC: ep.HostMAC, Netns: ep.Netns, Identity: uint32(ep.Identity),
		Revision: ep.DesiredRevision, Created: ep.Created, Chained: ep.Chained, PolicyAudit: ep.PolicyAudit,
	}
	if st.Labels == nil {
		st.Labels = []string{}
	}
	for _, p := range ep.NamedPorts {
		st.NamedPorts = append(st.NamedPorts, policy.NamedPorts{p}.String())
	}
	for _, h := range ep.HostPorts {
		st.HostPorts = append(st.HostPorts, h.String())
	}
	if ep.IPv4.IsValid() {
		st.IPv4 = ep.IPv4.String()
	}
	if ep.IPv6.IsValid() {
		st.IPv6 = ep.IPv6.String()
	}
	return Record{Version: Version, Endpoint: st}
}

// Decode parses and validates ep.json. Returns ErrUnknownVersion or
// ErrCorrupt, saying what is wrong.
func Decode(data []byte) (*endpoint.Endpoint, error) {
	var probe struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, fmt.Errorf("decode state: %v: %w", err, ErrCorrupt)
	}
	if probe.Version == nil {
		return nil, fmt.Errorf("decode state: no version: %w", ErrCorrupt)
	}
	if *probe.Version != Version {
		return nil, fmt.Errorf("decode state: version %d (this agent reads %d): %w", *probe.Version, Version, ErrUnknownVersion)
	}
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("decode state: %v: %w", err, ErrCorrupt)
	}
	return r.Endpoint.toEndpoint()
}

func (st EndpointState) toEndpoint() (*endpoint.Endpoint, error) {
	if st.ID == 0 {
		return nil, fmt.Errorf("decode state: endpoint id 0: %w", ErrCorrupt)
	}
	ls, err := labels.ParseSet(st.Labels)
	if err != nil {
		return nil, fmt.Errorf("decode state of endpoint %d: labels: %v: %w", st.ID, err, ErrCorrupt)
	}
	// The names reach sysctl paths and link deletions (the API refuses
	// others): a record naming the host's eth0 is corrupt, not obeyed. A
	// chained endpoint's interface is another plugin's, which the agent
	// never configures or deletes, only attaches programs to.
	if st.IfName != "" && !ifname.Managed(st.IfName) && !(st.Chained && ifname.Valid(st.IfName)) {
		return nil, fmt.Errorf("decode state of endpoint %d: interface-name %q: %w", st.ID, st.IfName, ErrCorrupt)
	}
	if st.ContainerInterfaceName != "" && !ifname.Valid(st.ContainerInterfaceName) {
		return nil, fmt.Errorf("decode state of endpoint %d: container-interface-name %q: %w", st.ID, st.ContainerInterfaceName, ErrCorrupt)
	}
	var ports []policy.NamedPort
	for _, s := range st.NamedPorts {
		p, err := policy.ParseNamedPort(s)
		if err != nil {
			return nil, fmt.Errorf("decode state of endpoint %d: named-ports: %v: %w", st.ID, err, ErrCorrupt)
		}
		ports = append(ports, p)
	}
	named, err := policy.NewNamedPorts(ports)
	if err != nil {
		return nil, fmt.Errorf("decode state of endpoint %d: named-ports: %v: %w", st.ID, err, ErrCorrupt)
	}
	var hostPorts []service.HostPort
	for _, s := range st.HostPorts {
		h, err := service.ParseHostPort(s)
		if err != nil {
			return nil, fmt.Errorf("decode state of endpoint %d: host-ports: %v: %w", st.ID, err, ErrCorrupt)
		}
		hostPorts = append(hostPorts, h)
	}
	ep := &endpoint.Endpoint{
		ID: endpoint.ID(st.ID), ContainerID: st.ContainerID, ContainerName: st.ContainerName,
		ContainerInterfaceName: st.ContainerInterfaceName, Namespace: st.Namespace, PodName: st.PodName,
		PodUID: st.PodUID, Labels: ls, IfName: st.IfName, IfIndex: st.IfIndex, MAC: st.MAC,
		HostMAC: st.HostMAC, Netns: st.Netns, Identity: identity.NumericIdentity(st.Identity),
		DesiredRevision: st.Revision, Created: st.Created, NamedPorts: named, Chained: st.Chained,
		HostPorts: hostPorts, PolicyAudit: st.PolicyAudit,
	}
	for _, a := range []struct {
		s    string
		dst  *netip.Addr
		want func(netip.Addr) bool
	}{{st.IPv4, &ep.IPv4, netip.Addr.Is4}, {st.IPv6, &ep.IPv6, netip.Addr.Is6}} {
		if a.s == "" {
			continue
		}
		ip, err := netip.ParseAddr(a.s)
		if err != nil || !a.want(ip) {
			return nil, fmt.Errorf("decode state of endpoint %d: address %q: %w", st.ID, a.s, ErrCorrupt)
		}
		*a.dst = ip
	}
	return ep, nil
}
