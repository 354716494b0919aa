package v2

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MembraneEndpoint kind and resource names.
const (
	EndpointKind     = "MembraneEndpoint"
	EndpointResource = "membraneendpoints"
	// EndpointNodeLabel labels every MembraneEndpoint with the name of the
	// node whose agent owns it, so an agent lists its own objects, and
	// those of other nodes, with a label selector.
	EndpointNodeLabel = "membrane.io/node"
)

// MembraneEndpoint is the status of one pod's endpoint, written by the
// agent of the pod's node (Cilium's CiliumEndpoint). It is namespaced and
// named after the pod, and owned by the Pod (owner reference), so it is
// garbage collected with it. Other nodes' agents read it into their
// ipcache (pod addresses -> identity, node).
type MembraneEndpoint struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Status EndpointStatus `json:"status"`
}

// EndpointStatus is what the agent reports about the endpoint.
type EndpointStatus struct {
	// ID is the endpoint ID on its node.
	ID int64 `json:"id"`
	// Identity is the endpoint's security identity (absent while it has
	// none).
	Identity *EndpointIdentity `json:"identity,omitempty"`
	// Networking holds the addresses and the hosting node.
	Networking EndpointNetworking `json:"networking"`
	// State is the endpoint's lifecycle state ("ready", "regenerating", ...).
	State string `json:"state"`
	// PolicyRevision is the policy revision the datapath realises for it.
	PolicyRevision int64 `json:"policyRevision"`
	// NamedPorts are the pod's named container ports, which other
	// nodes' egress rules on named ports resolve to.
	NamedPorts []EndpointNamedPort `json:"namedPorts,omitempty"`
}

// EndpointNamedPort is a named container port (Cilium's
// status.named-ports entry).
type EndpointNamedPort struct {
	Name     string `json:"name"`
	Port     int32  `json:"port"`
	Protocol string `json:"protocol,omitempty"`
}

// EndpointIdentity is a numeric identity and its labels.
type EndpointIdentity struct {
	ID     int64    `json:"id"`
	Labels []string `json:"labels,omitempty"`
}

// EndpointNetworking is an endpoint's addresses and its node.
type EndpointNetworking struct {
	// IPv4 and IPv6 are the pod's addresses ("" when none).
	IPv4 string `json:"ipv4,omitempty"`
	IPv6 string `json:"ipv6,omitempty"`
	// NodeName is the hosting node; NodeIP its InternalIP ("" while the
	// agent does not know it).
	NodeName string `json:"nodeName"`
	NodeIP   string `json:"nodeIP,omitempty"`
}
